#include "passes/fuse_elementwise.h"

#include <algorithm>
#include <map>

#include "ir/internal_check.h"

namespace napkin::passes {

namespace {

using ir::NodeId;
using ir::ValueId;

bool fusible(const ir::Node& n) {
  return (ir::op_info(n.op).op_class == ir::OpClass::Elementwise || n.op == ir::Op::Copy) && n.outputs.size() == 1;
}

// The greedy walk over the schedule; groups here are working ids, renumbered
// at the end.
class Fuser {
 public:
  explicit Fuser(ir::Graph& g) : g_(g), schedule_(g.mutable_schedule()) {
    group_.assign(g.num_nodes(), -1);
    in_set_.assign(g.num_nodes(), false);
    after_.assign(g.num_nodes(), false);
    needed_.assign(g.num_nodes(), false);
    index_positions();
  }

  void form_groups() {
    const std::vector<NodeId> order = schedule_;  // merges reorder the schedule, never the nodes still to visit
    for (NodeId id : order) {
      const ir::Node& n = g_.node(id);
      if (!fusible(n)) continue;
      std::vector<int64_t> shape = g_.value(n.out()).type.sizes();
      std::vector<int> candidates;
      for (ValueId in : n.inputs) {
        const ir::Value& v = g_.value(in);
        if (v.producer == ir::kNoNode || v.is_view()) continue;
        int c = group_[v.producer];
        if (c < 0 || shape_[c] != shape || phase_[c] != n.phase) continue;
        if (std::find(candidates.begin(), candidates.end(), c) == candidates.end()) candidates.push_back(c);
      }
      int& scalar_group = last_scalar_group_[static_cast<int>(n.phase)];
      if (candidates.empty() && shape.empty() && scalar_group >= 0 && !members_[scalar_group].empty())
        candidates.push_back(scalar_group);
      int joined = -1;
      for (int c : candidates) {
        std::vector<NodeId> set = members_[c];
        if (joined < 0) set.push_back(id);
        else set.insert(set.end(), members_[joined].begin(), members_[joined].end());
        if (!try_merge(set)) continue;
        if (joined < 0) {
          joined = c;
          add_member(c, id);
        } else {
          for (NodeId m : members_[c]) add_member(joined, m);
          members_[c].clear();
          for (int& last : last_scalar_group_)
            if (last == c) last = joined;
        }
      }
      if (joined < 0) {
        joined = static_cast<int>(members_.size());
        members_.emplace_back();
        shape_.push_back(shape);
        phase_.push_back(n.phase);
        add_member(joined, id);
      }
      if (shape.empty()) scalar_group = joined;
    }
  }

  // Each constant that members read directly folds into their groups (see
  // the header); returns whether it made copies.
  bool fold_constants() {
    std::map<NodeId, std::vector<NodeId>> readers;  // constant -> the nodes reading it directly
    for (NodeId id : schedule_)
      for (ValueId in : g_.node(id).inputs) {
        NodeId p = g_.value(in).producer;
        if (p != ir::kNoNode && g_.node(p).op == ir::Op::Constant) readers[p].push_back(id);
      }
    std::vector<bool> read_at_end(g_.num_values(), false);
    for (const auto& [label, v] : g_.outputs) read_at_end[g_.value(v).storage] = true;
    for (const ir::Graph::Update& u : g_.updates) read_at_end[g_.value(u.value).storage] = true;

    std::vector<int> first(members_.size());  // before copies join: they have no position yet
    for (size_t gid = 0; gid < members_.size(); ++gid) first[gid] = first_position(static_cast<int>(gid));
    std::map<int, std::vector<NodeId>> lead_in;  // group -> constants scheduled right before its first member
    bool copied = false;
    for (auto& [c, nodes] : readers) {
      ValueId value = g_.node(c).out();
      std::vector<int> groups;
      bool unfused_reader = read_at_end[value];
      for (NodeId r : nodes) {
        if (group_[r] < 0) unfused_reader = true;
        else if (std::find(groups.begin(), groups.end(), group_[r]) == groups.end()) groups.push_back(group_[r]);
      }
      std::sort(groups.begin(), groups.end(), [&](int a, int b) { return first[a] < first[b]; });
      for (size_t i = 0; i < groups.size(); ++i) {
        int gid = groups[i];
        NodeId member = c;  // the first group takes the constant itself unless others read it
        if (i > 0 || unfused_reader) {
          const ir::Node original = g_.node(c);  // add_node may move the node storage
          member = g_.add_node(ir::Op::Constant, {}, {g_.value(value).type}, original.attrs, original.loc, original.scope,
                               phase_[gid]);
          g_.node(member).origin = original.origin;
          schedule_.pop_back();  // placed below, before the group
          group_.push_back(-1);
          copied = true;
          ValueId copy = g_.node(member).out();
          for (NodeId r : members_[gid])
            for (ValueId& in : g_.node(r).inputs)
              if (in == value) in = copy;
        }
        g_.node(member).phase = phase_[gid];
        add_member(gid, member);
        lead_in[gid].push_back(member);
      }
    }
    std::vector<bool> placed(g_.num_nodes(), false);
    for (const auto& [gid, constants] : lead_in)
      for (NodeId c : constants) placed[c] = true;
    std::vector<NodeId> schedule;
    std::vector<bool> started(members_.size(), false);
    for (NodeId id : schedule_) {
      if (placed[id]) continue;
      int gid = group_[id];
      if (gid >= 0 && !started[gid]) {
        started[gid] = true;
        auto it = lead_in.find(gid);
        if (it != lead_in.end()) schedule.insert(schedule.end(), it->second.begin(), it->second.end());
      }
      schedule.push_back(id);
    }
    schedule_ = std::move(schedule);
    index_positions();
    return copied;
  }

