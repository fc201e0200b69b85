#include "passes/embedding_grad_into.h"

#include <algorithm>
#include <string>
#include <vector>

#include "ir/use_list.h"

namespace napkin::passes {

namespace {

using ir::NodeId;
using ir::Op;
using ir::ValueId;

class EmbeddingGradInto : public Pass {
 public:
  std::string_view name() const override { return "embedding_grad_into"; }

  bool run(ir::Graph& g, ir::Diagnostics&) override {
    const ir::UseList uses(g);
    bool changed = false;
    const std::vector<NodeId> schedule = g.schedule();
    for (NodeId id : schedule) {
      const ir::Node& add = g.node(id);
      if (add.op != Op::Add || add.phase != ir::Phase::Backward) continue;
      for (int side = 0; side < 2; ++side) {
        const ValueId scattered = add.in(side), base = add.in(1 - side);
        const ir::Value &s = g.value(scattered), &b = g.value(base);
        if (s.producer == ir::kNoNode || s.is_view() || !uses.single_buffer(scattered)) continue;
        const ir::Node& scatter = g.node(s.producer);
        if (scatter.op != Op::EmbeddingGrad || scatter.inputs.size() != 2 || scatter.phase != ir::Phase::Backward) continue;
        // The base: made by the backward, read by the add alone, not a view, the scatter's type.
        if (b.producer == ir::kNoNode || g.node(b.producer).phase != ir::Phase::Backward || b.is_view() ||
            !uses.single_buffer(base) || base == scattered)
          continue;
        auto same = [&](const ir::TensorType& t) { return t.dtype == s.type.dtype && t.same_shape(s.type); };
        if (!same(b.type) || !same(g.value(add.out()).type)) continue;
        const NodeId scatter_id = scatter.id;
        g.node(scatter_id).inputs.push_back(base);
        // At the add's position: every input is ready there (dy and ids were, at the scatter's).
        std::vector<NodeId>& order = g.mutable_schedule();
        auto move_before = [&](NodeId moved, NodeId anchor) {
          order.erase(std::find(order.begin(), order.end(), moved));
          order.insert(std::find(order.begin(), order.end(), anchor), moved);
        };
        move_before(scatter_id, id);
        // A widening cast made the base (GPT-2: the classifier's bf16 gradient of the table, widened): it
        // runs right before the scatter, so the narrower value is what stays alive in between, as when
        // the cast and the add were one kernel at the end.
        const ir::Node& maker = g.node(b.producer);
        if (maker.op == Op::Cast && maker.outputs.size() == 1 &&
            g.value(maker.in(0)).type.bytes() < b.type.bytes())
          move_before(maker.id, scatter_id);
        const std::string name = g.value(add.out()).name;
        g.replace_uses(add.out(), scattered);
        if (g.value(scattered).name.empty()) {  // grad.wte stays grad.wte (the dead add's value gives it up)
          g.value(add.out()).name.clear();
          g.value(scattered).name = name;
        }
        changed = true;
        break;
      }
    }
    return changed;
  }
};

}  // namespace

std::unique_ptr<Pass> make_embedding_grad_into_pass() { return std::make_unique<EmbeddingGradInto>(); }

}  // namespace napkin::passes
