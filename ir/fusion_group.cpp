#include "ir/fusion_group.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "ir/internal_check.h"

namespace napkin::ir {

int FusionGroups::kernel_first(int position) const {
  int gid = group_at.at(position);
  if (gid < 0) return position;
  return batch_of[gid] >= 0 ? batches[batch_of[gid]].first : groups[gid].first;
}

int FusionGroups::kernel_last(int position) const {
  int gid = group_at.at(position);
  if (gid < 0) return position;
  return batch_of[gid] >= 0 ? batches[batch_of[gid]].last : groups[gid].last;
}

std::string batch_signature(const Graph& g, const FusionGroup& fg) {
  if (fg.phase != Phase::Optimizer || fg.contraction != kNoNode) return "";
  std::string sig;
  std::map<ValueId, int> member_of;  // member result -> its index in the group
  for (NodeId id : fg.nodes) {
    const Node& n = g.node(id);
    if (op_info(n.op).element_index != ElementIndex::None) return "";
    if (op_info(n.op).op_class == OpClass::Reduction) {
      if (!member_of.count(n.in(0))) return "";  // it reduces a group input: not batched
      const std::vector<int64_t> axes = n.attrs.get_ints("axes");
      if (static_cast<size_t>(g.value(n.out()).type.rank()) != 0 || axes.size() != fg.shape.size()) return "";
    }
    sig += fmt::format("{}{{", op_name(n.op));
    for (const auto& [key, value] : n.attrs.all()) sig += fmt::format("{}={};", key, to_string(value));
    sig += fmt::format("}}:{}(", dtype_name(g.value(n.out()).type.dtype));
    for (ValueId in : n.inputs) {
      auto m = member_of.find(in);
      if (m != member_of.end()) {
        sig += fmt::format("m{},", m->second);
        continue;
      }
      auto at = std::find(fg.inputs.begin(), fg.inputs.end(), in);
      sig += fmt::format("i{},", at - fg.inputs.begin());
    }
    sig += ")";
    member_of[n.out()] = static_cast<int>(member_of.size());
  }
  sig += "|";
  for (ValueId in : fg.inputs) {
    const Value& v = g.value(in);
    const bool scalar = v.type.rank() == 0;
    const bool full = v.type.sizes() == fg.shape && is_contiguous(v.layout, fg.shape);
    if (!scalar && !full) return "";
    sig += fmt::format("{}{},", scalar ? "s" : "f", dtype_name(v.type.dtype));
  }
  sig += "|";
  for (ValueId out : fg.outputs) {
    const Value& v = g.value(out);
    if (v.type.rank() != 0 && !(v.type.sizes() == fg.shape && is_contiguous(v.layout, fg.shape))) return "";
    sig += fmt::format("m{}{},", member_of.at(out), dtype_name(v.type.dtype));
  }
  return sig;
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
    if (op_info(n.op).op_class == OpClass::Contraction) {
      NAPKIN_INTERNAL_CHECK(fg.nodes.size() == 1, "fusion group {} has a contraction after its first member", n.group);
      fg.contraction = n.id;
    }
    if (op_info(n.op).op_class == OpClass::Reduction) {
      fg.reduction = n.id;
      // A GEMM's bias gradient sums B (ir/gemm_epilogue.h GemmBiasGrad): the group's shape stays D's.
      if (fg.contraction == kNoNode) fg.shape = g.value(n.in(0)).type.sizes();
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

  // Batches: runs of adjacent groups with one signature, each holding at
  // most kMaxBatchOperands operands (a CUDA kernel takes every member's
  // offsets as one parameter: 8 bytes each, within the 32 KiB a launch takes).
  constexpr size_t kMaxBatchOperands = 3000;
  r.batch_of.assign(r.groups.size(), -1);
  std::string previous;
  size_t operands = 0;
  for (size_t gid = 0; gid < r.groups.size(); ++gid) {
    const FusionGroup& fg = r.groups[gid];
    std::string sig = batch_signature(g, fg);
    // Adjacent: nothing but views (no kernels) between the two groups.
    bool adjacent = gid > 0;
    for (int p = gid > 0 ? r.groups[gid - 1].last + 1 : 0; adjacent && p < fg.first; ++p)
      adjacent = op_info(g.node(schedule[p]).op).op_class == OpClass::View;
    const size_t own = fg.inputs.size() + fg.outputs.size();
    const bool extends = !sig.empty() && sig == previous && adjacent && operands + own <= kMaxBatchOperands;
    operands = extends ? operands + own : own;
    if (extends) {
      if (r.batch_of[gid - 1] < 0) {
        r.batch_of[gid - 1] = static_cast<int>(r.batches.size());
        r.batches.push_back({{static_cast<int>(gid - 1)}, r.groups[gid - 1].first, r.groups[gid - 1].last});
      }
      FusionBatch& b = r.batches[r.batch_of[gid - 1]];
      b.groups.push_back(static_cast<int>(gid));
      b.last = fg.last;
      r.batch_of[gid] = r.batch_of[gid - 1];
    }
    previous = std::move(sig);
  }
  return r;
}

}  // namespace napkin::ir
