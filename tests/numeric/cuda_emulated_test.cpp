// The CUDA backend's kernels against the reference interpreter, kernel by
// kernel, without a GPU: every model in models/ at small dims, fp32 and
// bf16-mixed, has its CUDA C source (codegen/cuda/kernel_source.h) compiled
// as C++ for the host and run on emulated CUDA threads
// (tests/support/cuda_emulator.h): block and warp barriers, shuffles, shared
// memory and the launch shapes the backend chose, several launches and the
// scratch buffer per kernel. Each loop kernel runs from the arena as it is
// just before it (the CPU executor runs the step; matmuls are cuBLASLt's on a
// GPU and oneDNN's here), and its outputs must agree with the interpreter
// within the dtype's tolerance, as the CPU backend's do (compiled_test.cpp).
//
// What this does not check: code that exists only on the device (the
// prelude's __shfl_xor_sync/__uint_as_float branches, NVRTC's code
// generation, the GPU's expf/logf ulps); bench/gpu/verify.py does on a GPU.
//
// NAPKIN_NUMERIC_VERBOSE=1 prints the largest error per model.
// Built where the CUDA backend (codegen/cuda) is built only with the CUDA toolkit.
#ifdef NAPKIN_HAVE_CUDA

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <set>
#include <vector>

#include "codegen/cuda/kernel_source.h"
#include "support/compiled_step.h"
#include "support/cuda_emulator.h"
#include "support/test_models.h"

using namespace napkin;

namespace {

// A plan's CUDA kernels on the host emulator, run as the CUDA engine runs
// them: a plan kernel's launches in order, with their offsets, over the
// arena and one scratch buffer. The scratch is poisoned with NaN bytes
// before each plan kernel, so a launch that reads partials nobody wrote shows
// up as a wrong output.
class EmulatedKernels {
 public:
  explicit EmulatedKernels(const codegen::cuda::CudaSource& source)
      : source_(source),
        gpu_(source.text),
        scratch_bytes_(static_cast<size_t>(std::max<int64_t>(64, (source.scratch_bytes + 63) / 64 * 64))),
        scratch_(static_cast<char*>(std::aligned_alloc(64, scratch_bytes_)), &std::free) {}

  // Returns the number of launches.
  int run(int kernel, char* arena) {
    std::memset(scratch_.get(), 0xFF, scratch_bytes_);
    for (const codegen::cuda::CudaLaunch& l : source_.launches[kernel])
      gpu_.launch(l.function, l.grid, l.block, l.shared_bytes, arena, scratch_.get(), l.offsets);
    return static_cast<int>(source_.launches[kernel].size());
  }
  const long long* bad_index() { return static_cast<long long*>(gpu_.global("napkin_bad_index")); }

 private:
  const codegen::cuda::CudaSource& source_;
  napkin::testing::CudaEmulator gpu_;
  size_t scratch_bytes_;
  std::unique_ptr<char, decltype(&std::free)> scratch_;
};

// One compiled step of model `model`'s loop kernels, emulated, each checked
// against the interpreter; `label` names it on the verbose line.
void check_step_emulated(ir::Graph g, const std::string& model, const std::string& label, bool verbose) {
  napkin::testing::CompiledStep step(std::move(g));
  const codegen::cuda::CudaSource source = codegen::cuda::emit_cuda_source(step.plan, model);
  EmulatedKernels gpu(source);
  int launches = 0;
  double worst = 0;
  std::string worst_kernel;
  napkin::testing::check_each_kernel(
      step,
      [&](const napkin::testing::KernelOutputCheck& c) {
        INFO(c.kernel->name << " output " << c.output << " at " << c.kernel->where
                            << (c.kernel->kind == codegen::KernelKind::Gemm ? " (GEMM)" : " (CUDA, emulated)") << ", "
                            << ir::dtype_name(c.operand->dtype));
        const double tolerance = napkin::testing::kernel_tolerance(c.precision);
        CHECK(c.error <= tolerance);
        if (c.kernel->kind != codegen::KernelKind::Gemm && tolerance > 0 && c.error / tolerance > worst)
          worst = c.error / tolerance, worst_kernel = c.kernel->name;
      },
      [&](int kernel, char* arena) { launches += gpu.run(kernel, arena); });
  // No kernel met an id out of range (the ids are valid): the flag is untouched.
  CHECK(gpu.bad_index()[0] == -1);
  CHECK(launches > 0);
  if (verbose)
    std::cout << fmt::format("{:21} {} CUDA launches emulated, worst error {:.3f} of its tolerance ({})\n", label, launches,
                             worst, worst_kernel);
}

// Every model in `models` (all when empty) under every policy, each loop
// kernel's emulated CUDA launches checked against the interpreter.
void check_emulated(const std::vector<ir::PrecisionPolicy>& policies, const std::set<std::string>& models) {
  const bool verbose = std::getenv("NAPKIN_NUMERIC_VERBOSE") != nullptr;
  for (ir::PrecisionPolicy policy : policies) {
    for (const auto& model : napkin::testing::model_files()) {
      const std::string stem = model.stem().string();
      if (!models.empty() && !models.count(stem)) continue;
      const std::string_view precision = ir::precision_name(policy);
      CAPTURE(stem);
      CAPTURE(precision);
      check_step_emulated(napkin::testing::compile_small_model(model, policy), stem, fmt::format("{} {}", stem, precision),
                          verbose);
    }
  }
}

}  // namespace

