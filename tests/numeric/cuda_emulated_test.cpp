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

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <memory>
#include <map>
#include <set>
#include <vector>

#include "codegen/cuda/kernel_source.h"
#include "codegen/cuda/program_cuda.h"
#include "passes/pipeline.h"
#include "runtime/tensor_element.h"
#include "runtime/gemm.h"
#include "support/compiled_step.h"
#include "support/cuda_emulator.h"
#include "support/routing_graph.h"
#include "support/test_models.h"
#ifdef NAPKIN_HAVE_CUDA_RUNTIME
#include "runtime/cuda/cuda_classifier.h"
#endif

using namespace napkin;

namespace {

// A plan's CUDA kernels on the host emulator, run as the CUDA engine runs
// them: a plan kernel's launches in order, with their offsets, over the
// arena and one scratch buffer. The scratch is poisoned with NaN bytes
// before each plan kernel, so a launch that reads partials nobody wrote shows
// up as a wrong output. A classifier kernel's launches are interleaved with
// its chunk GEMMs as the engine does (runtime/cuda/cuda_classifier.h: the
// same GEMM specs, from the CUDA program description), run here by the CPU
// runtime's Gemm in place of cuBLASLt.
class EmulatedKernels {
 public:
  // `step`: the compiled step `source` was emitted from.
  EmulatedKernels(const codegen::cuda::CudaSource& source, const napkin::testing::CompiledStep& step)
      : source_(source),
        program_(cuda_program(source, step)),
        gpu_(source.text),
        scratch_bytes_(static_cast<size_t>(std::max<int64_t>(64, (source.scratch_bytes + 63) / 64 * 64))),
        scratch_(static_cast<char*>(std::aligned_alloc(64, scratch_bytes_)), &std::free) {}

  // Returns the number of launches.
  int run(int kernel, char* arena) {
    std::memset(scratch_.get(), 0xFF, scratch_bytes_);
    const std::vector<codegen::cuda::CudaLaunch>& launches = source_.launches[kernel];
    auto launch = [&](int j) {
      const codegen::cuda::CudaLaunch& l = launches[static_cast<size_t>(j)];
      gpu_.launch(l.function, l.grid, l.block, l.shared_bytes, arena, scratch_.get(), l.offsets);
    };
    if (program_.kernels[kernel].as<runtime::ClassifierSpec>()) {
      run_classifier(program_.kernels[kernel], arena, launch);
      return static_cast<int>(launches.size());
    }
    for (size_t j = 0; j < launches.size(); ++j) launch(static_cast<int>(j));
    return static_cast<int>(launches.size());
  }
  const long long* bad_index() { return static_cast<long long*>(gpu_.global("napkin_bad_index")); }

 private:
  template <class Launch>
  void run_classifier(const runtime::KernelSpec& k, char* arena, const Launch& launch) {
#ifdef NAPKIN_HAVE_CUDA_RUNTIME
    const runtime::cuda::ClassifierGemms g = runtime::cuda::classifier_gemms(k);
    char* scratch = scratch_.get();
    for (size_t c = 0; c < g.chunks.size(); ++c) {
      const runtime::cuda::ClassifierGemms::Chunk& ch = g.chunks[c];
      gemm(ch.logits, arena, arena, scratch, false);
      launch(static_cast<int>(c));
      if (!std::get<runtime::ClassifierSpec>(k.payload).backward) continue;
      gemm(ch.dw, scratch, arena, arena, false);
      gemm(ch.dx, scratch, arena, g.dx_in_scratch ? scratch : arena, c > 0);
    }
    for (size_t j = g.chunks.size(); j < k.cuda_launches.size(); ++j) launch(static_cast<int>(j));
#else
    (void)arena, (void)launch;
    FAIL("kernel " << k.name << ": a classifier's GEMMs need the CUDA runtime's specs (napkin_runtime_cuda)");
#endif
  }

