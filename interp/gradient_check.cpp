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

double native_tolerance(ir::DType dtype) {
  // Measured on models/ with margin (docs/check.md): the rounding of every op's
  // result in the dtype accumulates through the backward pass.
  switch (dtype) {
    case ir::DType::F64: return 1e-6;
    case ir::DType::F32: return 1e-3;
    case ir::DType::F16: return 3e-2;
    case ir::DType::BF16: return 1e-1;
    default: return 0.5;  // fp8: a gradient this coarse is only checked for sign and scale
  }
}

// Under a mixed policy a parameter's gradient flows through the policy's low
// dtype (passes/mixed_precision.h): it is judged at that dtype's tolerance;
// under fp8-mixed at fp8's.
static ir::DType narrowest_compute_dtype(const ir::Graph& g, ir::DType param_dtype) {
  switch (g.config.precision.policy) {
    case ir::PrecisionPolicy::FP32: return param_dtype;
    case ir::PrecisionPolicy::FP8Mixed: return ir::DType::F8E4M3;
    default: return ir::low_precision_dtype(g.config.precision.policy);
  }
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

namespace {

constexpr double kRuleTolerance = 1e-5;
constexpr double kStep = 1e-4;  // relative finite-difference step

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

GradCheckResult check_gradients(const ir::Graph& g, const GradCheckOptions& options) {
  ir::ValueId loss = g.find_output("loss");
  NAPKIN_INTERNAL_CHECK(loss != ir::kNoValue, "check_gradients needs a graph with a loss output");
  std::map<ir::ValueId, std::vector<double>> point = check_point(g, options.seed);

  GradCheckResult result;
  Interpreter exact(g, Numerics::Float64);
  exact.set(point);
  exact.run();
  result.loss = exact.get(loss)[0];
  std::optional<Interpreter> native;
  if (options.native) {
    native.emplace(g, Numerics::Native);
    native->set(point);
    native->run();
  }

  ir::Graph forward = forward_phase(g);
  Interpreter eval(forward, Numerics::Float64);
  eval.set(point);
  auto loss_at = [&](ir::ValueId param, const std::vector<double>& data) {
    eval.set(param, data);
    eval.run();
    ++result.forward_evaluations;
    return eval.get(loss)[0];
  };
  // The derivative of L along `direction` at `base`.
  auto derivative = [&](ir::ValueId param, const std::vector<double>& base, const std::vector<double>& direction, double h) {
    std::vector<double> moved(base.size());
    return five_point_derivative(
        [&](double step) {
          for (size_t i = 0; i < base.size(); ++i) moved[i] = base[i] + step * direction[i];
          return loss_at(param, moved);
        },
        h);
  };

  result.passed = true;
  for (const ir::Param& p : g.params) {
    const ir::Value& value = g.value(p.value);
    ir::ValueId grad = g.find_output("grad." + value.name);
    if (grad == ir::kNoValue) continue;
    TensorCheck check;
    check.name = value.name;
    check.type = value.type;
    check.tolerance_f64 = kRuleTolerance;
    check.tolerance_native = native_tolerance(narrowest_compute_dtype(g, value.type.dtype));
    const std::vector<double>& analytic = exact.get(grad);
    const std::vector<double>* native_grad = native ? &native->get(grad) : nullptr;
    std::vector<double> base = point.at(p.value);
    const int64_t n = static_cast<int64_t>(base.size());
    double largest = 0, total = 0;
    for (double a : analytic) {
      largest = std::max(largest, std::fabs(a));
      total += std::fabs(a);
    }

    // The elements to check: all of a small tensor, else a seeded sample.
    std::vector<int64_t> elements;
    if (n <= options.samples) {
      elements.resize(n);
      std::iota(elements.begin(), elements.end(), 0);
    } else {
      runtime::Rng pick(options.seed + 1, runtime::stream_for_name(value.name));
      for (int i = 0; i < options.samples; ++i) elements.push_back(static_cast<int64_t>(pick.next_u32() % n));
    }
    auto judge = [&](double numeric, double analytic_value, double native_value, double floor) {
      check.max_error_f64 = std::max(check.max_error_f64, relative_error(analytic_value, numeric, floor));
      if (native_grad) check.max_error_native = std::max(check.max_error_native, relative_error(native_value, numeric, floor));
    };
    for (int64_t i : elements) {
      std::vector<double> unit(n, 0.0);
      unit[i] = 1;
      double numeric = derivative(p.value, base, unit, kStep * std::max(1.0, std::fabs(base[i])));
      judge(numeric, analytic[i], native_grad ? (*native_grad)[i] : 0, 1e-3 * largest);
      ++check.elements_checked;
    }
    // One random ±1 direction over the whole tensor: checks every element at once.
    if (n > options.samples) {
      runtime::Rng signs(options.seed + 2, runtime::stream_for_name(value.name));
      std::vector<double> direction(n);
      double max_abs = 0;
      for (int64_t i = 0; i < n; ++i) {
        direction[i] = (signs.next_u32() & 1) ? 1.0 : -1.0;
        max_abs = std::max(max_abs, std::fabs(base[i]));
      }
      double numeric = derivative(p.value, base, direction, kStep * std::max(1.0, max_abs));
      double along = 0, along_native = 0;
      for (int64_t i = 0; i < n; ++i) {
        along += analytic[i] * direction[i];
        if (native_grad) along_native += (*native_grad)[i] * direction[i];
      }
      judge(numeric, along, along_native, 1e-3 * total);
    }
    eval.set(p.value, base);
    check.passed = check.max_error_f64 <= check.tolerance_f64 &&
                   (!native_grad || check.max_error_native <= check.tolerance_native);
    result.passed = result.passed && check.passed;
    result.tensors.push_back(std::move(check));
  }
  return result;
}

}  // namespace napkin::interp
