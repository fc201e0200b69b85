#include "interp/gradient_check.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <optional>
#include <stdexcept>

#include "interp/interpreter.h"
#include "ir/internal_check.h"
#include "runtime/rng.h"

namespace napkin::interp {

namespace {

constexpr double kRuleTolerance = 1e-5;
constexpr double kStep = 1e-4;  // relative finite-difference step
// Steps ten times smaller tried when a step changes a mixture of experts' routing.
constexpr int kRoutingRetries = 4;
// Tolerance in units of rounding noise. The error of a correct graph is of
// the size the noise runs sample (rounding to nearest errs by up to half a
// step, random rounding moves a value by a whole one or not at all): on
// models/ in every policy it stays within 3 noise units (docs/training.md);
// 10 leaves room for a noise estimate from 8 runs that comes out low.
constexpr double kNoiseFactor = 10;

// The five-point stencil's rounding error per unit of rounding noise in L:
// (8·(L₁ − L₋₁) − (L₂ − L₋₂)) / 12h with four independent errors of RMS δ
// has RMS sqrt(8² + 8² + 1 + 1) / 12 · δ / h.
const double kStencilNoise = std::sqrt(130.0) / 12;
constexpr int kLossNoiseRuns = 8;

}  // namespace

double rule_tolerance(double relative_difference_error) {
  return kRuleTolerance + kNoiseFactor * relative_difference_error;
}

double native_tolerance(double relative_noise, double relative_difference_error) {
  return rule_tolerance(relative_difference_error) + kNoiseFactor * relative_noise;
}

double relative_error(double analytic, double numeric, double floor) {
  double scale = std::max({std::fabs(analytic), std::fabs(numeric), floor});
  return scale > 0 ? std::fabs(analytic - numeric) / scale : 0;
}

// (8·(L(+h) − L(−h)) − (L(+2h) − L(−2h))) / 12h: error O(h⁴), so h can be
// large enough (1e-4) that rounding in L stays near 1e-12.
double five_point_derivative(const std::function<double(double)>& loss_at, double h) {
  double near = loss_at(h) - loss_at(-h), far = loss_at(2 * h) - loss_at(-2 * h);
  return (8 * near - far) / (12 * h);
}

ir::Graph forward_phase(const ir::Graph& g) {
  ir::Graph f = g;
  std::erase_if(f.mutable_schedule(), [&](ir::NodeId id) { return f.node(id).phase != ir::Phase::Forward; });
  return f;
}

void run_with_rounding_noise(const ir::Graph& g, const std::map<ir::ValueId, std::vector<double>>& point, int runs,
                             uint64_t seed, const std::function<void(const Interpreter&)>& visit) {
  Interpreter noisy(g, Numerics::Native);
  for (int r = 0; r < runs; ++r) {
    noisy.perturb_roundings(seed, static_cast<uint64_t>(r));
    noisy.set(point);
    noisy.run();
    visit(noisy);
  }
}

namespace {

// Parameters near their init, with noise (see the header).
std::map<ir::ValueId, std::vector<double>> check_point(const ir::Graph& g, uint64_t seed) {
  std::map<ir::ValueId, std::vector<double>> values = initial_values(g, seed);
  for (const ir::Param& p : g.params) {
    double s = p.init.std > 0 ? 0.5 * p.init.std : 0.1;
    runtime::Rng rng(seed ^ 0x9e3779b97f4a7c15ULL, runtime::stream_for_name(g.value(p.value).name));
    for (double& x : values[p.value]) x += s * rng.normal();
  }
  for (auto& [v, data] : random_inputs(g, seed)) values[v] = std::move(data);
  return values;
}

}  // namespace

namespace {

// What is checked of one parameter's gradient: sampled elements and one
// random ±1 direction (none when the elements cover the tensor).
struct Probe {
  const ir::Param* param = nullptr;
  ir::ValueId grad = ir::kNoValue;
  std::vector<int64_t> elements;
  std::vector<double> direction;
  // Σ over the noise runs of (noisy − plain Native)², per element, then for the direction.
  std::vector<double> noise_squares;
};

Probe make_probe(const ir::Graph& g, const ir::Param& p, ir::ValueId grad, const GradCheckOptions& options) {
  Probe probe{&p, grad, {}, {}, {}};
  const ir::Value& value = g.value(p.value);
  const int64_t n = value.type.numel();
  // The elements to check: all of a small tensor, else a seeded sample.
  if (n <= options.samples) {
    probe.elements.resize(n);
    std::iota(probe.elements.begin(), probe.elements.end(), 0);
  } else {
    runtime::Rng pick(options.seed + 1, runtime::stream_for_name(value.name));
    for (int i = 0; i < options.samples; ++i) probe.elements.push_back(static_cast<int64_t>(pick.next_u32() % n));
    // One random ±1 direction over the whole tensor: checks every element at once.
    runtime::Rng signs(options.seed + 2, runtime::stream_for_name(value.name));
    probe.direction.resize(n);
    for (double& d : probe.direction) d = (signs.next_u32() & 1) ? 1.0 : -1.0;
  }
  probe.noise_squares.assign(probe.elements.size() + 1, 0.0);
  return probe;
}

// Dynamic loss scaling (fp16-mixed) starts at a scale that can overflow f16:
// a trainer then skips the step and backs the scale off, and the graph does
// both itself (docs/mixed-precision.md: found_inf keeps every parameter and
// state, the scale takes the backoff). The check's Native gradients are taken
// where a trainer would settle: while the step reports found_inf, its updates
// are applied (they change nothing but the scale) and it runs again. The
// settled state becomes part of `point`, for the other runs.
void settle_loss_scale(const ir::Graph& g, Interpreter& native, std::map<ir::ValueId, std::vector<double>>& point,
                       GradCheckResult& result) {
  constexpr int kMostSkippedSteps = 200;  // a backoff of 0.5 from 65536 reaches 2^-134 (f32's least) by then
  ir::ValueId found_inf = g.find_output("loss_scale.found_inf");  // outputs of passes/loss_scaling
  ir::ValueId scale = g.find_output("loss_scale.scale");
  if (found_inf == ir::kNoValue || scale == ir::kNoValue) return;
  while (native.get(found_inf)[0] != 0 && result.skipped_steps < kMostSkippedSteps) {
    native.apply_updates();
    native.run();
    ++result.skipped_steps;
  }
  result.loss_scale = native.get(scale)[0];
  for (ir::ValueId v : g.state) point[v] = native.get(v);
}

double along(const std::vector<double>& gradient, const std::vector<double>& direction) {
  double sum = 0;
  for (size_t i = 0; i < direction.size(); ++i) sum += gradient[i] * direction[i];
  return sum;
}

}  // namespace

GradCheckResult check_gradients(const ir::Graph& g, const GradCheckOptions& options) {
  ir::ValueId loss = g.find_output("loss");
  NAPKIN_INTERNAL_CHECK(loss != ir::kNoValue, "check_gradients needs a graph with a loss output");
  std::map<ir::ValueId, std::vector<double>> point = check_point(g, options.seed);

  GradCheckResult result;
  std::vector<Probe> probes;
  for (const ir::Param& p : g.params) {
    ir::ValueId grad = g.find_output("grad." + g.value(p.value).name);
    if (grad != ir::kNoValue) probes.push_back(make_probe(g, p, grad, options));
  }

  std::optional<Interpreter> native;
  if (options.native) {
    native.emplace(g, Numerics::Native);
    native->set(point);
    native->run();
    settle_loss_scale(g, *native, point, result);
    run_with_rounding_noise(g, point, options.noise_runs, options.seed ^ 0x6e6f697365ULL, [&](const Interpreter& noisy) {
      for (Probe& probe : probes) {
        const std::vector<double>& plain = native->get(probe.grad);
        const std::vector<double>& moved = noisy.get(probe.grad);
        for (size_t k = 0; k < probe.elements.size(); ++k) {
          double d = moved[probe.elements[k]] - plain[probe.elements[k]];
          probe.noise_squares[k] += d * d;
        }
        if (!probe.direction.empty()) {
          double d = along(moved, probe.direction) - along(plain, probe.direction);
          probe.noise_squares.back() += d * d;
        }
      }
    });
  }

  Interpreter exact(g, Numerics::Float64);
  exact.set(point);
  exact.run();
  result.loss = exact.get(loss)[0];

  ir::Graph forward = forward_phase(g);
  // δ, the RMS of what float64 rounding moves L by at the point: the finite
  // differences' own error is kStencilNoise·δ/h (the header's conditioning).
  double loss_noise = 0;
  {
    double plain = result.loss, squares = 0;
    Interpreter noisy(forward, Numerics::Float64);
    for (int r = 0; r < kLossNoiseRuns; ++r) {
      noisy.perturb_roundings(options.seed ^ 0x6636346e6f697365ULL, static_cast<uint64_t>(r));
      noisy.set(point);
      noisy.run();
      double d = noisy.get(loss)[0] - plain;
      squares += d * d;
      ++result.forward_evaluations;
    }
    loss_noise = std::sqrt(squares / kLossNoiseRuns);
  }
  result.loss_noise = loss_noise;
  Interpreter eval(forward, Numerics::Float64);
  eval.set(point);
  // A mixture of experts' routing (top_k's indices, moe_slots' slots) is
  // piecewise constant: a finite difference whose step moves a token across
  // a tie of two experts measures the jump, not the gradient. The routing at
  // the point is kept; a step that changes it is taken again ten times
  // smaller (the tolerance grows with the smaller step's rounding, judge's h).
  std::vector<ir::ValueId> routing;
  for (ir::NodeId id : forward.schedule()) {
    const ir::Node& n = forward.node(id);
    if (ir::op_info(n.op).op_class != ir::OpClass::Routing) continue;
    for (ir::ValueId out : n.outputs)
      if (!ir::is_floating(forward.value(out).type.dtype)) routing.push_back(out);
  }
  std::vector<std::vector<double>> routing_at_point;
  if (!routing.empty()) {
    eval.run();
    for (ir::ValueId v : routing) routing_at_point.push_back(eval.get(v));
  }
  bool routing_moved = false;
  auto loss_at = [&](ir::ValueId param, const std::vector<double>& data) {
    eval.set(param, data);
    eval.run();
    ++result.forward_evaluations;
    for (size_t r = 0; r < routing.size() && !routing_moved; ++r) routing_moved = eval.get(routing[r]) != routing_at_point[r];
    return eval.get(loss)[0];
  };
  // The derivative of L along `direction` at `base`; `h` becomes the step it took.
  auto derivative = [&](ir::ValueId param, const std::vector<double>& base, const std::vector<double>& direction,
                        double& h) {
    std::vector<double> moved(base.size());
    for (int smaller = 0;; ++smaller, h /= 10) {
      routing_moved = false;
      const double d = five_point_derivative(
          [&](double step) {
            for (size_t i = 0; i < base.size(); ++i) moved[i] = base[i] + step * direction[i];
            return loss_at(param, moved);
          },
          h);
      if (!routing_moved || smaller == kRoutingRetries) return d;
    }
  };

  result.passed = true;
  for (const Probe& probe : probes) {
    const ir::Param& p = *probe.param;
    const ir::Value& value = g.value(p.value);
    TensorCheck check;
    check.name = value.name;
    check.type = value.type;
    const std::vector<double>& analytic = exact.get(probe.grad);
    const std::vector<double>* native_grad = native ? &native->get(probe.grad) : nullptr;
    std::vector<double> base = point.at(p.value);
    const int64_t n = static_cast<int64_t>(base.size());
    double largest = 0, total = 0;
    for (double a : analytic) {
      largest = std::max(largest, std::fabs(a));
      total += std::fabs(a);
    }

    double worst_ratio = -1, worst_ratio_f64 = -1;
    // `k`: the probe's entry (an element, or elements.size() for the
    // direction); `h` the step its finite difference took.
    auto judge = [&](size_t k, double numeric, double analytic_value, double native_value, double floor, double h) {
      double difference_error = kStencilNoise * loss_noise / h;
      double error_f64 = relative_error(analytic_value, numeric, floor);
      double scale_f64 = std::max({std::fabs(analytic_value), std::fabs(numeric), floor});
      double tolerance_f64 = rule_tolerance(scale_f64 > 0 ? difference_error / scale_f64 : 0);
      double ratio_f64 = std::isnan(error_f64) ? INFINITY : error_f64 / tolerance_f64;
      if (ratio_f64 > worst_ratio_f64) {
        worst_ratio_f64 = ratio_f64;
        check.error_f64 = std::isnan(error_f64) ? INFINITY : error_f64;
        check.tolerance_f64 = tolerance_f64;
      }
      if (!native_grad) return;
      double error = relative_error(native_value, numeric, floor);
      double scale = std::max({std::fabs(native_value), std::fabs(numeric), floor});
      double noise = options.noise_runs > 0 ? std::sqrt(probe.noise_squares[k] / options.noise_runs) : 0;
      double relative_noise = scale > 0 ? noise / scale : 0;
      double tolerance = native_tolerance(relative_noise, scale > 0 ? difference_error / scale : 0);
      // NaN errors (an Inf or NaN gradient) count as failing.
      double ratio = std::isnan(error) ? INFINITY : error / tolerance;
      if (ratio > worst_ratio) {
        worst_ratio = ratio;
        check.error_native = error;
        check.tolerance_native = tolerance;
        check.noise_native = relative_noise;
      }
    };
    for (size_t k = 0; k < probe.elements.size(); ++k) {
      int64_t i = probe.elements[k];
      std::vector<double> unit(n, 0.0);
      unit[i] = 1;
      double h = kStep * std::max(1.0, std::fabs(base[i]));
      double numeric = derivative(p.value, base, unit, h);
      judge(k, numeric, analytic[i], native_grad ? (*native_grad)[i] : 0, 1e-3 * largest, h);
      ++check.elements_checked;
    }
    if (!probe.direction.empty()) {
      double max_abs = 0;
      for (double b : base) max_abs = std::max(max_abs, std::fabs(b));
      double h = kStep * std::max(1.0, max_abs);
      double numeric = derivative(p.value, base, probe.direction, h);
      judge(probe.elements.size(), numeric, along(analytic, probe.direction),
            native_grad ? along(*native_grad, probe.direction) : 0, 1e-3 * total, h);
    }
    eval.set(p.value, base);
    check.passed = worst_ratio_f64 <= 1 && (!native_grad || worst_ratio <= 1);
    result.passed = result.passed && check.passed;
    result.tensors.push_back(std::move(check));
  }
  return result;
}

}  // namespace napkin::interp
