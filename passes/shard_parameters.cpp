// ZeRO-3's collectives in the step: see passes/shard_parameters.h.
#include "passes/shard_parameters.h"

#include <map>
#include <set>
#include <vector>

#include "analysis/cost.h"
#include "ir/internal_check.h"
#include "passes/recompute.h"

namespace napkin::passes {

namespace {

using ir::NodeId;
using ir::Op;
using ir::ValueId;

class ShardParameters : public Pass {
 public:
  ShardParameters(ShardOptions options, ShardSchedule& schedule) : options_(options), schedule_(schedule) {}
  std::string_view name() const override { return "shard_parameters"; }

  bool run(ir::Graph& g, ir::Diagnostics&) override {
    const std::vector<NodeId> base = g.schedule();
    std::map<NodeId, std::vector<NodeId>> before, after;
    // Each parameter's first reader, in one walk of the schedule.
    std::map<ValueId, NodeId> first_reader;
    for (const ir::Param& param : g.params) first_reader[param.value] = ir::kNoNode;
    for (NodeId id : base)
      for (ValueId in : g.node(id).inputs)
        if (auto it = first_reader.find(in); it != first_reader.end() && it->second == ir::kNoNode) it->second = id;
    std::map<ValueId, ValueId> copy_of;  // param -> its gathered copy
    std::set<ValueId> gathered;
    for (const ir::Param& param : g.params) {
      const ValueId p = param.value;
      const NodeId first = first_reader.at(p);
      if (first == ir::kNoNode) continue;  // no node reads it: nothing to gather
      const ir::Value value = g.value(p);
      const NodeId gather = g.add_node(Op::AllGather, {p}, {value.type}, {{"param", value.name}}, value.loc,
                                       g.node(first).scope, ir::Phase::Forward);
      copy_of[p] = g.node(gather).out();
      gathered.insert(copy_of[p]);
      before[first].push_back(gather);
    }
    // Every read of a parameter, and every view of its buffer, now reads the gathered copy. The optimizer (not
    // built yet) will read the parameter itself.
    for (NodeId id : base)
      for (ValueId& in : g.node(id).inputs)
        if (auto it = copy_of.find(in); it != copy_of.end()) in = it->second;
    for (ValueId v = 0; v < g.num_values(); ++v)
      if (auto it = copy_of.find(g.value(v).storage); it != copy_of.end() && v != it->first) g.value(v).storage = it->second;
    for (auto& [label, v] : g.outputs) {
      if (label.rfind("grad.", 0) != 0) continue;
      const ir::Value grad = g.value(v);
      NAPKIN_INTERNAL_CHECK(grad.producer != ir::kNoNode, "shard_parameters: {} has no producer", label);
      const ir::Node& producer = g.node(grad.producer);
      const NodeId scatter = g.add_node(Op::ReduceScatter, {v}, {grad.type}, {{"param", label.substr(5)}}, grad.loc,
                                        producer.scope, ir::Phase::Backward);
      g.node(scatter).origin = producer.origin;
      const ValueId sum = g.node(scatter).out();
      g.value(sum).name = label;
      g.value(v).name.clear();
      after[grad.producer].push_back(scatter);
      v = sum;
    }
    if (gathered.empty() && after.empty()) return false;
    std::vector<NodeId> order;
    for (NodeId id : base) {
      if (auto it = before.find(id); it != before.end()) order.insert(order.end(), it->second.begin(), it->second.end());
      order.push_back(id);
      if (auto it = after.find(id); it != after.end()) order.insert(order.end(), it->second.begin(), it->second.end());
    }
    g.mutable_schedule() = std::move(order);
    if (!options_.keep_gathered) g = with_recompute(g, computed_from_gathered(g, gathered), flops_added_);
    plan_gathers(g);
    return true;
  }

 private:
  // The time model of the prefetch (the header's): each node's roofline
  // seconds, a collective's over the link.
  struct Model {
    std::map<NodeId, double> seconds;  // compute nodes only
    const analysis::Interconnect* link = nullptr;
    int ranks = 2;
    double collective_seconds(const ir::Graph& g, const ir::Node& n) const {
      const double bytes = static_cast<double>(g.value(n.in(0)).type.bytes());
      // A ring's share of the bytes (the all-gather's and reduce-scatter's), one latency per call.
      return analysis::reduce_scatter_bytes(bytes, ranks) / link->bytes_per_s + link->latency_s;
    }
  };