  // The CUDA program description of the step, as a CUDA trainer parses it.
  static runtime::Program cuda_program(const codegen::cuda::CudaSource& source, const napkin::testing::CompiledStep& step) {
    const std::string json = codegen::cuda::cuda_program_json(
        step.g, step.plan, source, codegen::step_facts(step.g, "h100", "emulated", "cuda"), {"sm_90", false});
    return runtime::parse_program(json.data(), json.size());
  }

  // C (+)= A B of a spec whose operands' offsets are in the buffers a, b, c.
  static void gemm(const runtime::MatmulSpec& s, char* a, char* b, char* c, bool accumulate) {
    runtime::Gemm gm(s.desc, {runtime::gemm_type(s.a_dtype), runtime::gemm_type(s.c_dtype)});
    if (!accumulate) {
      gm.run(a + s.a, b + s.b, c + s.c);
      return;
    }
    const bool f64 = s.c_dtype == runtime::DType::F64;
    REQUIRE((f64 || s.c_dtype == runtime::DType::F32));  // sums are kept wide (cuda_classifier.h)
    const int64_t n = s.desc.m * s.desc.c_m_stride;
    std::vector<double> sum(static_cast<size_t>(n));
    std::vector<char> part(static_cast<size_t>(n * (f64 ? 8 : 4)));
    gm.run(a + s.a, b + s.b, part.data());
    for (int64_t i = 0; i < s.desc.m; ++i)
      for (int64_t j = 0; j < s.desc.n; ++j) {
        const int64_t e = i * s.desc.c_m_stride + j;
        if (f64) reinterpret_cast<double*>(c + s.c)[e] += reinterpret_cast<double*>(part.data())[e];
        else reinterpret_cast<float*>(c + s.c)[e] += reinterpret_cast<float*>(part.data())[e];
      }
  }

