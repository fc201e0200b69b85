// fp8 per-tensor scaling of contraction operands: see passes/fp8_scaling.h.
#include "passes/fp8_scaling.h"


#include "ir/builder.h"
#include "passes/mixed_precision.h"

namespace napkin::passes {

namespace {

using ir::DType;
using ir::Op;
using ir::ValueId;

class Fp8Scaling : public Pass {
 public:
  std::string_view name() const override { return "fp8_scaling"; }

  bool run(ir::Graph& g, ir::Diagnostics&) override {
    if (g.config.precision.policy != ir::PrecisionPolicy::FP8Mixed) return false;
    const std::vector<ir::NodeId> schedule = g.schedule();
    std::vector<ir::NodeId> reordered;
    bool changed = false;
    for (ir::NodeId id : schedule) {
      const ir::Node n = g.node(id);  // a copy: quantizing adds nodes
      bool contraction = ir::op_info(n.op).op_class == ir::OpClass::Contraction;
      bool low = contraction && g.value(n.in(0)).type.dtype == DType::BF16;
      if (low) {
        b_ = std::make_unique<ir::Builder>(g);
        b_->set_phase(n.phase);
        b_->set_loc(n.loc);
        b_->set_scope(n.scope);
        b_->set_origin(n.origin);
        made_.clear();
        std::vector<ValueId> inputs;
        for (ValueId v : n.inputs) inputs.push_back(quantize(g, v, is_gradient(g, v) ? DType::F8E5M2 : DType::F8E4M3));
        g.node(id).inputs = inputs;
        reordered.insert(reordered.end(), made_.begin(), made_.end());
        changed = true;
      }
      reordered.push_back(id);
    }
    g.mutable_schedule() = reordered;
    return changed;
  }

 private:
  std::unique_ptr<ir::Builder> b_;
  std::vector<ir::NodeId> made_;

  static bool is_gradient(const ir::Graph& g, ValueId v) {
    ir::NodeId p = g.value(g.value(v).storage).producer;
    return p != ir::kNoNode && g.node(p).phase == ir::Phase::Backward;
  }

  ValueId op(ir::Graph& g, Op o, std::vector<ValueId> in, ir::Attrs attrs = {}) {
    attrs.set(kAmpCastAttr, std::string(kFp8CastReason));
    ValueId v = b_->must(b_->add(o, std::move(in), std::move(attrs)));
    made_.push_back(g.value(v).producer);
    return v;
  }
  ValueId constant(ir::Graph& g, double x) { return op(g, Op::Constant, {}, {{"value", x}, {"dtype", DType::F32}}); }

  // x' = bf16(f32(cast(f32(x) / s, format)) · s), s from x's amax.
  ValueId quantize(ir::Graph& g, ValueId x, DType format) {
    const ir::TensorType type = g.value(x).type;
    std::vector<int64_t> axes(type.rank());
    for (int i = 0; i < type.rank(); ++i) axes[i] = i;
    ValueId magnitude = op(g, Op::Abs, {x});
    ValueId amax = op(g, Op::Cast,
                      {type.rank() ? op(g, Op::ReduceMax, {magnitude}, {{"axes", axes}, {"keepdims", int64_t{0}}}) : magnitude},
                      {{"dtype", DType::F32}});
    ValueId scaled_max = op(g, Op::Div, {amax, constant(g, ir::float_info(format).max)});
    ValueId all_zero = op(g, Op::Equal, {amax, constant(g, 0)});
    ValueId scale = op(g, Op::Where, {all_zero, constant(g, 1), scaled_max});
    ValueId wide = op(g, Op::Cast, {x}, {{"dtype", DType::F32}});
    ValueId q = op(g, Op::Cast, {op(g, Op::Div, {wide, scale})}, {{"dtype", format}});
    ValueId back = op(g, Op::Mul, {op(g, Op::Cast, {q}, {{"dtype", DType::F32}}), scale});
    return op(g, Op::Cast, {back}, {{"dtype", type.dtype}});
  }
};

}  // namespace

std::unique_ptr<Pass> make_fp8_scaling_pass() { return std::make_unique<Fp8Scaling>(); }

}  // namespace napkin::passes