  // A unit's gathers (the header's), in schedule order.
  struct Unit {
    std::vector<NodeId> gathers;
    int first_use = 0;     // position of its first gather (right before the first reader)
    int first_reader = 0;  // position of that reader: the first node after first_use that is no gather
    std::string scope;     // the first reader's
  };

  Model model(const ir::Graph& g) const {
    Model m;
    const analysis::Device* device = options_.device ? options_.device : analysis::find_device("cpu");
    m.link = options_.link ? options_.link : analysis::find_interconnect("shm");
    m.ranks = std::max(2, options_.ranks);
    NAPKIN_INTERNAL_CHECK(device && m.link, "shard_parameters: no cpu device or shm link to time the gathers by");
    const analysis::StepCost cost = analysis::analyze_step(g, device);
    for (const analysis::OpRow& row : cost.rows)
      if (ir::op_info(g.node(row.node).op).op_class != ir::OpClass::Collective) m.seconds[row.node] = row.seconds;
    schedule_.device = device->name, schedule_.link = m.link->name, schedule_.ranks = m.ranks;
    return m;
  }

  // Moves each unit's gathers ahead of its first use (the header's
  // prefetch), then accounts for the step's communication.
  void plan_gathers(ir::Graph& g) {
    const Model m = model(g);
    std::vector<NodeId> order = g.schedule();
    // The units, in schedule order: runs of gathers whose first readers share a scope and phase.
    std::vector<Unit> units;
    std::string last_key;
    for (int p = 0; p < static_cast<int>(order.size()); ++p) {
      const ir::Node& n = g.node(order[p]);
      if (n.op != Op::AllGather) continue;
      int reader_at = p + 1;  // each gather sits right before its first reader, after the other gathers there
      while (reader_at < static_cast<int>(order.size()) && g.node(order[reader_at]).op == Op::AllGather) ++reader_at;
      NAPKIN_INTERNAL_CHECK(reader_at < static_cast<int>(order.size()), "shard_parameters: a gather without a reader");
      const std::string& scope = g.node(order[reader_at]).scope;
      const std::string key = std::string(ir::phase_name(n.phase)) + "/" + scope;
      if (units.empty() || key != last_key) {
        units.push_back({{}, p, reader_at, scope});
      }
      units.back().gathers.push_back(order[p]);
      last_key = key;
    }
    // Compute seconds before each position.
    std::vector<double> before(order.size() + 1, 0);
    for (size_t p = 0; p < order.size(); ++p) {
      auto it = m.seconds.find(order[p]);
      before[p + 1] = before[p] + (it == m.seconds.end() ? 0 : it->second);
    }
    std::vector<int> issue(units.size());
    double comm_free = 0;  // when the gathers issued so far are done, the compute's clock
    for (size_t u = 0; u < units.size(); ++u) {
      const Unit& unit = units[u];
      const ir::Phase phase = g.node(unit.gathers.front()).phase;
      double seconds = 0;
      for (NodeId id : unit.gathers) seconds += m.collective_seconds(g, g.node(id));
      // Not before the previous unit of its phase is in use, nor into another phase.
      int lowest = unit.first_use;
      while (lowest > 0 && g.node(order[lowest - 1]).phase == phase) --lowest;
      if (u > 0 && g.node(units[u - 1].gathers.front()).phase == phase)
        lowest = std::max(lowest, units[u - 1].first_reader + 1);
      int at = unit.first_use;
      if (options_.prefetch)
        while (at > lowest && std::max(before[at], comm_free) + seconds > before[unit.first_use]) --at;
      issue[u] = at;
      comm_free = std::max(before[at], comm_free) + seconds;
    }
    // The new schedule: every unit's gathers at its issue position, in order.
    std::map<NodeId, size_t> unit_of;
    std::map<int, std::vector<NodeId>> issued_at;
    for (size_t u = 0; u < units.size(); ++u) {
      for (NodeId id : units[u].gathers) unit_of[id] = u;
      std::vector<NodeId>& list = issued_at[issue[u]];
      list.insert(list.end(), units[u].gathers.begin(), units[u].gathers.end());
    }
    if (!options_.prefetch) {  // each gather stays right before its first reader
      account(g, m, unit_of, units);
      return;
    }
    std::vector<NodeId> rescheduled;
    for (int p = 0; p <= static_cast<int>(order.size()); ++p) {
      if (auto it = issued_at.find(p); it != issued_at.end()) rescheduled.insert(rescheduled.end(), it->second.begin(), it->second.end());
      if (p < static_cast<int>(order.size()) && !unit_of.count(order[p])) rescheduled.push_back(order[p]);
    }
    g.mutable_schedule() = std::move(rescheduled);
    account(g, m, unit_of, units);
  }

