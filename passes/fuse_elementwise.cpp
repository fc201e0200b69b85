#include "passes/fuse_elementwise.h"

#include <algorithm>
#include <deque>
#include <list>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>

#include "ir/fusion_group.h"
#include "ir/internal_check.h"
#include "ir/use_list.h"

namespace napkin::passes {

namespace {

using ir::NodeId;
using ir::ValueId;

bool fusible(const ir::Node& n) {
  return (ir::op_info(n.op).op_class == ir::OpClass::Elementwise || n.op == ir::Op::Copy) && n.outputs.size() == 1;
}

// The greedy walk over the schedule; groups here are working ids, renumbered
// at the end.
//
// Why it is linear in the common case: the nodes visited so far (a prefix of
// the schedule, reordered by merges) are a list of units, a node alone or a
// whole working group whose members sit in a deque in schedule order, so a
// merge touches only the units between the groups it joins, never the members
// already inside them. A merge of two groups moves the smaller one's members
// (so each node moves O(log N) times), and a working id merged away points to
// the id that absorbed it (union-find), so no member is relabelled. A node
// joining a group walks only the units of the nodes visited since the group
// last grew (legal_since), not the units that read the group and stay after
// it: N parameters' updates reading the optimizer's scalars, into whose group
// each parameter's 1 - lr·wd joins, made N^2. Not linear: a merge of two
// groups, or a join into a group that moved, walks every unit between them.
class Fuser {
 public:
  Fuser(ir::Graph& g, int64_t* work)
      : g_(g), schedule_(g.mutable_schedule()), work_(work), visit_order_(g.schedule()), uses_(g) {
    group_.assign(g.num_nodes(), -1);
    visit_.assign(g.num_nodes(), -1);
    for (int v = 0; v < static_cast<int>(visit_order_.size()); ++v) visit_[visit_order_[v]] = v;
    node_unit_.resize(g.num_nodes());
    gap_.assign(g.num_nodes(), 0);
    after_.assign(g.num_nodes(), 0);
    needed_.assign(g.num_nodes(), 0);
  }

  void form_groups() {
    for (NodeId id : visit_order_) {  // merges reorder the schedule, never the nodes still to visit
      count(1);
      node_unit_[id] = units_.insert(units_.end(), Unit{id, -1});
      place(node_unit_[id]);
      const ir::Node& n = g_.node(id);
      if (!fusible(n)) continue;
      std::vector<int64_t> shape = g_.value(n.out()).type.sizes();
      std::vector<int> candidates;
      for (ValueId in : n.inputs) {
        count(1);
        const ir::Value& v = g_.value(in);
        if (v.producer == ir::kNoNode || v.is_view()) continue;
        int c = group_of(v.producer);
        if (c < 0 || shape_[c] != shape || phase_[c] != n.phase) continue;
        if (std::find(candidates.begin(), candidates.end(), c) == candidates.end()) candidates.push_back(c);
      }
      int& scalar_group = last_scalar_group_[static_cast<int>(n.phase)];
      if (candidates.empty() && shape.empty() && scalar_group >= 0 && !members_[scalar_group].empty())
        candidates.push_back(scalar_group);
      int joined = -1;
      for (int c : candidates) {
        if (joined < 0) {
          if (!join_node(c, id)) continue;
          joined = c;
        } else {
          if (!join_groups(c, joined)) continue;
          for (int& last : last_scalar_group_)
            if (last == c) last = joined;
        }
      }
      if (joined < 0) {
        joined = static_cast<int>(members_.size());
        members_.emplace_back();
        shape_.push_back(shape);
        phase_.push_back(n.phase);
        parent_.push_back(joined);
        first_visit_.push_back(visit_[id]);
        settled_.push_back(visit_[id]);  // no unit after it yet
        group_unit_.push_back(node_unit_[id]);
        node_unit_[id]->node = ir::kNoNode;
        node_unit_[id]->group = joined;
        add_member(joined, id);
      }
      if (shape.empty()) scalar_group = joined;
    }
    // Back to plain ids and an array schedule for the steps below.
    for (NodeId id = 0; id < g_.num_nodes(); ++id) group_[id] = group_of(id);
    schedule_.clear();
    for (const Unit& u : units_) {
      if (u.group < 0) schedule_.push_back(u.node);
      else schedule_.insert(schedule_.end(), members_[u.group].begin(), members_[u.group].end());
    }
    count(static_cast<int64_t>(schedule_.size()));
    count(static_cast<int64_t>(schedule_.size()));
    attach_reductions();
    index_positions();
  }

