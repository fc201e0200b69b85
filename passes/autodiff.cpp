// Reverse-mode autodiff: see passes/autodiff.h for the terms and the contract.
//
// Steps:
//  1. "from a param": floating values reachable from a floating parameter
//     through nodes (forward sweep over the schedule);
//  2. "needs a gradient": those from which the loss is reachable through such
//     values (reverse sweep, starting at the loss);
//  3. every needing node whose op has no VJP is reported (all of them) and the
//     pass stops before changing anything;
//  4. seed d(loss) = 1, then walk the forward schedule in reverse, calling each
//     needing node's VJP; each input collects its contributions, summed with
//     add in visiting order (reverse schedule, then input order, so the result
//     is deterministic) when its producer is visited. Contributions that are
//     pads tiling one axis (the gradients of selects/slices that split a value,
//     like q, k, v) are concatenated instead;
//  5. export "grad.<param>" outputs, copying a gradient that is a view or is
//     shared with another output;
//  6. erase the backward nodes no output reads: a VJP builds the gradient of
//     every floating input, needed or not (the gradient of a data operand).
#include "passes/autodiff.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "ir/builder.h"
#include "ir/internal_check.h"

namespace napkin::passes {

namespace {

using ir::Graph;
using ir::Node;
using ir::NodeId;
using ir::ValueId;

bool is_float_value(const Graph& g, ValueId v) { return ir::is_floating(g.value(v).type.dtype); }

class Autodiff : public Pass {
 public:
  std::string_view name() const override { return "autodiff"; }