  const codegen::cuda::CudaSource& source_;
  const runtime::Program program_;
  napkin::testing::CudaEmulator gpu_;
  size_t scratch_bytes_;
  std::unique_ptr<char, decltype(&std::free)> scratch_;
};

// The step of `yaml` compiled afresh, its loop kernels run on the emulator
// (source named `name`), each output given to `check`: the CUDA half of the
// tests below that first check the same step's CPU kernels.
void check_each_kernel_emulated(const std::string& yaml, const std::string& name,
                                const std::function<void(const napkin::testing::KernelOutputCheck&)>& check) {
  napkin::testing::CompiledStep cuda(napkin::testing::compile_training(yaml));
  const codegen::cuda::CudaSource source = codegen::cuda::emit_cuda_source(cuda.plan, name);
  EmulatedKernels gpu(source, cuda);
  napkin::testing::check_each_kernel(cuda, check, [&](int kernel, char* arena) { gpu.run(kernel, arena); });
}

// One compiled step of model `model`'s loop kernels, emulated, each checked
// against the interpreter; `label` names it on the verbose line.
void check_step_emulated(ir::Graph g, const std::string& model, const std::string& label, bool verbose,
                         const codegen::cuda::CudaSourceOptions& options = {}) {
  napkin::testing::CompiledStep step(std::move(g));
  const codegen::cuda::CudaSource source = codegen::cuda::emit_cuda_source(step.plan, model, options);
  EmulatedKernels gpu(source, step);
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

// rope's CUDA kernel (codegen/cuda/rope.cpp): standalone rotations with
// explicit positions and a strided operand, forward and inverse, and the
// rotations of a Llama's q and k.
TEST_CASE("numeric: emulated CUDA rope kernels agree with the interpreter, fp32 and bf16-mixed") {
  const bool verbose = std::getenv("NAPKIN_NUMERIC_VERBOSE") != nullptr;
  frontend::LoadOptions small;
  small.dim_overrides = {{"seq", 8}, {"vocab", 32}, {"d", 16}, {"hidden", 24}};
  for (ir::PrecisionPolicy policy : {ir::PrecisionPolicy::FP32, ir::PrecisionPolicy::BF16Mixed}) {
    const std::string_view precision = ir::precision_name(policy);
    CAPTURE(precision);
    check_step_emulated(
        napkin::testing::compile_model_file(napkin::testing::source_path("tests/numeric/standalone_rope.yaml"), {}, policy),
        "standalone_rope", fmt::format("standalone rope {}", precision), verbose);
    check_step_emulated(
        napkin::testing::compile_model_file(napkin::testing::source_path("tests/models/llama-rope-op.yaml"), small, policy),
        "llama_rope_op", fmt::format("llama-rope-op {}", precision), verbose);
  }
}

TEST_CASE("numeric: emulated CUDA kernels under fp16-mixed (loss scaling) and fp8-mixed (E4M3/E5M2 quantization)") {
  // The f16 casts, the loss scale's found-Inf flag and skip-update selects,
  // the amax reductions and the exact fp8 casts (fp8 outputs must match bit
  // for bit: their tolerance is 0).
  check_emulated({ir::PrecisionPolicy::FP16Mixed, ir::PrecisionPolicy::FP8Mixed}, {"mlp", "gpt"});
}

TEST_CASE("numeric: the CUDA classifier in many vocabulary chunks, a short last one, emulated, agrees with the interpreter") {
  // 64 rows x 1000 classes in chunks of 128 (7 full, then 104): the running
  // max and sum carried across chunks, targets in every chunk, dw written
  // chunk by chunk and dx summed over chunks (in place for f32, in f32 sums
  // for bf16); the head stored [vocab, d] and [d, vocab].
  for (const char* precision : {"fp32", "bf16-mixed"}) {
    for (const char* head : {"[vocab, d]", "[d, vocab]"}) {
      CAPTURE(precision);
      CAPTURE(head);
      const bool transposed = std::string(head) == "[d, vocab]";
      const std::string yaml = fmt::format(R"yaml(
model: head_chunks
dims: {{batch: 4, seq: 16, d: 32, vocab: 1000}}
inputs:
  tokens:  {{shape: [batch, seq], dtype: i32}}
  targets: {{shape: [batch, seq], dtype: i32}}
params:
  emb:  {{shape: [vocab, d], init: normal(0.5)}}
  head: {{shape: {0}, init: normal(0.5)}}
forward:
  - x: tanh(embedding(emb, tokens))
  - logits: einsum(x, head, "{1}")
loss: cross_entropy(logits, targets)
optimizer: sgd(lr=0.1)
precision: {2}
)yaml",
                                           head, transposed ? "b s d, d v -> b s v" : "b s d, v d -> b s v", precision);
      ir::Graph g = napkin::testing::compile_training(yaml);
      int classifiers = 0;
      for (ir::NodeId id : g.schedule()) classifiers += ir::op_info(g.node(id).op).op_class == ir::OpClass::Classifier;
      REQUIRE(classifiers == 2);  // forward and backward
      codegen::cuda::CudaSourceOptions options;
      options.classifier_logits_bytes = 128 * 64 * 2;  // 128 classes of 64 rows in bf16 (and in f32: the 128 minimum)
      napkin::testing::CompiledStep probe(g);
      const codegen::cuda::CudaSource source = codegen::cuda::emit_cuda_source(probe.plan, "head_chunks", options);
      int chunked = 0;
      for (const codegen::cuda::CudaClassifierLayout& l : source.classifiers)
        if (l.chunks > 0) {
          CHECK(l.chunk == 128);
          CHECK(l.chunks == 8);
          ++chunked;
        }
      CHECK(chunked == 2);
      check_step_emulated(std::move(g), "head_chunks", fmt::format("head_chunks {} {}", precision, head), false, options);
    }
  }
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
  EmulatedKernels gpu(source, step);
  gpu.run(embedding, arena);
  const long long* flag = gpu.bad_index();
  CHECK(flag[0] == embedding);
  CHECK(flag[1] == vocab + 5);
  CHECK(flag[2] == vocab);
}

// The routing kernels (codegen/cuda/routing.cpp) in a routed training step
// (tests/support/routing_graph.h): top_k's thread per row and moe_slots'
// one-thread scan, with the dispatch, expert einsum, combine and top_k's VJP.
TEST_CASE("numeric: emulated CUDA top_k and moe_slots kernels in a routed training step agree with the interpreter") {
  const bool verbose = std::getenv("NAPKIN_NUMERIC_VERBOSE") != nullptr;
  check_step_emulated(napkin::testing::routing_training_graph(ir::DType::F32, ir::PrecisionPolicy::FP32), "routing",
                      "routing fp32", verbose);
  check_step_emulated(napkin::testing::routing_training_graph(ir::DType::F64, ir::PrecisionPolicy::FP32), "routing",
                      "routing f64", verbose);
  check_step_emulated(napkin::testing::routing_training_graph(ir::DType::F32, ir::PrecisionPolicy::BF16Mixed), "routing",
                      "routing bf16-mixed", verbose);
}

TEST_CASE("numeric: an expert index out of range in the CUDA moe_slots kernel is reported through napkin_bad_index, nothing written") {
  napkin::testing::CompiledStep step(napkin::testing::routing_training_graph(ir::DType::F32, ir::PrecisionPolicy::FP32));
  const codegen::cuda::CudaSource source = codegen::cuda::emit_cuda_source(step.plan, "routing");
  int slots = -1;
  for (size_t i = 0; i < step.plan.kernels.size() && slots < 0; ++i)
    if (step.plan.kernels[i].kind == codegen::KernelKind::MoeSlots) slots = static_cast<int>(i);
  REQUIRE(slots >= 0);
  const codegen::Kernel& k = step.plan.kernels[static_cast<size_t>(slots)];
  const int64_t experts = k.moe_slots().experts;
  char* arena = step.ex->arena();
  reinterpret_cast<int32_t*>(arena + k.inputs[0].byte_offset)[5] = static_cast<int32_t>(experts + 2);
  int32_t* pos = reinterpret_cast<int32_t*>(arena + k.output.byte_offset);
  std::fill(pos, pos + k.output.numel(), 77);
  EmulatedKernels gpu(source, step);
  gpu.run(slots, arena);
  const long long* flag = gpu.bad_index();
  CHECK(flag[0] == slots);
  CHECK(flag[1] == experts + 2);
  CHECK(flag[2] == experts);
  CHECK(std::count(pos, pos + k.output.numel(), 77) == k.output.numel());
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

  check_each_kernel_emulated(yaml, "narrow_reductions", check);
}

TEST_CASE("numeric: fused reductions (an elementwise prologue), CPU and emulated CUDA kernels, agree with the interpreter") {
  // Every reduction of an elementwise chain nothing else reads becomes one
  // kernel (passes/fuse_elementwise.h): over the middle, inner, outer and
  // every axis, keepdims, sum, mean, max and min, inputs broadcast into the
  // prologue, fp32 and bf16-mixed; and gradient clipping's squares.
  for (const char* precision : {"fp32", "bf16-mixed"}) {
    CAPTURE(precision);
    const std::string yaml = fmt::format(R"yaml(
model: fused_reductions
inputs: {{x: {{shape: [6, 40, 24]}}, b: {{shape: [24]}}}}
params: {{w: {{shape: [24], init: normal(1.0)}}, v: {{shape: [24, 24], init: normal(0.2)}}}}
forward:
  - h: x @ v
  - a: sum(exp(x) - b, axis=1)
  - c: mean(tanh(x + b), axis=-1)
  - d: max(x * b, axis=[0, 2])
  - e: sum(h * h)
  - f: min(x - b, axis=0, keepdims=true)
  - t: (sum(a) + sum(c) + sum(d) + sum(f)) * e + sum(h * w)
loss: t * 0.001
optimizer: adamw(lr=0.1, grad_clip=1.0)
precision: {}
)yaml",
                                         precision);
    auto check = [](const napkin::testing::KernelOutputCheck& c) {
      INFO(c.kernel->name << " at " << c.kernel->where << ", " << ir::dtype_name(c.operand->dtype));
      CHECK(c.error <= napkin::testing::kernel_tolerance(c.precision));
    };
    napkin::testing::CompiledStep cpu(napkin::testing::compile_training(yaml));
    int fused = 0;
    for (const codegen::Kernel& k : cpu.plan.kernels) fused += k.kind == codegen::KernelKind::Reduction && k.fused;
    // a, c, d, f (their prologues read only data: the backward needs none of
    // them), e (the backward needs h, not h * h) and the clip's squares of w
    // and v; a prologue the backward reads (exp(h) for its gradient) is stored.
    CHECK(fused >= 7);
    napkin::testing::check_each_kernel(cpu, check);

    check_each_kernel_emulated(yaml, "fused_reductions", check);
  }
}

