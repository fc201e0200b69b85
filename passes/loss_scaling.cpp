// Dynamic loss scaling: see passes/loss_scaling.h for the terms and the algorithm.
#include "passes/loss_scaling.h"

#include <algorithm>

#include "ir/builder.h"
#include "ir/internal_check.h"

namespace napkin::passes {

namespace {

using ir::DType;
using ir::Op;
using ir::ValueId;

constexpr const char* kScaleState = "loss_scale.scale";
constexpr const char* kGoodStepsState = "loss_scale.good_steps";
constexpr const char* kFoundInfOutput = "loss_scale.found_inf";
constexpr const char* kScaleOutput = "loss_scale.scale";

// Small arithmetic on a Builder whose nodes are also recorded, in order, so a
// pass can place them in the schedule.
struct Emitter {
  ir::Builder b;
  std::vector<ir::NodeId> made;
  explicit Emitter(ir::Graph& g) : b(g) {}
  ValueId op(Op o, std::vector<ValueId> in, ir::Attrs attrs = {}) {
    ValueId v = b.must(b.add(o, std::move(in), std::move(attrs)));
    made.push_back(b.graph().value(v).producer);
    return v;
  }
  ValueId constant(double x, DType t) { return op(Op::Constant, {}, {{"value", x}, {"dtype", t}}); }
  ValueId where(ValueId c, ValueId x, ValueId y) { return op(Op::Where, {c, x, y}); }
  ValueId mul(ValueId x, ValueId y) { return op(Op::Mul, {x, y}); }
  ValueId cast(ValueId x, DType t) {
    return b.graph().value(x).type.dtype == t ? x : op(Op::Cast, {x}, {{"dtype", t}});
  }
  // The sum of all elements of x, a scalar.
  ValueId total(ValueId x) {
    int rank = b.graph().value(x).type.rank();
    if (rank == 0) return x;
    std::vector<int64_t> axes(rank);
    for (int i = 0; i < rank; ++i) axes[i] = i;
    return op(Op::ReduceSum, {x}, {{"axes", axes}, {"keepdims", int64_t{0}}});
  }
};

ValueId state_named(const ir::Graph& g, const std::string& name) {
  for (ValueId v : g.state)
    if (g.value(v).name == name) return v;
  NAPKIN_INTERNAL_CHECK(false, "loss scaling: no state named {}", name);
  return ir::kNoValue;
}

bool uses_loss_scaling(const ir::Graph& g) { return g.config.precision.policy == ir::PrecisionPolicy::FP16Mixed; }

class LossScaling : public Pass {
 public:
  std::string_view name() const override { return "loss_scaling"; }

