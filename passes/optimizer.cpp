#include "passes/optimizer.h"

#include <fmt/format.h>

#include <cmath>
#include <map>
#include <numbers>
#include <numeric>
#include <unordered_map>

#include "ir/builder.h"
#include "ir/internal_check.h"

namespace napkin::passes {

using ir::DType;
using ir::Op;
using ir::ValueId;

namespace {

// Builds the update nodes. Scalars (constants, casts of scalars) are shared
// across parameters so the graph has one `lr_t`, not one per parameter.
class UpdateBuilder {
 public:
  UpdateBuilder(ir::Graph& g) : g_(g), b_(g) { b_.set_phase(ir::Phase::Optimizer); }

  ir::Builder& builder() { return b_; }

  ValueId constant(double value, DType dtype) {
    auto key = std::make_pair(value, dtype);
    auto it = constants_.find(key);
    if (it != constants_.end()) return it->second;
    return constants_[key] = b_.must(b_.constant(value, dtype));
  }
  // A scalar computed in f32, as `dtype` (one cast per scalar and dtype).
  ValueId as(ValueId scalar, DType dtype) {
    if (g_.value(scalar).type.dtype == dtype) return scalar;
    auto key = std::make_pair(scalar, dtype);
    auto it = casts_.find(key);
    if (it != casts_.end()) return it->second;
    return casts_[key] = op(Op::Cast, {scalar}, {{"dtype", dtype}});
  }
  ValueId op(Op o, std::vector<ValueId> inputs, ir::Attrs attrs = {}) { return b_.must(b_.add(o, std::move(inputs), std::move(attrs))); }
  ValueId add(ValueId a, ValueId c) { return op(Op::Add, {a, c}); }
  ValueId sub(ValueId a, ValueId c) { return op(Op::Sub, {a, c}); }
  ValueId mul(ValueId a, ValueId c) { return op(Op::Mul, {a, c}); }
  ValueId div(ValueId a, ValueId c) { return op(Op::Div, {a, c}); }
  ValueId sqrt(ValueId a) { return op(Op::Sqrt, {a}); }
  // tensor · scalar, the scalar converted to the tensor's dtype.
  ValueId scale(ValueId tensor, ValueId scalar) { return mul(tensor, as(scalar, dtype_of(tensor))); }
  ValueId scale(ValueId tensor, double k) { return mul(tensor, constant(k, dtype_of(tensor))); }
  DType dtype_of(ValueId v) const { return g_.value(v).type.dtype; }

 private:
  ir::Graph& g_;
  ir::Builder b_;
  std::map<std::pair<double, DType>, ValueId> constants_;
  std::map<std::pair<ValueId, DType>, ValueId> casts_;
};

struct Trained {
  ValueId param;
  ValueId grad;
  std::string name;
  ir::SourceLoc loc;
};

class OptimizerPass : public Pass {
 public:
  std::string_view name() const override { return "optimizer"; }

