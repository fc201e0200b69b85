// The CPU backend against the reference interpreter, kernel by kernel: every
// model in models/ at small dims is compiled (LLVM, JIT) and run for one
// training step through the runtime's executor; before each kernel its inputs
// are read from the arena, the interpreter computes the node from exactly
// those inputs, and the kernel's output must agree within the dtype's
// tolerance. Each kernel is checked on its own inputs, so an error is pinned
// to one op instead of smeared over the step.
//
// A fused kernel (a fusion group, ir/fusion_group.h) is checked against the
// interpreter evaluating the group's nodes in order from the kernel's inputs,
// each result rounded to its dtype; every output the kernel stores must agree.
//
// Every model runs twice: in fp32, and under bf16-mixed (bf16 GEMMs with f32
// accumulation, bf16 elementwise chains, casts; passes/mixed_precision).
//
// NAPKIN_NUMERIC_VERBOSE=1 prints the largest error per model.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cstdlib>
#include <iostream>

#include "support/compiled_step.h"
#include "support/test_models.h"

using namespace napkin;

TEST_CASE("numeric: every model's compiled CPU kernels agree with the interpreter, kernel by kernel, fp32 and bf16-mixed") {
  const bool verbose = std::getenv("NAPKIN_NUMERIC_VERBOSE") != nullptr;
  for (ir::PrecisionPolicy policy : {ir::PrecisionPolicy::FP32, ir::PrecisionPolicy::BF16Mixed}) {
    for (const auto& model : napkin::testing::model_files()) {
      const std::string stem = model.stem().string();
      const std::string_view precision = ir::precision_name(policy);
      CAPTURE(stem);
      CAPTURE(precision);
      napkin::testing::CompiledStep step(napkin::testing::compile_small_model(model, policy));
      double worst = 0;
      std::string worst_kernel;
      int fused_kernels = 0, bf16_gemms = 0;
      for (const codegen::Kernel& k : step.plan.kernels) {
        fused_kernels += k.fused.has_value();
        bf16_gemms += k.kind == codegen::KernelKind::Gemm && k.inputs[0].dtype == ir::DType::BF16;
      }
      napkin::testing::check_each_kernel(step, [&](const napkin::testing::KernelOutputCheck& c) {
        INFO(c.kernel->name << " output " << c.output << " at " << c.kernel->where
                            << (c.kernel->kind == codegen::KernelKind::Gemm ? " (GEMM)" : " (loop)") << ", "
                            << ir::dtype_name(c.operand->dtype));
        const double tolerance = napkin::testing::kernel_tolerance(c.precision);
        CHECK(c.error <= tolerance);
        if (tolerance > 0 && c.error / tolerance > worst) worst = c.error / tolerance, worst_kernel = c.kernel->name;
      });
      CHECK(fused_kernels > 0);  // every model has at least its optimizer update fused
      // bf16-mixed runs every contraction of these models as a bf16 GEMM.
      if (policy == ir::PrecisionPolicy::BF16Mixed) CHECK(bf16_gemms > 0);
      else CHECK(bf16_gemms == 0);
      if (verbose)
        std::cout << fmt::format("{:10} {:10} {} kernels ({} fused, {} bf16 GEMMs), worst error {:.3f} of its tolerance ({})\n",
                                 stem, precision, step.plan.kernels.size(), fused_kernels, bf16_gemms, worst, worst_kernel);
    }
  }
}

TEST_CASE("numeric: CPU elementwise kernels reading a transposed operand run in tiles and agree with the interpreter") {
  // Each kernel below reads an operand transposed in its last two dims (stride
  // along the last dim > 1) and is wide enough to be walked in 32 x 32 tiles
  // (codegen/cpu/kernels.cpp nest_tiled); the sizes leave partial tiles at
  // both edges, with and without a leading dim, alone and fused.
  const char* yaml = R"yaml(
model: transposed
inputs: {x: {shape: [70, 131]}, y: {shape: [3, 45, 99]}}
params: {w: {shape: [131, 70], init: normal(1.0)}, v: {shape: [3, 99, 45], init: normal(1.0)}}
forward:
  - a: cast(transpose(x), bf16)
  - b: exp(transpose(y) * 0.1) * v
  - c: cast(a, f32) * w
loss: mean(c * c) + mean(b)
optimizer: sgd(lr=0.1)
)yaml";
  napkin::testing::CompiledStep step(napkin::testing::compile_training(yaml));
  int transposed = 0;
  for (const codegen::Kernel& k : step.plan.kernels)
    for (const codegen::Operand& in : k.inputs)
      transposed += (k.kind == codegen::KernelKind::Elementwise || k.kind == codegen::KernelKind::FusedElementwise) &&
                    in.strides.size() >= 2 && in.strides.back() > 1;
  CHECK(transposed >= 2);
  napkin::testing::check_each_kernel(step, [](const napkin::testing::KernelOutputCheck& c) {
    INFO(c.kernel->name << " at " << c.kernel->where << ", output " << c.output);
    CHECK(c.error <= napkin::testing::kernel_tolerance(c.precision));
  });
}