  // The time model's account of the schedule as it now is: one queue of
  // collectives per rank in schedule order, a gather waited for at its
  // first reader, a reduce or all-reduce at once (the runtime issues them
  // so: runtime/parameter_collectives.h).
  void account(const ir::Graph& g, const Model& m, const std::map<NodeId, size_t>& unit_of,
               const std::vector<Unit>& units) {
    schedule_.ran = true, schedule_.prefetch = options_.prefetch;
    schedule_.units.assign(units.size(), {});
    std::map<ValueId, std::pair<size_t, double>> pending;  // gathered buffer -> its unit, when it arrives
    std::vector<double> issued(units.size(), -1);          // the clock at each unit's first gather
    std::vector<bool> used(units.size(), false);
    double clock = 0, comm_free = 0;
    for (NodeId id : g.schedule()) {
      const ir::Node& n = g.node(id);
      if (ir::op_info(n.op).op_class == ir::OpClass::Collective) {
        const double s = m.collective_seconds(g, n);
        comm_free = std::max(clock, comm_free) + s;
        if (n.op != Op::AllGather) {  // waited for at once
          schedule_.reduce_seconds += s;
          schedule_.reduces += n.op == Op::ReduceScatter ? 1 : 0;
          schedule_.exposed_seconds += comm_free - clock;
          clock = comm_free;
          continue;
        }
        const size_t u = unit_of.at(id);
        ShardUnit& unit = schedule_.units[u];
        unit.scope = units[u].scope, unit.phase = n.phase;
        unit.gathers += 1, unit.bytes += static_cast<double>(g.value(n.in(0)).type.bytes()), unit.seconds += s;
        schedule_.gather_seconds += s;
        pending[n.out()] = {u, comm_free};
        if (issued[u] < 0) issued[u] = clock;
        continue;
      }
      for (ValueId in : n.inputs) {
        auto it = pending.find(g.value(in).storage);
        if (it == pending.end()) continue;
        const auto [u, arrives] = it->second;
        ShardUnit& unit = schedule_.units[u];
        if (!used[u]) unit.ahead_seconds = clock - issued[u], used[u] = true;
        if (arrives > clock) {
          unit.exposed_seconds += arrives - clock;
          schedule_.exposed_seconds += arrives - clock;
          clock = arrives;
        }
        pending.erase(it);
      }
      auto it = m.seconds.find(id);
      const double s = it == m.seconds.end() ? 0 : it->second;
      clock += s, schedule_.compute_seconds += s;
    }
  }

  // The forward buffers made from gathered parameters (and constants) alone:
  // the gathered copies, and what the forward computes from them before they
  // meet an activation (a weight's cast to the policy's dtype, its views).
  // The backward recomputes these from a second gather.
  static std::set<ValueId> computed_from_gathered(const ir::Graph& g, std::set<ValueId> buffers) {
    for (NodeId id : g.schedule()) {
      const ir::Node& n = g.node(id);
      if (n.phase != ir::Phase::Forward || n.op == Op::AllGather || n.inputs.empty()) continue;
      bool reads_gathered = false, only_gathered = true;
      for (ValueId in : n.inputs) {
        const ValueId storage = g.value(in).storage;
        if (buffers.count(storage)) {
          reads_gathered = true;
          continue;
        }
        const NodeId made_by = g.value(storage).producer;
        only_gathered = only_gathered && made_by != ir::kNoNode &&
                        ir::op_info(g.node(made_by).op).op_class == ir::OpClass::Source;
      }
      if (!reads_gathered || !only_gathered) continue;
      for (ValueId out : n.outputs) buffers.insert(g.value(out).storage);
    }
    return buffers;
  }

  ShardOptions options_;
  ShardSchedule& schedule_;
  double flops_added_ = 0;
};

}  // namespace

std::unique_ptr<Pass> make_shard_parameters_pass(ShardOptions options, ShardSchedule& schedule) {
  return std::make_unique<ShardParameters>(options, schedule);
}

}  // namespace napkin::passes