TEST_CASE("numeric: every model's CUDA kernels, emulated on the host, agree with the interpreter, fp32 and bf16-mixed") {
  check_emulated({ir::PrecisionPolicy::FP32, ir::PrecisionPolicy::BF16Mixed}, {});
}

// softplus (tests/numeric/softplus.yaml), the op added through the op table
// alone: its CUDA kernels come from the same formula as the CPU's.
TEST_CASE("numeric: emulated CUDA kernels of a softplus model agree with the interpreter, fp32 and bf16-mixed") {
  for (ir::PrecisionPolicy policy : {ir::PrecisionPolicy::FP32, ir::PrecisionPolicy::BF16Mixed}) {
    const std::string_view precision = ir::precision_name(policy);
    CAPTURE(precision);
    check_step_emulated(
        napkin::testing::compile_model_file(napkin::testing::source_path("tests/numeric/softplus.yaml"), {}, policy),
        "softplus_mlp", fmt::format("softplus {}", precision), std::getenv("NAPKIN_NUMERIC_VERBOSE") != nullptr);
  }
}

TEST_CASE("numeric: emulated CUDA kernels under fp16-mixed (loss scaling) and fp8-mixed (E4M3/E5M2 quantization)") {
  // The f16 casts, the loss scale's found-Inf flag and skip-update selects,
  // the amax reductions and the exact fp8 casts (fp8 outputs must match bit
  // for bit: their tolerance is 0).
  check_emulated({ir::PrecisionPolicy::FP16Mixed, ir::PrecisionPolicy::FP8Mixed}, {"mlp", "gpt"});
}

TEST_CASE("numeric: an out-of-range token id in a CUDA kernel is reported through napkin_bad_index, not written") {
  // gpt's embedding reads ids from `tokens`; one of them is made out of range.
  auto model = napkin::testing::model_files();
  auto gpt = std::find_if(model.begin(), model.end(), [](const auto& p) { return p.stem() == "gpt"; });
  REQUIRE(gpt != model.end());
  napkin::testing::CompiledStep step(napkin::testing::compile_small_model(*gpt, ir::PrecisionPolicy::FP32));
  const codegen::cuda::CudaSource source = codegen::cuda::emit_cuda_source(step.plan, "gpt");
  int embedding = -1;
  for (size_t i = 0; i < step.plan.kernels.size() && embedding < 0; ++i)
    if (step.plan.kernels[i].op == ir::Op::Embedding && step.plan.kernels[i].inputs[1].dtype == ir::DType::I32)
      embedding = static_cast<int>(i);
  REQUIRE(embedding >= 0);
  const codegen::Kernel& k = step.plan.kernels[embedding];
  const int64_t vocab = k.inputs[0].sizes[0];
  char* arena = step.ex->arena();
  int32_t* ids = reinterpret_cast<int32_t*>(arena + k.inputs[1].byte_offset);
  ids[3] = static_cast<int32_t>(vocab + 5);
  EmulatedKernels gpu(source);
  gpu.run(embedding, arena);
  const long long* flag = gpu.bad_index();
  CHECK(flag[0] == embedding);
  CHECK(flag[1] == vocab + 5);
  CHECK(flag[2] == vocab);
}

