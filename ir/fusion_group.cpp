#include "ir/fusion_group.h"

#include "ir/internal_check.h"

namespace napkin::ir {

int FusionGroups::kernel_first(int position) const {
  int gid = group_at.at(position);
  return gid < 0 ? position : groups[gid].first;
}

int FusionGroups::kernel_last(int position) const {
  int gid = group_at.at(position);
  return gid < 0 ? position : groups[gid].last;
}

FusionGroups fusion_groups(const Graph& g) {
  FusionGroups r;
  const std::vector<NodeId>& schedule = g.schedule();
  r.group_at.assign(schedule.size(), -1);
  r.internal.assign(g.num_values(), false);
  int max_id = -1;
  for (NodeId id : schedule) max_id = std::max(max_id, g.node(id).group);
  r.groups.resize(max_id + 1);
  for (int p = 0; p < static_cast<int>(schedule.size()); ++p) {
    const Node& n = g.node(schedule[p]);
    if (n.group < 0) continue;
    FusionGroup& fg = r.groups[n.group];
    if (fg.nodes.empty()) {
      fg.id = n.group;
      fg.phase = n.phase;
      fg.first = p;
    } else {
      NAPKIN_INTERNAL_CHECK(fg.last == p - 1, "fusion group {} is not contiguous at node {}", n.group, n.id);
    }
    fg.last = p;
    fg.nodes.push_back(n.id);
    r.group_at[p] = n.group;
    NAPKIN_INTERNAL_CHECK(fg.reduction == kNoNode, "fusion group {} has a member after its reduction", n.group);
    if (op_info(n.op).op_class == OpClass::Reduction) {
      fg.reduction = n.id;
      fg.shape = g.value(n.in(0)).type.sizes();
    } else if (n.op != Op::Constant) {
      fg.shape = g.value(n.out()).type.sizes();
    }
  }
  for (const FusionGroup& fg : r.groups) NAPKIN_INTERNAL_CHECK(!fg.nodes.empty(), "fusion group ids are not dense");

  // A buffer is used outside its producer's group when a node of another
  // kernel reads it (through a view too), or the step's end does.
  auto group_of_value = [&](ValueId v) {
    NodeId p = g.value(v).producer;
    return p == kNoNode ? -1 : g.node(p).group;
  };
  std::vector<bool> outside(g.num_values(), false);
  for (NodeId id : schedule) {
    const Node& n = g.node(id);
    for (ValueId in : n.inputs) {
      ValueId s = g.value(in).storage;
      if (n.group < 0 || group_of_value(s) != n.group || in != s) outside[s] = true;
    }
  }
  for (const auto& [label, v] : g.outputs) outside[g.value(v).storage] = true;
  for (const Graph::Update& u : g.updates) outside[g.value(u.value).storage] = true;

  std::vector<int> seen_by(g.num_values(), -1);  // value -> the last group that listed it as an input
  for (FusionGroup& fg : r.groups) {
    for (NodeId id : fg.nodes) {
      const Node& n = g.node(id);
      for (ValueId in : n.inputs) {
        if (group_of_value(in) == fg.id || seen_by[in] == fg.id) continue;
        seen_by[in] = fg.id;
        fg.inputs.push_back(in);
      }
      for (ValueId out : n.outputs) {
        if (outside[out]) {
          fg.outputs.push_back(out);
        } else {
          fg.internal.push_back(out);
          r.internal[out] = true;
        }
      }
    }
  }
  return r;
}

}  // namespace napkin::ir
