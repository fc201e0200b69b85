// ZeRO-3's collectives in the step: see passes/shard_parameters.h.
#include "passes/shard_parameters.h"

#include <map>
#include <set>
#include <vector>

#include "ir/internal_check.h"
#include "passes/recompute.h"

namespace napkin::passes {

namespace {

using ir::NodeId;
using ir::Op;
using ir::ValueId;

class ShardParameters : public Pass {
 public:
  explicit ShardParameters(ShardOptions options) : options_(options) {}
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
    return true;
  }

 private:
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
  double flops_added_ = 0;
};

}  // namespace

std::unique_ptr<Pass> make_shard_parameters_pass(ShardOptions options) {
  return std::make_unique<ShardParameters>(options);
}

}  // namespace napkin::passes
