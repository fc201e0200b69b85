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
#include <string>
#include <vector>

#include <fmt/format.h>

#include "frontend/frontend.h"
#include "interp/gradient_check.h"
#include "passes/pipeline.h"
#include "support/test_models.h"

using namespace napkin;
namespace fs = std::filesystem;


TEST_CASE("numeric: every model in models/ passes napkin check at reduced dims") {
  const bool verbose = std::getenv("NAPKIN_NUMERIC_VERBOSE") != nullptr;
  for (const fs::path& model : napkin::testing::model_files()) {
    const std::string stem = model.stem().string();
    CAPTURE(stem);
    ir::Graph built = napkin::testing::compile_small_model(model);
    std::optional<ir::Graph> g = std::move(built);
    interp::GradCheckOptions check;
    check.seed = 0;
    check.samples = 6;
    auto start = std::chrono::steady_clock::now();
    interp::GradCheckResult r = interp::check_gradients(*g, check);
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    CHECK(std::isfinite(r.loss));
    CHECK(r.tensors.size() == g->params.size());  // every parameter has a gradient
    double worst_f64 = 0, worst_native = 0;
    for (const interp::TensorCheck& t : r.tensors) {
      CAPTURE(t.name);
      CAPTURE(t.max_error_f64);
      CAPTURE(t.max_error_native);
      CHECK(t.elements_checked > 0);
      CHECK(t.max_error_f64 <= t.tolerance_f64);
      CHECK(t.max_error_native <= t.tolerance_native);
      CHECK(t.passed);
      worst_f64 = std::max(worst_f64, t.max_error_f64);
      worst_native = std::max(worst_native, t.max_error_native);
      if (verbose)
        std::cout << fmt::format("  {:<12} {:<24} {:>4} elements  f64 {:8.1e}  native {:8.1e}\n", stem, t.name,
                                 t.elements_checked, t.max_error_f64, t.max_error_native);
    }
    CHECK(r.passed);
    if (verbose)
      std::cout << fmt::format("{:<14} {} tensors, max f64 {:8.1e}, max native {:8.1e}, {} forward evaluations, {:.2f} s\n",
                               stem, r.tensors.size(), worst_f64, worst_native, r.forward_evaluations, seconds);
  }
}