  // Each reduction that reads a group member's result directly becomes the
  // last member of that group (see the header), and moves to right after the
  // group's other members: its one input is ready there, and its readers
  // came after it already. One reduction per group, the first in schedule order.
  void attach_reductions() {
    std::vector<bool> attached(members_.size(), false);  // working group -> it has its reduction
    std::vector<NodeId> follower(g_.num_nodes(), ir::kNoNode);  // a group's last member -> the reduction placed after it
    std::vector<bool> moved(g_.num_nodes(), false);
    std::vector<int> at(g_.num_nodes(), -1);  // schedule position
    for (int p = 0; p < static_cast<int>(schedule_.size()); ++p) at[schedule_[p]] = p;
    for (NodeId id : schedule_) {
      count(1);
      const ir::Node& n = g_.node(id);
      if (ir::op_info(n.op).op_class != ir::OpClass::Reduction || n.inputs.size() != 1 || n.outputs.size() != 1) continue;
      const ir::Value& v = g_.value(n.in(0));
      if (v.is_view()) continue;
      // The group making v, else one whose member reads v directly (a sibling:
      // the kernel loads v anyway), with v's shape and n's phase.
      // n moves to right after the group: when the group ends after n, no
      // reader of n's result may come before that (a view of it included:
      // the view is a reader).
      auto fits = [&](int c) {
        if (c < 0 || attached[c] || phase_[c] != n.phase || shape_[c] != v.type.sizes()) return false;
        const int end = at[members_[c].back()];
        if (end < at[id]) return true;
        for (NodeId r : uses_.readers(n.out()))
          if (at[r] <= end) return false;
        return true;
      };
      int c = v.producer != ir::kNoNode && fusible(g_.node(v.producer)) ? group_[v.producer] : -1;
      if (!fits(c)) {
        c = -1;
        std::vector<NodeId>& candidates = siblings(v.id, attached);
        for (NodeId r : candidates) {
          count(1);
          if (r != id && fits(group_[r])) {
            c = group_[r];
            break;
          }
        }
      }
      if (c < 0) continue;
      bool positional = false;
      for (NodeId m : members_[c]) {
        count(1);
        positional = positional || ir::op_info(g_.node(m).op).element_index != ir::ElementIndex::None;
      }
      if (positional) continue;
      attached[c] = true;
      follower[members_[c].back()] = id;
      moved[id] = true;
      add_member(c, id);
    }
    sibling_candidates_.clear();
    std::vector<NodeId> schedule;
    schedule.reserve(schedule_.size());
    for (NodeId id : schedule_) {
      if (moved[id]) continue;
      schedule.push_back(id);
      if (follower[id] != ir::kNoNode) schedule.push_back(follower[id]);
    }
    schedule_ = std::move(schedule);
  }

  // The readers of v that attach_reductions may still fuse a reduction of v
  // with: fusible members of a group of v's shape that has no reduction yet,
  // in uses_ order. A reader that fails this fails it for good (a group
  // never loses its reduction), so it leaves the list: N reductions of one
  // value (each parameter's bias gradient summing one dy) scanned all of
  // v's readers each, N^2.
  std::vector<NodeId>& siblings(ValueId v, const std::vector<bool>& attached) {
    auto [it, added] = sibling_candidates_.try_emplace(v);
    std::vector<NodeId>& candidates = it->second;
    if (added)
      for (NodeId r : uses_.readers(v)) {
        count(1);
        const int c = group_[r];
        if (fusible(g_.node(r)) && c >= 0 && shape_[c] == g_.value(v).type.sizes()) candidates.push_back(r);
      }
    std::erase_if(candidates, [&](NodeId r) { return attached[group_[r]]; });
    return candidates;
  }