  bool run(Graph& g, ir::Diagnostics& diag) override {
    ValueId loss = g.find_output("loss");
    NAPKIN_INTERNAL_CHECK(loss != ir::kNoValue, "autodiff needs a graph output named 'loss'");
    NAPKIN_INTERNAL_CHECK(is_float_value(g, loss), "the loss must be floating, got {}",
                          ir::to_string(g.value(loss).type));
    const std::vector<NodeId> forward = g.schedule();
    const int num_forward_values = g.num_values();

    // 1. Floating values that depend on a parameter.
    std::vector<bool> from_param(num_forward_values, false);
    for (const ir::Param& p : g.params)
      if (is_float_value(g, p.value)) from_param[p.value] = true;
    for (NodeId id : forward) {
      const Node& n = g.node(id);
      bool depends = false;
      for (ValueId in : n.inputs) depends = depends || from_param[in];
      if (depends)
        for (ValueId out : n.outputs) from_param[out] = is_float_value(g, out);
    }

    // 2. ... and that the loss depends on.
    std::vector<bool> needs(num_forward_values, false);
    needs[loss] = from_param[loss];
    for (auto it = forward.rbegin(); it != forward.rend(); ++it) {
      const Node& n = g.node(*it);
      if (!any_needs(n, needs)) continue;
      for (ValueId in : n.inputs)
        if (from_param[in]) needs[in] = true;
    }
    if (!needs[loss]) return false;  // no parameter affects the loss: no gradients

    // 3. Ops without a VJP on the path from a parameter to the loss.
    bool differentiable = true;
    for (NodeId id : forward) {
      const Node& n = g.node(id);
      if (!any_needs(n, needs) || ir::op_info(n.op).vjp) continue;
      diag.error(n.loc, fmt::format("cannot differentiate '{}': it has no vector-Jacobian product", ir::op_name(n.op)),
                 "napkin differentiates once: backward-only ops such as this one cannot lie between a parameter "
                 "and the loss; compute it from values that do not depend on parameters");
      differentiable = false;
    }
    if (!differentiable) return false;

    // 4. The reverse sweep.
    ir::Builder b(g);
    b.set_phase(ir::Phase::Backward);
    first_backward_ = g.num_nodes();
    std::vector<std::vector<Contribution>> parts(num_forward_values);
    {
      // A copy: building the seed grows the value storage.
      const ir::Value l = g.value(loss);
      at(b, g, l.producer);
      if (l.producer == ir::kNoNode) b.set_loc(l.loc);
      ValueId seed = b.must(b.constant(1.0, l.type.dtype));
      if (l.type.rank() > 0) seed = b.must(b.add(ir::Op::Broadcast, {seed}, {{"shape", l.type.sizes()}}));
      parts[loss].push_back({seed, l.producer});
    }
    for (auto it = forward.rbegin(); it != forward.rend(); ++it) {
      const Node n = g.node(*it);  // a copy: building nodes may move the node storage
      if (!any_needs(n, needs)) continue;
      // A node's outputs after the first are what its own backward reads
      // (attention's lse), never on a path to the loss: the VJP takes dy of out(0).
      for (size_t i = 1; i < n.outputs.size(); ++i)
        NAPKIN_INTERNAL_CHECK(!needs[n.outputs[i]], "autodiff: output {} of {} needs a gradient", i, ir::op_name(n.op));
      ValueId dy = gradient(b, g, parts[n.out()]);
      NAPKIN_INTERNAL_CHECK(dy != ir::kNoValue, "autodiff: %{} ({}) needs a gradient but got none", n.out(),
                            ir::op_name(n.op));
      at(b, g, n.id);
      std::vector<ValueId> grads = ir::op_info(n.op).vjp(b, n, dy);
      NAPKIN_INTERNAL_CHECK(grads.size() == n.inputs.size(), "the VJP of {} returned {} gradients for {} inputs",
                            ir::op_name(n.op), grads.size(), n.inputs.size());
      for (size_t i = 0; i < n.inputs.size(); ++i) {
        ValueId in = n.inputs[i];
        if (!needs[in]) continue;
        ValueId gi = grads[i];
        NAPKIN_INTERNAL_CHECK(gi != ir::kNoValue, "the VJP of {} gave no gradient for input {}", ir::op_name(n.op), i);
        const ir::TensorType &want = g.value(in).type, &have = g.value(gi).type;
        NAPKIN_INTERNAL_CHECK(want.dtype == have.dtype && want.same_shape(have),
                              "the VJP of {} gave input {} ({}) a gradient of type {}", ir::op_name(n.op), i,
                              ir::to_string(want), ir::to_string(have));
        parts[in].push_back({gi, n.id});
      }
    }

    // 5. One contiguous, named buffer per parameter gradient.
    std::set<ValueId> exported;
    for (const ir::Param& p : g.params) {
      ValueId v = gradient(b, g, parts[p.value]);  // may add nodes: the sum of its contributions
      if (v == ir::kNoValue) continue;
      const ir::Value& gv = g.value(v);
      bool own = !gv.is_view() && gv.producer != ir::kNoNode && gv.producer >= first_backward_ && !exported.count(v);
      if (!own) {
        b.set_origin(gv.producer != ir::kNoNode ? g.node(gv.producer).origin : ir::kNoNode);
        b.set_loc(g.value(p.value).loc);
        b.set_scope("");
        v = b.must(b.add(ir::Op::Copy, {v}));
      }
      exported.insert(v);
      std::string label = "grad." + g.value(p.value).name;
      g.value(v).name = label;
      g.outputs.emplace_back(label, v);
    }

    // 6. Drop the backward nodes nothing reads.
    std::vector<bool> live(g.num_values(), false);
    for (const auto& [label, v] : g.outputs) live[v] = true;
    for (const Graph::Update& u : g.updates) live[u.value] = true;
    std::vector<NodeId> dead;
    const std::vector<NodeId>& schedule = g.schedule();
    for (auto it = schedule.rbegin(); it != schedule.rend() && *it >= first_backward_; ++it) {
      const Node& n = g.node(*it);
      bool used = false;
      for (ValueId out : n.outputs) used = used || live[out];
      if (!used) {
        dead.push_back(n.id);
        continue;
      }
      for (ValueId in : n.inputs) live[in] = true;
    }
    g.erase_nodes(dead);
    return true;
  }

 private:
  // One term of a value's gradient, and the forward node whose VJP made it.
  struct Contribution {
    ValueId value = ir::kNoValue;
    NodeId from = ir::kNoNode;
  };
  NodeId first_backward_ = ir::kNoNode;