  bool run(ir::Graph& g, ir::Diagnostics&) override {
    // The outputs by label, the first of each (Graph::find_output's), once:
    // a search per param made N params N^2.
    std::unordered_map<std::string, ValueId> output;
    for (const auto& [label, v] : g.outputs) output.emplace(label, v);
    std::vector<Trained> trained;
    for (const ir::Param& p : g.params) {
      const ir::Value& v = g.value(p.value);
      if (auto grad = output.find("grad." + v.name); grad != output.end())
        trained.push_back({p.value, grad->second, v.name, v.loc});
    }
    if (trained.empty()) return false;
    const ir::OptimizerConfig& opt = g.config.optimizer;
    UpdateBuilder u(g);
    u.builder().set_loc(trained.front().loc);

    // t = step + 1, the number of this update.
    ValueId step = g.add_state("optimizer.step", {DType::I64, {}}, {});
    ValueId next_step = u.add(step, u.constant(1, DType::I64));
    g.updates.push_back({step, next_step});
    ValueId t = u.op(Op::Cast, {next_step}, {{"dtype", DType::F32}});
    ValueId lr_t = learning_rate(u, t, opt, g.config.train.steps);
    std::vector<ValueId> grads = clipped_gradients(u, trained, opt.grad_clip);

    // Adam's bias corrections, shared by all parameters.
    ValueId step_size = ir::kNoValue, bc2_sqrt = ir::kNoValue;
    bool adam = opt.kind == ir::OptimizerKind::Adam || opt.kind == ir::OptimizerKind::AdamW;
    if (adam) {
      ValueId one = u.constant(1, DType::F32);
      ValueId bc1 = u.sub(one, u.op(Op::Pow, {u.constant(opt.beta1, DType::F32), t}));
      ValueId bc2 = u.sub(one, u.op(Op::Pow, {u.constant(opt.beta2, DType::F32), t}));
      step_size = u.div(lr_t, bc1);
      bc2_sqrt = u.sqrt(bc2);
    }

    for (size_t i = 0; i < trained.size(); ++i) {
      const Trained& tp = trained[i];
      u.builder().set_loc(tp.loc);
      double wd = opt.weight_decay;
      for (const std::string& pattern : opt.no_decay)
        if (glob_match(pattern, tp.name)) wd = 0;
      ValueId p = tp.param, grad = grads[i];
      DType dt = u.dtype_of(p);
      auto state = [&](const std::string& label) {
        ValueId s = g.add_state(fmt::format("{}.{}", label, tp.name), g.value(p).type, tp.loc);
        g.state_param[s] = tp.param;
        return s;
      };
      auto update = [&](ValueId target, ValueId value) { g.updates.push_back({target, value}); };
      if (opt.kind != ir::OptimizerKind::AdamW && wd > 0) grad = u.add(grad, u.scale(p, wd));
      ValueId new_p = ir::kNoValue;
      switch (opt.kind) {
        case ir::OptimizerKind::SGD:
        case ir::OptimizerKind::Momentum: {
          ValueId direction = grad;
          if (opt.momentum > 0) {
            ValueId buf = state("momentum.buf");
            ValueId new_buf = u.add(u.scale(buf, opt.momentum), grad);
            update(buf, new_buf);
            direction = opt.nesterov ? u.add(grad, u.scale(new_buf, opt.momentum)) : new_buf;
          }
          new_p = u.sub(p, u.scale(direction, lr_t));
          break;
        }
        case ir::OptimizerKind::AdaGrad: {
          ValueId sum_sq = state("adagrad.sum_sq");
          ValueId new_sum = u.add(sum_sq, u.mul(grad, grad));
          update(sum_sq, new_sum);
          ValueId denom = u.add(u.sqrt(new_sum), u.constant(opt.eps, dt));
          new_p = u.sub(p, u.scale(u.div(grad, denom), lr_t));
          break;
        }
        case ir::OptimizerKind::RMSProp: {
          ValueId sq_avg = state("rmsprop.sq_avg");
          ValueId new_avg = u.add(u.scale(sq_avg, opt.alpha), u.scale(u.mul(grad, grad), 1 - opt.alpha));
          update(sq_avg, new_avg);
          ValueId step_dir = u.div(grad, u.add(u.sqrt(new_avg), u.constant(opt.eps, dt)));
          if (opt.momentum > 0) {
            ValueId buf = state("rmsprop.buf");
            step_dir = u.add(u.scale(buf, opt.momentum), step_dir);
            update(buf, step_dir);
          }
          new_p = u.sub(p, u.scale(step_dir, lr_t));
          break;
        }
        case ir::OptimizerKind::Adam:
        case ir::OptimizerKind::AdamW: {
          if (opt.kind == ir::OptimizerKind::AdamW && wd > 0) {
            ValueId keep = u.sub(u.constant(1, DType::F32), u.mul(lr_t, u.constant(wd, DType::F32)));
            p = u.scale(p, keep);
          }
          ValueId m = state("adam.m"), v = state("adam.v");
          ValueId new_m = u.add(u.scale(m, opt.beta1), u.scale(grad, 1 - opt.beta1));
          ValueId new_v = u.add(u.scale(v, opt.beta2), u.scale(u.mul(grad, grad), 1 - opt.beta2));
          update(m, new_m);
          update(v, new_v);
          ValueId denom = u.add(u.div(u.sqrt(new_v), u.as(bc2_sqrt, dt)), u.constant(opt.eps, dt));
          new_p = u.sub(p, u.scale(u.div(new_m, denom), step_size));
          break;
        }
      }
      update(tp.param, new_p);
    }
    return true;
  }