  // Groups of one node dissolve; the rest get ids 0 .. n-1 in schedule order.
  void write_groups() {
    std::vector<int> size(members_.size(), 0);
    for (NodeId id : schedule_)
      if (group_[id] >= 0) ++size[group_[id]];
    std::vector<int> final_id(members_.size(), -1);
    int next = 0;
    for (NodeId id : schedule_) {
      int gid = group_[id];
      int out = -1;
      if (gid >= 0 && size[gid] > 1) {
        if (final_id[gid] < 0) final_id[gid] = next++;
        out = final_id[gid];
      }
      g_.node(id).group = out;
    }
  }

 private:
  ir::Graph& g_;
  std::vector<NodeId>& schedule_;
  std::vector<int> position_;                 // node -> schedule position
  std::vector<int> group_;                    // node -> working group, -1 if none
  std::vector<std::vector<NodeId>> members_;  // working group -> nodes
  std::vector<std::vector<int64_t>> shape_;   // working group -> iteration shape
  std::vector<ir::Phase> phase_;
  int last_scalar_group_[3] = {-1, -1, -1};
  std::vector<bool> in_set_, after_, needed_;  // scratch of try_merge, cleared after each use

  void index_positions() {
    position_.assign(g_.num_nodes(), -1);
    for (int p = 0; p < static_cast<int>(schedule_.size()); ++p) position_[schedule_[p]] = p;
  }

  void add_member(int gid, NodeId id) {
    group_[id] = gid;
    members_[gid].push_back(id);
  }

  int first_position(int gid) const {
    int first = static_cast<int>(schedule_.size());
    for (NodeId m : members_[gid]) first = std::min(first, position_[m]);
    return first;
  }

  // The schedule positions of the unit at `p`: a group other than the set's
  // moves as a whole (it must stay contiguous); any other node alone.
  int unit_end(int p) const {
    NodeId x = schedule_[p];
    if (in_set_[x] || group_[x] < 0) return p;
    while (p + 1 < static_cast<int>(schedule_.size()) && group_[schedule_[p + 1]] == group_[x]) ++p;
    return p;
  }
  int unit_start(int p) const {
    NodeId x = schedule_[p];
    if (in_set_[x] || group_[x] < 0) return p;
    while (p > 0 && group_[schedule_[p - 1]] == group_[x]) --p;
    return p;
  }

  // Makes `set` (whole groups and the node joining them) contiguous if that
  // is legal (see the header); false leaves the schedule as it was.
  bool try_merge(const std::vector<NodeId>& set) {
    int lo = static_cast<int>(schedule_.size()), hi = -1;
    for (NodeId id : set) {
      lo = std::min(lo, position_[id]);
      hi = std::max(hi, position_[id]);
      in_set_[id] = true;
    }
    auto producer_at_or_after = [&](ValueId v, int from) {
      NodeId p = g_.value(v).producer;
      return p != ir::kNoNode && position_[p] >= from ? p : ir::kNoNode;
    };
    // after_: the unit depends on the set; needed_: the set depends on it.
    for (int p = lo; p <= hi;) {
      int q = unit_end(p);
      if (!in_set_[schedule_[p]]) {
        bool depends = false;
        for (int r = p; r <= q; ++r)
          for (ValueId in : g_.node(schedule_[r]).inputs) {
            NodeId x = producer_at_or_after(in, lo);
            if (x != ir::kNoNode && (in_set_[x] || after_[x])) depends = true;
          }
        for (int r = p; r <= q && depends; ++r) after_[schedule_[r]] = true;
      }
      p = q + 1;
    }
    bool legal = true;
    for (int q = hi; q >= lo;) {
      int p = unit_start(q);
      bool member = in_set_[schedule_[q]];
      bool needed = false;
      for (int r = p; r <= q; ++r) needed = needed || needed_[schedule_[r]];
      if (!member && needed && after_[schedule_[q]]) legal = false;
      if (member || needed)
        for (int r = p; r <= q; ++r)
          for (ValueId in : g_.node(schedule_[r]).inputs) {
            NodeId x = producer_at_or_after(in, lo);
            if (x != ir::kNoNode) needed_[x] = true;
          }
      q = p - 1;
    }
    if (legal) {
      std::vector<NodeId> before, members, after;
      for (int p = lo; p <= hi; ++p) {
        NodeId x = schedule_[p];
        (in_set_[x] ? members : after_[x] ? after : before).push_back(x);
      }
      int p = lo;
      for (const auto* part : {&before, &members, &after})
        for (NodeId x : *part) position_[x] = p, schedule_[p++] = x;
    }
    for (int p = lo; p <= hi; ++p) {
      NodeId x = schedule_[p];
      in_set_[x] = after_[x] = needed_[x] = false;
    }
    return legal;
  }
};

class FuseElementwise : public Pass {
 public:
  std::string_view name() const override { return "fuse-elementwise"; }
  bool run(ir::Graph& g, ir::Diagnostics&) override {
    const std::vector<NodeId> old_schedule = g.schedule();
    std::vector<int> old_groups;
    for (NodeId id : old_schedule) old_groups.push_back(g.node(id).group);
    Fuser fuser(g);
    fuser.form_groups();
    bool copied = fuser.fold_constants();
    fuser.write_groups();
    if (copied || g.schedule() != old_schedule) return true;
    for (size_t p = 0; p < old_schedule.size(); ++p)
      if (g.node(old_schedule[p]).group != old_groups[p]) return true;
    return false;
  }
};

}  // namespace

std::unique_ptr<Pass> make_fuse_elementwise_pass() { return std::make_unique<FuseElementwise>(); }

}  // namespace napkin::passes