namespace {

// Elementwise chains whose results are stored (a matmul reads them) and
// reduced too, each by one kernel that stores and reduces (passes/
// fuse_elementwise.h): over the leading dims (a bias gradient: dim 0 summed,
// split into parts combined afterwards; 185 rows do not divide evenly),
// the last axis, the middle axis and every axis, and a sum of an input the
// kernel loads anyway (s5: a GEMM result tanh's kernel reads). The backward adds
// bias-gradient sums of its own.
std::string reductions_with_stores_yaml(const char* precision) {
  return fmt::format(R"yaml(
model: reductions_with_stores
inputs: {{x: {{shape: [37, 5, 24]}}, b: {{shape: [24]}}}}
params: {{w: {{shape: [24], init: normal(1.0)}}, c: {{shape: [24], init: normal(0.5)}}, v: {{shape: [24, 24], init: normal(0.2)}}}}
forward:
  - h1: tanh(x * w + c)
  - s1: sum(h1, axis=[0, 1])
  - h2: exp(x * 0.1 - b) * w
  - s2: mean(h2, axis=-1)
  - h3: x * w - c
  - s3: max(h3, axis=1)
  - h4: sigmoid(x + c)
  - s4: min(h4, keepdims=true)
  - m5: x @ v
  - h5: tanh(m5)
  - s5: mean(m5, axis=[0, 1])
  - y: h1 @ v + h2 @ v + h3 @ v + h4 @ v + h5 @ v
  - t: sum(y * y) * 0.001 + sum(s1 * w) + sum(s2) + sum(s3 * c) + sum(s4) + sum(s5 * s5)
loss: t
optimizer: adamw(lr=0.1, grad_clip=1.0)
precision: {}
)yaml",
                     precision);
}