 private:
  static ValueId learning_rate(UpdateBuilder& u, ValueId t, const ir::OptimizerConfig& opt, int64_t steps) {
    auto f32 = [&](double x) { return u.constant(x, DType::F32); };
    ValueId lr = f32(opt.lr);
    double warmup = static_cast<double>(opt.warmup_steps);
    ValueId warm = warmup > 0 ? u.mul(lr, u.div(t, f32(warmup))) : lr;
    if (opt.schedule == "constant")
      return warmup > 0 ? u.op(Op::Minimum, {warm, lr}) : lr;
    NAPKIN_INTERNAL_CHECK(opt.schedule == "cosine", "unknown schedule '{}' passed validation", opt.schedule);
    double decay_steps = std::max(1.0, static_cast<double>(steps) - warmup);
    ValueId progress = u.div(u.sub(t, f32(warmup)), f32(decay_steps));
    progress = u.op(Op::Minimum, {u.op(Op::Maximum, {progress, f32(0)}), f32(1)});
    ValueId cosine = u.op(Op::Cos, {u.mul(progress, f32(std::numbers::pi))});
    ValueId decayed = u.add(f32(opt.min_lr), u.mul(f32(0.5 * (opt.lr - opt.min_lr)), u.add(f32(1), cosine)));
    if (warmup <= 0) return decayed;
    return u.op(Op::Where, {u.op(Op::LessEqual, {t, f32(warmup)}), warm, decayed});
  }

  // Global-norm clipping over all gradients, in f32 for the norm.
  static std::vector<ValueId> clipped_gradients(UpdateBuilder& u, const std::vector<Trained>& trained, double clip) {
    std::vector<ValueId> grads;
    for (const Trained& tp : trained) grads.push_back(tp.grad);
    if (clip <= 0) return grads;
    ValueId total = ir::kNoValue;
    for (ValueId grad : grads) {
      ValueId squares = u.mul(grad, grad);
      int rank = u.builder().graph().value(grad).type.rank();
      std::vector<int64_t> axes(rank);
      std::iota(axes.begin(), axes.end(), 0);
      ValueId sum = rank == 0 ? squares : u.op(Op::ReduceSum, {squares}, {{"axes", axes}, {"keepdims", int64_t{0}}});
      sum = u.as(sum, DType::F32);
      total = total == ir::kNoValue ? sum : u.add(total, sum);
    }
    // Each rank's sum covers its shard of the gradients where the runtime
    // shards them (ZeRO-2); all_reduce_sum makes it the whole (the identity
    // where every rank already holds every gradient).
    total = u.op(Op::AllReduceSum, {total});
    ValueId norm = u.sqrt(total);
    ValueId coef = u.div(u.constant(clip, DType::F32), u.add(norm, u.constant(1e-6, DType::F32)));
    coef = u.op(Op::Minimum, {coef, u.constant(1, DType::F32)});
    for (ValueId& grad : grads) grad = u.scale(grad, coef);
    return grads;
  }
};

}  // namespace

std::unique_ptr<Pass> make_optimizer_pass() { return std::make_unique<OptimizerPass>(); }

}  // namespace napkin::passes