  // Each constant that members read directly folds into their groups (see
  // the header); returns whether it made copies.
  bool fold_constants() {
    std::vector<int> first(members_.size());  // before copies join: they have no position yet
    for (size_t gid = 0; gid < members_.size(); ++gid) first[gid] = first_position(static_cast<int>(gid));
    std::map<int, std::vector<NodeId>> lead_in;  // group -> constants scheduled right before its first member
    bool copied = false;
    const NodeId built = g_.num_nodes();  // the copies made below are no constants to fold
    for (NodeId c = 0; c < built; ++c) {
      if (g_.node(c).op != ir::Op::Constant) continue;
      ValueId value = g_.node(c).out();
      const std::vector<NodeId>& nodes = uses_.readers(value);
      // The groups reading c, each with its members that do: a constant read
      // by N groups (the learning rate of N parameters' updates) made a
      // search of the groups, and a scan of every reader per copy, N^2.
      std::vector<int> groups;
      std::unordered_map<int, std::vector<NodeId>> group_readers;
      bool unfused_reader = uses_.escapes(value);
      for (NodeId r : nodes) {
        count(1);
        if (group_[r] < 0) {
          unfused_reader = true;
          continue;
        }
        std::vector<NodeId>& in_group = group_readers[group_[r]];
        if (in_group.empty()) groups.push_back(group_[r]);
        in_group.push_back(r);
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
          for (NodeId r : group_readers[gid]) {  // the group's members that read the constant
            count(1);
            for (ValueId& in : g_.node(r).inputs)
              if (in == value) in = copy;
          }
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
  // A node alone, or a working group (its members in members_).
  struct Unit {
    NodeId node = ir::kNoNode;
    int group = -1;
    uint64_t label = 0;  // increasing along units_ (place)
    int moved_later = -1;  // the last visit index at which join_by_reach moved it later
  };
  using UnitList = std::list<Unit>;

  ir::Graph& g_;
  std::vector<NodeId>& schedule_;
  int64_t* work_;
  std::vector<int> position_;               // node -> schedule position, once the schedule is an array again
  std::vector<int> group_;                  // node -> working group (maybe merged away: see group_of), -1 if none
  std::vector<std::deque<NodeId>> members_;  // working group -> nodes, in schedule order
  std::vector<std::vector<int64_t>> shape_;  // working group -> iteration shape
  std::vector<ir::Phase> phase_;
  std::vector<int> parent_;  // working group -> the group it merged into, itself while it lives
  std::vector<int> first_visit_;  // working group -> the least visit index of its members
  // Working group -> a visit index v such that every unit after the group's
  // unit holding a node visited by v depends on the group; -1 when unknown
  // (the group's unit moved). See legal_since.
  std::vector<int> settled_;
  const std::vector<NodeId> visit_order_;  // the schedule form_groups walks
  std::vector<int> visit_;                 // node -> its index in visit_order_
  // A node of each unit join_by_reach moved later, with the visit index it
  // did so at (increasing): legal_since walks those moved since too.
  std::vector<std::pair<int, NodeId>> moved_later_;
  int last_scalar_group_[ir::kNumPhases] = {-1, -1, -1, -1, -1};
  UnitList units_;  // the nodes visited so far, in schedule order
  std::vector<UnitList::iterator> node_unit_;   // node alone -> its unit
  std::vector<UnitList::iterator> group_unit_;  // working group -> its unit
  const ir::UseList uses_;                      // of the schedule form_groups walks
  std::unordered_map<ValueId, std::vector<NodeId>> sibling_candidates_;  // attach_reductions' siblings()
  // Marks of the merge being tried (its stamp): in the span between the set's
  // parts, depends on the set, needed by the set.
  std::vector<int> gap_, after_, needed_;
  int stamp_ = 0;

  void count(int64_t steps) {
    if (work_) *work_ += steps;
  }

  int find(int gid) {
    while (parent_[gid] != gid) gid = parent_[gid] = parent_[parent_[gid]];
    return gid;
  }
  int group_of(NodeId id) { return group_[id] < 0 ? -1 : find(group_[id]); }

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

  template <typename F>
  void for_each_node(const Unit& u, F&& f) {
    if (u.group < 0) {
      f(u.node);
    } else {
      for (NodeId x : members_[u.group]) f(x);
    }
  }

  // Whether the set {group `first`} + {the later part} may become contiguous:
  // the units strictly between `first`'s unit and `last` (see the header),
  // which the set's first part precedes and its later part follows. A unit
  // depends on the set when it reads a member of `first` or a unit that
  // does (the later part comes after it); it is needed when the later part
  // reads it or a needed unit reads it. On success the units that depend on
  // the set are in `after`, the others in `before`.
  // `later_node`, when the later part is one node, seeds "needed" from its
  // inputs; otherwise each gap node's readers are checked with is_later.
  template <typename IsLater>
  bool legal(int first, UnitList::iterator last, NodeId later_node, IsLater&& is_later,
             std::vector<UnitList::iterator>& before, std::vector<UnitList::iterator>& after) {
    ++stamp_;
    std::vector<UnitList::iterator> gap;
    for (auto it = std::next(group_unit_[first]); it != last; ++it) {
      bool depends = false;
      for_each_node(*it, [&](NodeId r) {
        gap_[r] = stamp_;
        for (ValueId in : g_.node(r).inputs) {
          count(1);
          NodeId x = g_.value(in).producer;
          if (x != ir::kNoNode && (group_of(x) == first || (gap_[x] == stamp_ && after_[x] == stamp_))) depends = true;
        }
      });
      if (depends) for_each_node(*it, [&](NodeId r) { after_[r] = stamp_; });
      gap.push_back(it);
    }
    if (later_node != ir::kNoNode)
      for (ValueId in : g_.node(later_node).inputs) {
        count(1);
        NodeId x = g_.value(in).producer;
        if (x != ir::kNoNode && gap_[x] == stamp_) needed_[x] = stamp_;
      }
    for (auto u = gap.rbegin(); u != gap.rend(); ++u) {
      bool needed = false;
      for_each_node(**u, [&](NodeId x) {
        needed = needed || needed_[x] == stamp_;
        if (later_node != ir::kNoNode) return;
        for (ValueId out : g_.node(x).outputs)
          for (NodeId r : uses_.readers(out)) {
            count(1);
            needed = needed || is_later(r);
          }
      });
      if (!needed) continue;
      if (after_[(*u)->group < 0 ? (*u)->node : members_[(*u)->group].front()] == stamp_) return false;
      for_each_node(**u, [&](NodeId r) {
        for (ValueId in : g_.node(r).inputs) {
          count(1);
          NodeId x = g_.value(in).producer;
          if (x != ir::kNoNode && gap_[x] == stamp_) needed_[x] = stamp_;
        }
      });
    }
    for (UnitList::iterator it : gap) {
      NodeId x = it->group < 0 ? it->node : members_[it->group].front();
      (after_[x] == stamp_ ? after : before).push_back(it);
    }
    return true;
  }

  // legal(c, node_unit_[id], id, ...) for a group c whose settled_ is known,
  // with the same verdict and `before`: the units after c holding a node
  // visited by settled_[c] depend on c (they did then; since, c has not
  // moved, a unit that was before c got after it only if join_by_reach moved
  // it later, and a merge keeps every dependency of its parts), so only the
  // units of nodes visited or moved later since are walked, in list order
  // (by label). A needed unit that depends on c makes
  // the join illegal, whichever it is.
  bool legal_since(int c, NodeId id, std::vector<UnitList::iterator>& before) {
    ++stamp_;
    const uint64_t start = group_unit_[c]->label;
    const int settled = settled_[c];
    auto unit_of = [&](NodeId x) { return group_of(x) < 0 ? node_unit_[x] : group_unit_[group_of(x)]; };
    auto visited_by_then = [&](const Unit& u) {
      return (u.group < 0 ? visit_[u.node] : first_visit_[u.group]) <= settled && u.moved_later <= settled;
    };
    // x is in such a unit after c: it depends on c.
    auto settled_dependent = [&](NodeId x) {
      if (group_of(x) == c) return false;
      UnitList::iterator u = unit_of(x);
      return u->label > start && visited_by_then(*u);
    };
    std::vector<UnitList::iterator> gap;  // the units after c of nodes visited or moved later since
    auto walk_unit_of = [&](NodeId x) {
      count(1);
      if (gap_[x] == stamp_ || group_of(x) == c) return;
      UnitList::iterator u = unit_of(x);
      if (u->label <= start || visited_by_then(*u)) return;
      for_each_node(*u, [&](NodeId r) { gap_[r] = stamp_; });
      gap.push_back(u);
    };
    for (int v = settled + 1; v < visit_[id]; ++v) walk_unit_of(visit_order_[v]);
    auto moved = std::partition_point(moved_later_.begin(), moved_later_.end(), [&](const std::pair<int, NodeId>& m) { return m.first <= settled; });
    for (; moved != moved_later_.end(); ++moved) walk_unit_of(moved->second);
    std::sort(gap.begin(), gap.end(), [](UnitList::iterator a, UnitList::iterator b) { return a->label < b->label; });
    auto first_node = [&](UnitList::iterator u) { return u->group < 0 ? u->node : members_[u->group].front(); };
    for (UnitList::iterator u : gap) {
      bool depends = false;
      for_each_node(*u, [&](NodeId r) {
        for (ValueId in : g_.node(r).inputs) {
          count(1);
          NodeId x = g_.value(in).producer;
          if (x != ir::kNoNode && (group_of(x) == c || (gap_[x] == stamp_ && after_[x] == stamp_) || settled_dependent(x)))
            depends = true;
        }
      });
      if (depends) for_each_node(*u, [&](NodeId r) { after_[r] = stamp_; });
    }
    // Marks x needed; false when it depends on c.
    auto need = [&](NodeId x) {
      count(1);
      if (x == ir::kNoNode) return true;
      if (gap_[x] == stamp_) needed_[x] = stamp_;
      return !settled_dependent(x);
    };
    for (ValueId in : g_.node(id).inputs)
      if (!need(g_.value(in).producer)) return false;
    for (auto u = gap.rbegin(); u != gap.rend(); ++u) {
      bool needed = false;
      for_each_node(**u, [&](NodeId x) { needed = needed || needed_[x] == stamp_; });
      if (!needed) continue;
      if (after_[first_node(*u)] == stamp_) return false;
      bool legal = true;
      for_each_node(**u, [&](NodeId r) {
        for (ValueId in : g_.node(r).inputs) legal = need(g_.value(in).producer) && legal;
      });
      if (!legal) return false;
    }
    for (UnitList::iterator u : gap)
      if (after_[first_node(u)] != stamp_) before.push_back(u);
    return true;
  }

  // Puts the units `before` right before `at`, in their order. A group that
  // moves no longer knows which units after it depend on it.
  void move_before(const std::vector<UnitList::iterator>& before, UnitList::iterator at) {
    for (UnitList::iterator it : before) {
      units_.splice(at, units_, it);
      place(it);
      if (it->group >= 0) settled_[it->group] = -1;
    }
  }

  // Gives unit u, just put in units_, a label between its neighbours'. When
  // they are adjacent, the smallest aligned label range around u sparse
  // enough is spread out evenly first: list labelling (Bender et al., "Two
  // simplified algorithms for maintaining order in a list"), O(log N)
  // amortized per unit placed. Not counted in work_: a run of units moved
  // to one spot (a constant per link of a chain, moved before the chain's
  // group) costs the log factor, which a test of flat work per node reads
  // as growth.
  void place(UnitList::iterator u) {
    constexpr int kBits = 62;
    constexpr uint64_t kAppendStep = uint64_t{1} << 32;
    auto lower = [&] { return u == units_.begin() ? uint64_t{0} : std::prev(u)->label; };
    auto upper = [&] { return std::next(u) == units_.end() ? uint64_t{1} << kBits : std::next(u)->label; };
    if (std::next(u) == units_.end() && upper() - lower() > kAppendStep) {  // appended: room for later ones
      u->label = lower() + kAppendStep;
      return;
    }
    if (upper() - lower() >= 2) {
      u->label = lower() + (upper() - lower()) / 2;
      return;
    }
    const uint64_t anchor = u == units_.begin() ? std::next(u)->label : std::prev(u)->label;
    double capacity = 1;  // 1.4^bits: the most units a range of 2^bits labels may hold
    for (int bits = 1; bits <= kBits; ++bits) {
      capacity *= 1.4;
      const uint64_t size = uint64_t{1} << bits, base = anchor & ~(size - 1);
      UnitList::iterator first = u, last = u;  // u and its neighbours labelled in [base, base + size)
      uint64_t n = 1;
      for (; first != units_.begin() && std::prev(first)->label >= base; ++n) --first;
      for (; std::next(last) != units_.end() && std::next(last)->label - base < size; ++n) ++last;
      if (static_cast<double>(n + 1) > capacity) continue;  // too dense: a wider range
      const uint64_t step = size / (n + 1);
      uint64_t label = base;
      for (UnitList::iterator it = first;; ++it) {
        it->label = label += step;
        if (it == last) break;
      }
      return;
    }
    NAPKIN_INTERNAL_CHECK(false, "fuse-elementwise ran out of unit labels");
  }

  // Node `id`, the last unit visited, joins group `c` if that is legal:
  // [c] gap [id] becomes [before] [c id] [after].
  bool join_node(int c, NodeId id) {
    UnitList::iterator unit = node_unit_[id];
    std::vector<UnitList::iterator> before, after;
    if (settled_[c] < 0)
      if (std::optional<bool> joined = join_by_reach(c, id)) return *joined;
    if (settled_[c] >= 0 ? !legal_since(c, id, before)
                         : !legal(c, unit, id, [&](NodeId r) { return r == id; }, before, after))
      return false;
    move_before(before, group_unit_[c]);
    units_.erase(unit);
    add_member(c, id);
    settled_[c] = visit_[id];  // every unit after c now depends on it
    return true;
  }

  // join_node for a group c whose settled_ is unknown, when the units
  // between c and id that depend on c (found forward from c's members'
  // readers) and those that id needs (found back from its inputs) take at
  // most kReachSteps steps: the same verdict, and the same order, reached by
  // moving c and its dependents after the others instead of the others
  // before c (N clipped gradients, each joined by its parameter's update
  // with the later ones between them, made N^2 moves). nullopt when it gives
  // up: then legal() walks the units between.
  std::optional<bool> join_by_reach(int c, NodeId id) {
    constexpr int64_t kReachSteps = 64;
    if (static_cast<int64_t>(members_[c].size()) > kReachSteps) return std::nullopt;  // a long chain: walk its gap
    int64_t steps = 0;
    ++stamp_;
    const uint64_t start = group_unit_[c]->label, end = node_unit_[id]->label;
    auto unit_of = [&](NodeId x) { return group_of(x) < 0 ? node_unit_[x] : group_unit_[group_of(x)]; };
    // The unit of x when it lies strictly between c and id.
    auto between = [&](NodeId x) -> std::optional<UnitList::iterator> {
      if (x == ir::kNoNode || visit_[x] >= visit_[id] || group_of(x) == c) return std::nullopt;
      UnitList::iterator u = unit_of(x);
      if (u->label <= start || u->label >= end) return std::nullopt;
      return u;
    };
    std::vector<UnitList::iterator> dependent;  // units depending on c, gap_-marked
    auto add_readers = [&](NodeId m) {
      for (ValueId out : g_.node(m).outputs)
        for (NodeId r : uses_.readers(out)) {
          ++steps;
          std::optional<UnitList::iterator> u = between(r);
          if (!u || gap_[r] == stamp_) continue;
          for_each_node(**u, [&](NodeId x) { gap_[x] = stamp_; });
          dependent.push_back(*u);
        }
    };
    for (auto m = members_[c].begin(); m != members_[c].end() && steps <= kReachSteps; ++m, ++steps) add_readers(*m);
    for (size_t i = 0; i < dependent.size() && steps <= kReachSteps; ++i) for_each_node(*dependent[i], add_readers);
    std::vector<UnitList::iterator> needed;  // needed_-marked
    bool legal = true;
    auto add_producers = [&](NodeId r) {
      for (ValueId in : g_.node(r).inputs) {
        ++steps;
        NodeId x = g_.value(in).producer;
        std::optional<UnitList::iterator> u = between(x);
        if (!u || needed_[x] == stamp_) continue;
        legal = legal && gap_[x] != stamp_;
        for_each_node(**u, [&](NodeId y) { needed_[y] = stamp_; });
        needed.push_back(*u);
      }
    };
    if (steps <= kReachSteps) add_producers(id);
    for (size_t i = 0; i < needed.size() && legal && steps <= kReachSteps; ++i) for_each_node(*needed[i], add_producers);
    count(steps);
    if (steps > kReachSteps) return std::nullopt;
    if (!legal) return false;
    std::sort(dependent.begin(), dependent.end(), [](UnitList::iterator a, UnitList::iterator b) { return a->label < b->label; });
    units_.erase(node_unit_[id]);
    dependent.insert(dependent.begin(), group_unit_[c]);
    for (UnitList::iterator u : dependent) {
      units_.splice(units_.end(), units_, u);
      place(u);
      u->moved_later = visit_[id];
      moved_later_.emplace_back(visit_[id], u->group < 0 ? u->node : members_[u->group].front());
      if (u->group >= 0 && u->group != c) settled_[u->group] = -1;
    }
    add_member(c, id);
    settled_[c] = visit_[id];
    return true;
  }

  // Group `c`, which comes before `joined`, merges into it if that is legal:
  // [c] gap [joined] becomes [before] [c joined] [after]. The smaller group's
  // members move.
  bool join_groups(int c, int joined) {
    std::vector<UnitList::iterator> before, after;
    if (!legal(c, group_unit_[joined], ir::kNoNode, [&](NodeId r) { return group_of(r) == joined; }, before, after))
      return false;
    move_before(before, group_unit_[c]);
    const uint64_t label = group_unit_[c]->label;  // joined's unit takes c's place
    const int label_moved_later = group_unit_[c]->moved_later;
    units_.splice(group_unit_[c], units_, group_unit_[joined]);
    units_.erase(group_unit_[c]);
    group_unit_[joined]->label = label;
    settled_[joined] = -1;
    first_visit_[joined] = std::min(first_visit_[joined], first_visit_[c]);
    group_unit_[joined]->moved_later = std::max(group_unit_[joined]->moved_later, label_moved_later);
    std::deque<NodeId>& into = members_[joined];
    std::deque<NodeId>& from = members_[c];
    if (from.size() > into.size()) {
      std::swap(from, into);  // into: c's members; from: joined's, which go after them
      count(static_cast<int64_t>(from.size()));
      into.insert(into.end(), from.begin(), from.end());
    } else {
      count(static_cast<int64_t>(from.size()));
      into.insert(into.begin(), from.begin(), from.end());
    }
    from.clear();
    parent_[c] = joined;
    return true;
  }
};

// Schedules the optimizer phase's groups of one batch signature
// (ir/fusion_group.h) next to each other, so that they run as one kernel: a
// list schedule of its units (a group, or a node alone) that takes, among
// the units whose inputs are ready, one of the signature it took last if
// there is one, else a view (no kernel: it may ready one of that signature),
// else the earliest; ties go to the earlier unit.
void schedule_batches(ir::Graph& g, int64_t* work) {
  std::vector<NodeId>& schedule = g.mutable_schedule();
  size_t start = 0;
  while (start < schedule.size() && g.node(schedule[start]).phase != ir::Phase::Optimizer) ++start;
  if (start == schedule.size()) return;
  const ir::FusionGroups groups = ir::fusion_groups(g);
  struct Unit {
    std::vector<NodeId> nodes;
    std::string signature;
    bool view = false;           // a view alone: no kernel, no work
    int waiting = 0;             // inputs made by units not scheduled yet
    std::vector<int> readers;    // units reading what this one makes
  };
  std::vector<Unit> units;
  std::vector<int> unit_of(g.num_nodes(), -1);
  for (size_t p = start; p < schedule.size(); ++p) {
    const NodeId id = schedule[p];
    const int gid = g.node(id).group;
    if (gid < 0 || p == start || g.node(schedule[p - 1]).group != gid) {
      units.push_back({});
      if (gid >= 0) units.back().signature = ir::batch_signature(g, groups.groups[gid]);
    }
    units.back().nodes.push_back(id);
    units.back().view = gid < 0 && ir::op_info(g.node(id).op).op_class == ir::OpClass::View;
    unit_of[id] = static_cast<int>(units.size()) - 1;
  }
  for (int u = 0; u < static_cast<int>(units.size()); ++u) {
    std::set<int> from;
    for (NodeId id : units[u].nodes)
      for (ValueId in : g.node(id).inputs) {
        if (work) ++*work;
        for (ValueId v : {in, g.value(in).storage}) {
          const NodeId p = g.value(v).producer;
          if (p != ir::kNoNode && unit_of[p] >= 0 && unit_of[p] != u) from.insert(unit_of[p]);
        }
      }
    units[u].waiting = static_cast<int>(from.size());
    for (int f : from) units[f].readers.push_back(u);
  }
  std::set<int> ready;
  for (int u = 0; u < static_cast<int>(units.size()); ++u)
    if (units[u].waiting == 0) ready.insert(u);
  std::vector<NodeId> order(schedule.begin(), schedule.begin() + static_cast<std::ptrdiff_t>(start));
  std::string last;
  while (!ready.empty()) {
    // The signature taken last, else a view (free, and it may ready one), else the earliest.
    int pick = -1, view = -1;
    for (int u : ready) {
      if (work) ++*work;
      if (!last.empty() && units[u].signature == last) {
        pick = u;
        break;
      }
      if (view < 0 && units[u].view) view = u;
    }
    if (pick < 0) pick = view >= 0 ? view : *ready.begin();
    ready.erase(pick);
    if (!units[pick].view) last = units[pick].signature;
    order.insert(order.end(), units[pick].nodes.begin(), units[pick].nodes.end());
    for (int r : units[pick].readers)
      if (--units[r].waiting == 0) ready.insert(r);
  }
  NAPKIN_INTERNAL_CHECK(order.size() == schedule.size(), "the optimizer phase has a dependency cycle");
  schedule = std::move(order);
  renumber_groups(g);
}

class FuseElementwise : public Pass {
 public:
  explicit FuseElementwise(int64_t* work) : work_(work) {}
  std::string_view name() const override { return "fuse-elementwise"; }
  bool run(ir::Graph& g, ir::Diagnostics&) override {
    const std::vector<NodeId> old_schedule = g.schedule();
    std::vector<int> old_groups;
    for (NodeId id : old_schedule) old_groups.push_back(g.node(id).group);
    Fuser fuser(g, work_);
    fuser.form_groups();
    bool copied = fuser.fold_constants();
    fuser.write_groups();
    schedule_batches(g, work_);
    if (copied || g.schedule() != old_schedule) return true;
    for (size_t p = 0; p < old_schedule.size(); ++p)
      if (g.node(old_schedule[p]).group != old_groups[p]) return true;
    return false;
  }

 private:
  int64_t* work_;
};

}  // namespace

std::unique_ptr<Pass> make_fuse_elementwise_pass(int64_t* work) { return std::make_unique<FuseElementwise>(work); }

void renumber_groups(ir::Graph& g) {
  std::map<int, int> renumbered;
  for (NodeId id : g.schedule()) {
    ir::Node& n = g.node(id);
    if (n.group < 0) continue;
    auto [it, added] = renumbered.emplace(n.group, static_cast<int>(renumbered.size()));
    n.group = it->second;
  }
}

}  // namespace napkin::passes