  // Backward nodes take the location, scope and id (origin) of a forward node.
  static void at(ir::Builder& b, const Graph& g, NodeId forward_node) {
    b.set_origin(forward_node);
    b.set_loc(forward_node != ir::kNoNode ? g.node(forward_node).loc : ir::SourceLoc{});
    b.set_scope(forward_node != ir::kNoNode ? g.node(forward_node).scope : "");
  }

  // The sum of a value's contributions (kNoValue if none), built once: the
  // contributions are replaced by the sum.
  ValueId gradient(ir::Builder& b, const Graph& g, std::vector<Contribution>& parts) const {
    if (parts.empty()) return ir::kNoValue;
    if (parts.size() > 1) {
      ValueId sum = concat_of_pads(b, g, parts);
      if (sum == ir::kNoValue) {
        sum = parts[0].value;
        for (size_t i = 1; i < parts.size(); ++i) {
          at(b, g, parts[i].from);
          sum = b.must(b.add(ir::Op::Add, {sum, parts[i].value}));
        }
      }
      parts = {{sum, parts.back().from}};
    }
    return parts[0].value;
  }

  // When every contribution is a pad this pass built along one axis and their
  // unpadded ranges tile that axis (the gradients of slices or selects that
  // split a value, such as q, k and v), the sum is the concatenation of the
  // pieces: one copy instead of n padded buffers and n - 1 additions.
  ValueId concat_of_pads(ir::Builder& b, const Graph& g, const std::vector<Contribution>& parts) const {
    struct Piece {
      int64_t start, stop;
      ValueId value;
    };
    std::vector<Piece> pieces;
    int64_t axis = -1, size = 0;
    for (const Contribution& c : parts) {
      NodeId producer = g.value(c.value).producer;
      if (producer == ir::kNoNode || producer < first_backward_) return ir::kNoValue;
      const Node& pad = g.node(producer);
      if (pad.op != ir::Op::Pad) return ir::kNoValue;
      int64_t a = pad.attrs.get_int("axis");
      if (axis >= 0 && a != axis) return ir::kNoValue;
      axis = a;
      size = g.value(pad.out()).type.dims[a].size;
      int64_t start = pad.attrs.get_int("before");
      pieces.push_back({start, size - pad.attrs.get_int("after"), pad.in(0)});
    }
    std::stable_sort(pieces.begin(), pieces.end(), [](const Piece& x, const Piece& y) { return x.start < y.start; });
    int64_t covered = 0;
    for (const Piece& p : pieces) {
      if (p.start != covered) return ir::kNoValue;  // a gap or an overlap
      covered = p.stop;
    }
    if (covered != size) return ir::kNoValue;
    std::vector<ValueId> inputs;
    for (const Piece& p : pieces) inputs.push_back(p.value);
    at(b, g, parts[0].from);
    return b.must(b.add(ir::Op::Concat, inputs, {{"axis", axis}}));
  }

  static bool any_needs(const Node& n, const std::vector<bool>& needs) {
    for (ValueId out : n.outputs)
      if (needs[out]) return true;
    return false;
  }
};

}  // namespace

std::unique_ptr<Pass> make_autodiff_pass() { return std::make_unique<Autodiff>(); }

std::vector<ValueId> saved_activations(const Graph& g) {
  auto forward_result = [&](ValueId v) {
    const ir::Value& value = g.value(v);
    return value.kind == ir::ValueKind::Result && value.producer != ir::kNoNode &&
           g.node(value.producer).phase == ir::Phase::Forward;
  };
  std::vector<bool> read(g.num_values(), false);
  for (NodeId id : g.schedule()) {
    const Node& n = g.node(id);
    if (n.phase != ir::Phase::Backward) continue;
    for (ValueId in : n.inputs) {
      ValueId storage = g.value(in).storage;
      if (forward_result(storage)) read[storage] = true;
    }
  }
  std::vector<ValueId> saved;
  for (NodeId id : g.schedule()) {
    const Node& n = g.node(id);
    if (n.phase != ir::Phase::Forward) continue;
    for (ValueId out : n.outputs)
      if (read[out]) saved.push_back(out);
  }
  return saved;
}

}  // namespace napkin::passes