  bool run(ir::Graph& g, ir::Diagnostics&) override {
    if (!uses_loss_scaling(g)) return false;
    const std::vector<ir::NodeId> schedule = g.schedule();
    // (ZeRO-3's gathers for the backward may be issued before it: passes/shard_parameters.h.)
    auto first_backward = std::find_if(schedule.begin(), schedule.end(), [&](ir::NodeId id) {
      return g.node(id).phase == ir::Phase::Backward && ir::op_info(g.node(id).op).op_class != ir::OpClass::Collective;
    });
    if (first_backward == schedule.end()) return false;  // nothing to scale: no parameter affects the loss
    // Autodiff builds the seed d(loss) = 1 first (passes/autodiff.cpp, step 4).
    const ir::Node seed = g.node(*first_backward);
    const ValueId loss = g.find_output("loss");
    NAPKIN_INTERNAL_CHECK(seed.op == Op::Constant && seed.attrs.get_double("value") == 1.0 &&
                              g.value(seed.out()).type.rank() == 0 && seed.origin == g.value(loss).producer,
                          "loss scaling expects autodiff's seed first in the backward, found {}", ir::op_name(seed.op));

    const ir::Value loss_value = g.value(loss);
    ValueId scale_state = g.add_state(kScaleState, {DType::F32, {}}, loss_value.loc);
    g.add_state(kGoodStepsState, {DType::I64, {}}, loss_value.loc);

    // S, in place of the seed.
    Emitter e(g);
    e.b.set_phase(ir::Phase::Backward);
    e.b.set_loc(seed.loc);
    e.b.set_origin(seed.origin);
    const ir::LossScaleConfig& ls = g.config.precision.loss_scale;
    ValueId unset = e.op(Op::Equal, {scale_state, e.constant(0, DType::F32)});
    ValueId scale = e.where(unset, e.constant(ls.init_scale, DType::F32), scale_state);
    ValueId seed_value = e.cast(scale, loss_value.type.dtype);
    for (ir::NodeId id : schedule)
      for (ValueId& in : g.node(id).inputs)
        if (in == seed.out()) in = seed_value;
    std::vector<ir::NodeId> prelude = e.made;
    e.made.clear();

    // Unscaled gradients, after the backward; found_inf in the optimizer
    // phase, so that it reads the gradients the optimizer reads: after a
    // step's micro-batches are summed and its ranks' gradients averaged
    // (runtime/gradient_stage.h), an overflow anywhere skips the update on
    // every rank.
    ValueId inverse = e.op(Op::Div, {e.constant(1, DType::F32), scale});
    std::vector<ValueId> unscaled_grads;
    for (auto& [label, v] : g.outputs) {
      if (label.rfind("grad.", 0) != 0) continue;
      DType t = g.value(v).type.dtype;
      ValueId unscaled = e.mul(v, e.cast(inverse, t));
      g.value(unscaled).name = label;
      g.value(v).name.clear();
      v = unscaled;
      unscaled_grads.push_back(unscaled);
    }
    e.b.set_phase(ir::Phase::Optimizer);
    ValueId nonfinite_sum = ir::kNoValue;
    for (ValueId unscaled : unscaled_grads) {
      DType t = g.value(unscaled).type.dtype;
      ValueId probe = e.cast(e.total(e.mul(unscaled, e.constant(0, t))), DType::F32);
      nonfinite_sum = nonfinite_sum == ir::kNoValue ? probe : e.op(Op::Add, {nonfinite_sum, probe});
    }
    NAPKIN_INTERNAL_CHECK(nonfinite_sum != ir::kNoValue, "loss scaling: a backward without gradients");
    // Summed over the ranks (each probes its shard of the gradients under
    // ZeRO-2): a NaN anywhere reaches every rank, so all of them skip.
    nonfinite_sum = e.op(Op::AllReduceSum, {nonfinite_sum});
    ValueId found_inf = e.op(Op::NotEqual, {nonfinite_sum, nonfinite_sum});
    g.outputs.emplace_back(kFoundInfOutput, found_inf);
    g.outputs.emplace_back(kScaleOutput, scale);

    // The prelude goes where the seed was; the rest stays at the end (appended).
    std::vector<ir::NodeId>& s = g.mutable_schedule();
    std::vector<ir::NodeId> reordered;
    for (ir::NodeId id : s) {
      if (std::find(prelude.begin(), prelude.end(), id) != prelude.end()) continue;
      if (id == seed.id) reordered.insert(reordered.end(), prelude.begin(), prelude.end());
      reordered.push_back(id);
    }
    s = reordered;
    return true;
  }
};

class SkipNonfiniteUpdates : public Pass {
 public:
  std::string_view name() const override { return "skip_nonfinite_updates"; }

  bool run(ir::Graph& g, ir::Diagnostics&) override {
    if (!uses_loss_scaling(g)) return false;
    ValueId found_inf = g.find_output(kFoundInfOutput);
    if (found_inf == ir::kNoValue) return false;  // the loss-scaling pass found no backward
    ValueId scale = g.find_output(kScaleOutput);
    ValueId scale_state = state_named(g, kScaleState), good_steps = state_named(g, kGoodStepsState);

    Emitter e(g);
    e.b.set_phase(ir::Phase::Optimizer);
    e.b.set_loc(g.value(scale_state).loc);
    for (ir::Graph::Update& u : g.updates) u.value = e.where(found_inf, u.target, u.value);

    const ir::LossScaleConfig& ls = g.config.precision.loss_scale;
    ValueId zero_steps = e.constant(0, DType::I64);
    ValueId next = e.op(Op::Add, {good_steps, e.constant(1, DType::I64)});
    ValueId grow = e.op(Op::Equal, {next, e.constant(static_cast<double>(ls.growth_interval), DType::I64)});
    ValueId grown = e.mul(scale, e.constant(ls.growth_factor, DType::F32));
    ValueId zero = e.constant(0, DType::F32);
    ValueId grown_finite = e.op(Op::Equal, {e.mul(grown, zero), zero});
    ValueId on_good = e.where(grow, e.where(grown_finite, grown, scale), scale);
    ValueId new_scale = e.where(found_inf, e.mul(scale, e.constant(ls.backoff_factor, DType::F32)), on_good);
    ValueId new_steps = e.where(found_inf, zero_steps, e.where(grow, zero_steps, next));
    g.updates.push_back({scale_state, new_scale});
    g.updates.push_back({good_steps, new_steps});
    return true;
  }
};

}  // namespace

std::unique_ptr<Pass> make_loss_scaling_pass() { return std::make_unique<LossScaling>(); }
std::unique_ptr<Pass> make_skip_nonfinite_updates_pass() { return std::make_unique<SkipNonfiniteUpdates>(); }

}  // namespace napkin::passes
