// Every model in models/, compiled at small dims through the whole training
// pipeline, passes `napkin check`: each parameter gradient agrees with float64
// central differences, computed in Float64 and in the model's own dtypes.
//
// NAPKIN_NUMERIC_VERBOSE=1 prints each tensor's errors.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "frontend/frontend.h"
#include "interp/gradient_check.h"
#include "passes/pipeline.h"
#include "support/test_models.h"

using namespace napkin;
namespace fs = std::filesystem;


namespace {

struct Policy {
  const char* name;
  std::optional<ir::PrecisionPolicy> policy;  // none: the model file's own
};

// Checks every model under `policy`; returns the worst native error / tolerance.
double check_models(const Policy& policy, int samples, bool verbose) {
  double worst_ratio = 0;
  for (const fs::path& model : napkin::testing::model_files()) {
    const std::string stem = model.stem().string();
    CAPTURE(stem);
    CAPTURE(policy.name);
    ir::Graph g = napkin::testing::compile_small_model(model, policy.policy);
    interp::GradCheckOptions check;
    check.seed = 0;
    check.samples = samples;
    auto start = std::chrono::steady_clock::now();
    interp::GradCheckResult r = interp::check_gradients(g, check);
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    CHECK(std::isfinite(r.loss));
    CHECK(r.tensors.size() == g.params.size());  // every parameter has a gradient
    double worst_f64 = 0, model_ratio = 0;
    for (const interp::TensorCheck& t : r.tensors) {
      CAPTURE(t.name);
      CAPTURE(t.error_f64);
      CAPTURE(t.error_native);
      CAPTURE(t.noise_native);
      CHECK(t.elements_checked > 0);
      CHECK(t.error_f64 <= t.tolerance_f64);
      CHECK(t.error_native <= t.tolerance_native);
      CHECK(t.passed);
      worst_f64 = std::max(worst_f64, t.error_f64);
      model_ratio = std::max(model_ratio, t.error_native / t.tolerance_native);
      if (verbose)
        std::cout << fmt::format("  {:<12} {:<11} {:<24} {:>4} elements  f64 {:8.1e}  native {:8.1e} / {:8.1e}\n", stem,
                                 policy.name, t.name, t.elements_checked, t.error_f64, t.error_native,
                                 t.tolerance_native);
    }
    CHECK(r.passed);
    worst_ratio = std::max(worst_ratio, model_ratio);
    if (verbose)
      std::cout << fmt::format(
          "{:<12} {:<11} {} tensors, max f64 {:8.1e}, native error / tolerance {:5.2f}, loss scale {} ({} skipped), {} "
          "forward evaluations, {:.2f} s\n",
          stem, policy.name, r.tensors.size(), worst_f64, model_ratio, r.loss_scale, r.skipped_steps,
          r.forward_evaluations, seconds);
  }
  return worst_ratio;
}

}  // namespace

TEST_CASE("numeric: every model in models/ passes napkin check at reduced dims") {
  check_models({"as written", std::nullopt}, 6, std::getenv("NAPKIN_NUMERIC_VERBOSE") != nullptr);
}

// The low-precision line is a gate, not a formality: each shipped model in
// each mixed policy passes it, with the margin the tolerance's factor of 10
// promises (the worst error stays well under half its tolerance).
TEST_CASE("numeric: every model in models/ passes napkin check in bf16-mixed and fp16-mixed and fp8-mixed") {
  const bool verbose = std::getenv("NAPKIN_NUMERIC_VERBOSE") != nullptr;
  for (Policy policy : {Policy{"bf16-mixed", ir::PrecisionPolicy::BF16Mixed},
                        Policy{"fp16-mixed", ir::PrecisionPolicy::FP16Mixed},
                        Policy{"fp8-mixed", ir::PrecisionPolicy::FP8Mixed}}) {
    CAPTURE(policy.name);
    CHECK(check_models(policy, 4, verbose) < 0.5);
  }
}
