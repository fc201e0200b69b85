// codegen/cpu/cpu_backend: each distinct loop kernel's code is in the module
// once; kernels that differ only in their operands' byte offsets (a GPT's
// layers) call it with their own (the numeric tests check what they compute).
#include <doctest/doctest.h>

#include "codegen/cpu/cpu_backend.h"
#include "support/test_models.h"

namespace napkin {
namespace {

TEST_CASE("cpu backend: kernels that differ only in their operands' offsets share one function") {
  // Doubling the layers adds kernels, not functions.
  auto bodies = [](int64_t layers, size_t& kernels) {
    ir::Diagnostics diag;
    frontend::LoadOptions options;
    options.dim_overrides = testing::small_dims().at("gpt");
    options.dim_overrides["layers"] = layers;
    std::optional<ir::Graph> g = frontend::load_model_file(testing::source_path("models/gpt.yaml"), diag, options);
    REQUIRE(g.has_value());
    passes::run_training_pipeline(*g, diag);
    REQUIRE_FALSE(diag.has_errors());
    codegen::cpu::CpuModule m = codegen::cpu::emit_module(codegen::plan_kernels(*g), g->name);
    kernels = m.loops.size();
    return m.bodies.size();
  };
  size_t kernels4 = 0, kernels8 = 0;
  const size_t bodies4 = bodies(4, kernels4), bodies8 = bodies(8, kernels8);
  CHECK(kernels8 > kernels4);
  CHECK(bodies8 == bodies4);
  CHECK(bodies4 * 3 < kernels4);
}

}  // namespace
}  // namespace napkin