int reductions_storing(const codegen::KernelPlan& plan) {
  int n = 0;
  for (const codegen::Kernel& k : plan.kernels)
    n += k.kind == codegen::KernelKind::Reduction && k.fused && k.fused->outputs.size() > 1;
  return n;
}

}  // namespace

TEST_CASE("numeric: fused reductions that also store prologue results, CPU and emulated CUDA kernels, agree with the interpreter") {
  for (const char* precision : {"fp32", "bf16-mixed"}) {
    CAPTURE(precision);
    const std::string yaml = reductions_with_stores_yaml(precision);
    auto check = [](const napkin::testing::KernelOutputCheck& c) {
      INFO(c.kernel->name << " at " << c.kernel->where << ", output " << c.output << ", " << ir::dtype_name(c.operand->dtype));
      CHECK(c.error <= napkin::testing::kernel_tolerance(c.precision));
    };
    napkin::testing::CompiledStep cpu(napkin::testing::compile_training(yaml));
    // s1..s5 in the forward, and the backward's sums over rows of gradients it also stores.
    CHECK(reductions_storing(cpu.plan) >= 6);
    int siblings = 0;  // reductions of a kernel input rather than of a member's result
    for (const codegen::Kernel& k : cpu.plan.kernels)
      siblings += k.kind == codegen::KernelKind::Reduction && k.fused && k.fused->ops.back().args[0].input;
    CHECK(siblings >= 1);
    napkin::testing::check_each_kernel(cpu, check);

    check_each_kernel_emulated(yaml, "reductions_with_stores", check);
  }
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
      EmulatedKernels gpu(source, step);
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
      // The forward's kernel and the backward's, which recomputes h and the
      // second mask from x (passes/rematerialize) and applies both masks' gradients.
      CHECK(compared >= 2);
    }
  }
}