TEST_CASE("numeric: reductions into bf16 and f16, CPU and emulated CUDA kernels, agree with the interpreter") {
  // Reductions over every kind of axis set, with narrow outputs: each output
  // element is reduced at f32 and rounded once, on both backends.
  const char* yaml = R"yaml(
model: narrow_reductions
inputs: {x: {shape: [6, 40, 24]}}
params: {w: {shape: [24], init: normal(1.0)}}
forward:
  - h: cast(x * w, bf16)
  - a: sum(h, axis=1)
  - b: mean(h, axis=-1)
  - c: sum(h, axis=0)
  - d: max(cast(h, f16), axis=[0, 2])
  - t: sum(cast(a, f32)) + sum(cast(b, f32)) + sum(cast(c, f32)) + sum(cast(d, f32))
loss: t * t
optimizer: sgd(lr=0.1)
)yaml";
  auto check = [](const napkin::testing::KernelOutputCheck& c) {
    INFO(c.kernel->name << " at " << c.kernel->where << ", " << ir::dtype_name(c.operand->dtype));
    CHECK(c.error <= napkin::testing::kernel_tolerance(c.precision));
  };
  napkin::testing::CompiledStep cpu(napkin::testing::compile_training(yaml));
  int narrow_reductions = 0;
  for (const codegen::Kernel& k : cpu.plan.kernels)
    narrow_reductions += (k.op == ir::Op::ReduceSum || k.op == ir::Op::ReduceMean || k.op == ir::Op::ReduceMax) &&
                         (k.output.dtype == ir::DType::BF16 || k.output.dtype == ir::DType::F16);
  CHECK(narrow_reductions >= 4);
  napkin::testing::check_each_kernel(cpu, check);

  napkin::testing::CompiledStep cuda(napkin::testing::compile_training(yaml));
  const codegen::cuda::CudaSource source = codegen::cuda::emit_cuda_source(cuda.plan, "narrow_reductions");
  EmulatedKernels gpu(source);
  napkin::testing::check_each_kernel(cuda, check, [&](int kernel, char* arena) { gpu.run(kernel, arena); });
}

TEST_CASE("numeric: emulated CUDA dropout kernels equal the CPU backend's bit for bit, f32 and bf16") {
  // The same Philox words and keep tests on both backends: every output of a
  // kernel with a dropout in it has the same bits (a mask differing in one
  // element would show), in a vectorizable layout (d a multiple of the
  // 16-byte chunk) and one that is not.
  for (const char* d : {"64", "33"}) {
    for (const char* dtype : {"f32", "bf16"}) {
      CAPTURE(d);
      CAPTURE(dtype);
      std::string yaml = fmt::format(R"yaml(
model: dropout_bits
dims: {{batch: 8, d: {0}}}
inputs: {{x: {{shape: [batch, d]}}}}
params: {{w: {{shape: [d], init: normal(1.0)}}}}
forward:
  - h: dropout(cast(x * w, {1}), 0.3)
  - y: cast(dropout(h, 0.6) * h, f32)
loss: mean(y * y)
optimizer: sgd(lr=0.1)
)yaml",
                                     d, dtype);
      napkin::testing::CompiledStep step(napkin::testing::compile_training(yaml));
      const codegen::cuda::CudaSource source = codegen::cuda::emit_cuda_source(step.plan, "dropout_bits");
      EmulatedKernels gpu(source);
      char* emulated = nullptr;
      int compared = 0;
      napkin::testing::check_each_kernel(
          step,
          [&](const napkin::testing::KernelOutputCheck& c) {
            bool has_dropout = c.kernel->op == ir::Op::Dropout;
            if (c.kernel->fused)
              for (const codegen::FusedOp& op : c.kernel->fused->ops) has_dropout = has_dropout || op.op == ir::Op::Dropout;
            if (!has_dropout || c.kernel->kind == codegen::KernelKind::Gemm) return;
            INFO(c.kernel->name << " output " << c.output);
            CHECK(napkin::testing::read_operand(emulated, *c.operand) ==
                  napkin::testing::read_operand(step.ex->arena(), *c.operand));
            ++compared;
          },
          [&](int kernel, char* arena) {
            emulated = arena;
            gpu.run(kernel, arena);
          });
      CHECK(compared >= 3);  // two forward dropouts and the backward ones
    }
  }
}

#endif  // NAPKIN_HAVE_CUDA
