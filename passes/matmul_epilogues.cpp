#include "passes/matmul_epilogues.h"

#include <vector>

#include "ir/builder.h"
#include "ir/use_list.h"

namespace napkin::passes {

namespace {

using ir::DType;
using ir::NodeId;
using ir::Op;
using ir::ValueId;

class MatmulEpilogues : public Pass {
 public:
  explicit MatmulEpilogues(CastPlacement& placement) : placement_(placement) {}
  std::string_view name() const override { return "matmul_epilogues"; }

  bool run(ir::Graph& g, ir::Diagnostics&) override {
    const ir::UseList uses(g);
    bool changed = false;
    const std::vector<NodeId> schedule = g.schedule();
    for (NodeId id : schedule) {
      const ir::Node& cast = g.node(id);
      if (cast.op != Op::Cast || g.value(cast.out()).type.dtype != DType::F32) continue;
      const ValueId r = cast.in(0);
      const NodeId p = g.value(r).producer;
      if (p == ir::kNoNode || g.value(r).is_view() || uses.escapes(r)) continue;
      // Besides the cast, only reductions that widen as they load (sink_casts'
      // dtype=f32) may read the result: they read the f32 sums instead.
      bool only_cast = true;
      for (NodeId reader : uses.readers(r)) {
        const ir::Node& rn = g.node(reader);
        const bool widening_reduce = ir::op_info(rn.op).op_class == ir::OpClass::Reduction && rn.attrs.has("dtype") &&
                                     rn.attrs.get_dtype("dtype") == DType::F32;
        if (reader != id && !widening_reduce) only_cast = false;
      }
      if (!only_cast) continue;
      const ir::Node& mm = g.node(p);
      if ((mm.op != Op::MatMul && mm.op != Op::Einsum) || mm.attrs.has("dtype")) continue;
      const DType t = g.value(r).type.dtype;
      if (t != DType::BF16) continue;  // f16 keeps AMP's rounding, which loss scaling is designed around
      bool standalone = true;  // fusion would not merge the cast into an elementwise reader
      for (NodeId reader : uses.readers(cast.out())) {
        const ir::Node& rn = g.node(reader);
        if (ir::op_info(rn.op).op_class == ir::OpClass::Elementwise && rn.phase == cast.phase) standalone = false;
      }
      if (!standalone) continue;
      accumulate_in_f32(g, p, id);
      changed = true;
      ++placement_.epilogues;
    }
    return changed;
  }

 private:
  CastPlacement& placement_;
};

}  // namespace

void accumulate_in_f32(ir::Graph& g, ir::NodeId contraction, ir::NodeId widening_cast) {
  const ValueId r = g.node(contraction).out(), old = g.node(widening_cast).out();
  g.node(contraction).attrs.set("dtype", DType::F32);
  g.value(r).type.dtype = DType::F32;
  g.replace_uses(old, r);
  if (g.value(r).name.empty()) std::swap(g.value(r).name, g.value(old).name);
}

std::unique_ptr<Pass> make_matmul_epilogues_pass(CastPlacement& placement) {
  return std::make_unique<MatmulEpilogues>(placement);
}

}  // namespace napkin::passes