#endif  // NAPKIN_HAVE_CUDA

TEST_CASE("numeric: the inference program's kernels (prefill, KV-cache decode), CPU and emulated CUDA, agree with the interpreter") {
  // gpt at odd sizes (3 heads of 7, a context of 11), and a model whose
  // rope the cached attention applies (tests/e2e/data/rope.yaml: grouped
  // heads), fp32 and bf16-mixed.
  const std::pair<const char*, std::map<std::string, int64_t>> models[] = {
      {"models/gpt.yaml", {{"batch", 2}, {"seq", 11}, {"d", 21}, {"heads", 3}, {"layers", 2}}},
      {"tests/e2e/data/rope.yaml", {{"batch", 2}, {"seq", 11}, {"vocab", 40}}}};
  for (const auto& model : models) {
    for (ir::PrecisionPolicy policy : {ir::PrecisionPolicy::FP32, ir::PrecisionPolicy::BF16Mixed}) {
      CAPTURE(model.first);
      CAPTURE(static_cast<int>(policy));
      ir::Diagnostics diag;
      frontend::LoadOptions options;
      options.dim_overrides = model.second;
      std::optional<ir::Graph> g = frontend::load_model_file(napkin::testing::source_path(model.first), diag, options);
      REQUIRE(g.has_value());
      g->config.precision.policy = policy;
      REQUIRE(passes::run_inference_pipeline(*g, diag));
      for (bool emulated : {false, true}) {
        CAPTURE(emulated);
        napkin::testing::CompiledStep step(*g);
        // The prefill over positions 0..10, then a decode step at position 4
        // (its cache rows past 4 hold the prefill's, which it must not read).
        auto put = [&](const char* name, int64_t i, double v) {
          const runtime::TensorSpec* t = step.program.find(name);
          REQUIRE(t != nullptr);
          runtime::write_element(step.ex->arena() + t->offset, t->dtype, i, v);
        };
        for (int64_t i = 0; i < 11; ++i) put("prefill.positions", i, static_cast<double>(i));
        put("decode.positions", 0, 4);
        const codegen::cuda::CudaSource source = codegen::cuda::emit_cuda_source(step.plan, "inference");
        EmulatedKernels gpu(source, step);
        int cached = 0;
        napkin::testing::check_each_kernel(
            step,
            [&](const napkin::testing::KernelOutputCheck& c) {
              INFO(c.kernel->name << " at " << c.kernel->where << ", " << ir::dtype_name(c.operand->dtype));
              CHECK(c.error <= napkin::testing::kernel_tolerance(c.precision));
              cached += c.kernel->kind == codegen::KernelKind::CachedAttention;
            },
            emulated ? napkin::testing::LoopKernelRunner([&](int kernel, char* arena) { gpu.run(kernel, arena); })
                     : napkin::testing::LoopKernelRunner());
        CHECK(cached == (std::string(model.first) == "models/gpt.yaml" ? 4 : 2));  // layers times prefill and decode
        CHECK(gpu.bad_index()[0] == -1);
      }
    }
  }
}

