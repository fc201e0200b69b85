#include "passes/norm_grad_residual.h"

#include <algorithm>
#include <vector>

#include "ir/use_list.h"

namespace napkin::passes {

namespace {

using ir::NodeId;
using ir::Op;
using ir::ValueId;

class NormGradResidual : public Pass {
 public:
  std::string_view name() const override { return "norm_grad_residual"; }

  bool run(ir::Graph& g, ir::Diagnostics&) override {
    const ir::UseList uses(g);
    std::vector<int> position(g.num_nodes(), -1);
    const std::vector<NodeId> schedule = g.schedule();
    for (int p = 0; p < static_cast<int>(schedule.size()); ++p) position[schedule[p]] = p;
    // Where v can be read: its producer's position (the buffer's, and the view's), -1 for params, data, state.
    auto ready_at = [&](ValueId v) {
      int at = -1;
      for (ValueId w : {v, g.value(v).storage})
        if (g.value(w).producer != ir::kNoNode) at = std::max(at, position[g.value(w).producer]);
      return at;
    };
    bool changed = false;
    for (NodeId id : schedule) {
      const ir::Node& add = g.node(id);
      if (add.op != Op::Add || add.phase != ir::Phase::Backward) continue;
      for (int side = 0; side < 2; ++side) {
        const ValueId dx = add.in(side), r = add.in(1 - side);
        const ir::Value& d = g.value(dx);
        if (d.producer == ir::kNoNode || d.is_view() || !uses.single_buffer(dx)) continue;
        const ir::Node& norm = g.node(d.producer);
        if ((norm.op != Op::LayerNormGrad && norm.op != Op::RMSNormGrad) || norm.inputs.size() != 3 || norm.out(0) != dx) continue;
        const ir::TensorType& t = d.type;
        if (t.dtype != ir::DType::F32 && t.dtype != ir::DType::F64) continue;
        auto same = [&](const ir::TensorType& o) { return o.dtype == t.dtype && o.same_shape(t); };
        if (!same(g.value(r).type) || !same(g.value(add.out()).type)) continue;
        if (ready_at(r) >= position[norm.id]) continue;
        g.node(norm.id).inputs.push_back(r);
        g.replace_uses(add.out(), dx);
        changed = true;
        break;
      }
    }
    return changed;
  }
};

}  // namespace

std::unique_ptr<Pass> make_norm_grad_residual_pass() { return std::make_unique<NormGradResidual>(); }

}  // namespace napkin::passes
