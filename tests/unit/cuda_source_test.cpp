// codegen/cuda/kernel_source: the CUDA C of every built-in model (small dims,
// each precision the CUDA backend trains in) compiles with NVRTC for sm_90;
// every loop kernel has launches of functions the source defines, with sane
// shapes and its operands' offsets, and Gemm kernels none; the source uses
// no float atomics; the elementwise emitter takes 16-byte vectors exactly
// where the layout allows; plan kernels that differ only in their offsets
// share functions, within the same 16-byte alignment.
// The kernels' numbers are checked by running the source under host
// emulation against the interpreter (tests/support/cuda_emulator.h).
// Built where the CUDA backend (codegen/cuda) is built only with the CUDA toolkit.
#ifdef NAPKIN_HAVE_CUDA

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "codegen/cuda/kernel_source.h"
#include "codegen/plan.h"
#include "support/routing_graph.h"
#include "support/test_models.h"

#include "codegen/cuda/nvrtc_compile.h"

namespace {

using napkin::codegen::Kernel;
using napkin::codegen::KernelKind;
using napkin::codegen::KernelPlan;
using napkin::codegen::Operand;
using napkin::codegen::cuda::CudaSource;
using napkin::codegen::cuda::emit_cuda_source;
using napkin::ir::DType;

// The text of function `name` (from its signature to the next kernel's
// header comment), or "" when the source does not define it.
std::string function_text(const std::string& source, const std::string& name) {
  const std::string signature = ") " + name + "(char* __restrict__ arena, char* __restrict__ scratch, const NAPKIN_OFFSETS(";
  size_t at = source.find(signature);
  if (at == std::string::npos) return "";
  size_t end = source.find("\n// k", at);
  return source.substr(at, end == std::string::npos ? std::string::npos : end - at);
}

// N of function `name`'s `const NAPKIN_OFFSETS(N) off` parameter.
size_t offset_slots(const std::string& function) {
  size_t at = function.find("NAPKIN_OFFSETS(");
  REQUIRE(at != std::string::npos);
  return std::stoul(function.substr(at + std::string("NAPKIN_OFFSETS(").size()));
}

// The byte offsets of every operand of plan kernel k (of every member of a batch).
std::set<int64_t> operand_offsets(const Kernel& k) {
  std::set<int64_t> offsets{k.output.byte_offset};
  for (const napkin::codegen::BatchMember& m : k.batch) {
    for (const Operand& in : m.inputs) offsets.insert(in.byte_offset);
    for (const Operand& out : m.outputs) offsets.insert(out.byte_offset);
  }
  for (const Operand& in : k.inputs) offsets.insert(in.byte_offset);
  if (k.fused)
    for (const Operand& out : k.fused->outputs) offsets.insert(out.byte_offset);
  for (const Operand& out : k.extra_outputs) offsets.insert(out.byte_offset);
  // A packed attention gradient writes dq, dk and dv at their slots of its one output.
  if (k.kind == KernelKind::Attention && k.attention().backward)
    for (const Operand& out : napkin::codegen::attention_gradients(k)) offsets.insert(out.byte_offset);
  return offsets;
}


// The checks every emitted source must pass.
void check_source(const KernelPlan& plan, const CudaSource& src, const std::string& what) {
  INFO(what);
  REQUIRE(src.launches.size() == plan.kernels.size());
  for (size_t i = 0; i < plan.kernels.size(); ++i) {
    const Kernel& k = plan.kernels[i];
    INFO(k.name);
    if (k.kind == KernelKind::Gemm) {
      CHECK(src.launches[i].empty());
      continue;
    }
    REQUIRE_FALSE(src.launches[i].empty());
    for (const auto& l : src.launches[i]) {
      INFO(l.function);
      const std::string function = function_text(src.text, l.function);
      REQUIRE_FALSE(function.empty());
      // The launch passes each operand's offset once: what the function's
      // `off` holds, slot by slot.
      CHECK(offset_slots(function) == l.offsets.size());
      CHECK(std::set<int64_t>(l.offsets.begin(), l.offsets.end()).size() == l.offsets.size());
      const std::set<int64_t> passed(l.offsets.begin(), l.offsets.end()), operands = operand_offsets(k);
      if (k.kind == KernelKind::Classifier)  // x and w (dw) are its GEMMs' operands (cuda_classifier.h), not its launches'
        CHECK(std::includes(operands.begin(), operands.end(), passed.begin(), passed.end()));
      else
        CHECK(passed == operands);
      CHECK(l.grid >= 1);
      CHECK(l.grid < (int64_t{1} << 31));
      CHECK(l.block >= 32);
      CHECK(l.block <= 1024);
      CHECK(l.block % 32 == 0);
      CHECK(l.shared_bytes >= 0);
      CHECK(l.shared_bytes <= 48 * 1024);
    }
  }
  CHECK(src.scratch_bytes >= 0);
  // Determinism: no atomics but the bad-index flag's compare-and-swap.
  CHECK(src.text.find("atomicAdd") == std::string::npos);
  size_t cas = src.text.find("atomicCAS(");
  CHECK(cas != std::string::npos);
  CHECK(src.text.find("atomicCAS(", cas + 1) == std::string::npos);
}

Operand operand(int64_t offset, std::vector<int64_t> sizes, std::vector<int64_t> strides, DType t = DType::F32) {
  Operand o;
  o.dtype = t;
  o.byte_offset = offset;
  o.sizes = std::move(sizes);
  o.strides = std::move(strides);
  return o;
}

// A plan of one add kernel: out[64, 32] = a + b with the given operands.
KernelPlan add_plan(const Operand& a, const Operand& b) {
  KernelPlan plan;
  Kernel k;
  k.op = napkin::ir::Op::Add;
  k.name = "k0_add";
  k.inputs = {a, b};
  k.output = operand(1 << 20, {64, 32}, {32, 1});
  plan.kernels.push_back(k);
  plan.arena_bytes = 2 << 20;
  return plan;
}

}  // namespace

TEST_CASE("cuda source: every model's loop kernels have launches and compile with NVRTC for sm_90") {
  using napkin::ir::PrecisionPolicy;
  for (const auto& model : napkin::testing::model_files()) {
    for (std::optional<PrecisionPolicy> precision : {std::optional<PrecisionPolicy>{}, std::optional{PrecisionPolicy::BF16Mixed}}) {
      std::string what = model.stem().string() + (precision ? " bf16-mixed" : "");
      napkin::ir::Graph g = napkin::testing::compile_small_model(model, precision);
      KernelPlan plan = napkin::codegen::plan_kernels(g);
      CudaSource src = emit_cuda_source(plan, model.stem().string());
      check_source(plan, src, what);
      // As `napkin build --target cuda` compiles it (options, cubin and PTX),
      // without the cache: NVRTC rejecting the source throws with its log.
      napkin::codegen::cuda::NvrtcOptions options;
      options.use_cache = false;
      napkin::codegen::cuda::NvrtcResult r = napkin::codegen::cuda::nvrtc_compile(src.text, model.stem().string(), options);
      CHECK(r.cubin.size() > 0);
      CHECK(r.ptx.find(".target sm_90") != std::string::npos);
    }
  }
}

TEST_CASE("cuda source: the routing kernels (top_k, moe_slots) have launches and compile with NVRTC for sm_90") {
  for (DType dtype : {DType::F32, DType::F64}) {
    const napkin::ir::Graph g = napkin::testing::routing_training_graph(dtype, napkin::ir::PrecisionPolicy::FP32);
    KernelPlan plan = napkin::codegen::plan_kernels(g);
    CudaSource src = emit_cuda_source(plan, "routing");
    check_source(plan, src, "routing");
    CHECK(src.text.find("napkin_top_k_beats(v, c, best_v, best)") != std::string::npos);
    napkin::codegen::cuda::NvrtcOptions options;
    options.use_cache = false;
    CHECK(napkin::codegen::cuda::nvrtc_compile(src.text, "routing", options).cubin.size() > 0);
  }
}

TEST_CASE("cuda source: 16-byte vectors exactly where every operand is contiguous (or broadcast) and aligned") {
  const Operand a = operand(0, {64, 32}, {32, 1});
  const Operand row = operand(16384, {32}, {1});                     // broadcast along rows
  const Operand transposed = operand(16384, {64, 32}, {1, 64});     // a permuted view
  const Operand misaligned = operand(16384 + 4, {64, 32}, {32, 1});  // a view at element 1
  auto vectorized = [](const KernelPlan& plan) {
    CudaSource src = emit_cuda_source(plan, "inline");
    check_source(plan, src, plan.kernels[0].name);
    std::string body = function_text(src.text, "k0_add");
    REQUIRE_FALSE(body.empty());
    return body.find("uint4") != std::string::npos;
  };
  CHECK(vectorized(add_plan(a, a)));
  CHECK(vectorized(add_plan(a, row)));
  CHECK_FALSE(vectorized(add_plan(a, transposed)));
  CHECK_FALSE(vectorized(add_plan(a, misaligned)));
}

TEST_CASE("cuda source: plan kernels that differ only in their operands' offsets share functions") {
  // A GPT's layers are the same kernels at other offsets: doubling the layers
  // adds launches, not functions.
  auto distinct_functions = [](int64_t layers, int64_t& launches) {
    napkin::ir::Diagnostics diag;
    napkin::frontend::LoadOptions options;
    options.dim_overrides = napkin::testing::small_dims().at("gpt");
    options.dim_overrides["layers"] = layers;
    std::optional<napkin::ir::Graph> g = napkin::frontend::load_model_file(napkin::testing::source_path("models/gpt.yaml"), diag, options);
    REQUIRE(g.has_value());
    napkin::passes::run_training_pipeline(*g, diag);
    REQUIRE_FALSE(diag.has_errors());
    KernelPlan plan = napkin::codegen::plan_kernels(*g);
    CudaSource src = emit_cuda_source(plan, "gpt");
    check_source(plan, src, fmt::format("gpt, {} layers", layers));
    std::set<std::string> functions;
    launches = 0;
    for (const auto& kernel_launches : src.launches)
      for (const auto& l : kernel_launches) functions.insert(l.function), ++launches;
    // Every function the source defines is launched.
    size_t defined = 0;
    for (size_t at = src.text.find("extern \"C\" __global__"); at != std::string::npos;
         at = src.text.find("extern \"C\" __global__", at + 1))
      ++defined;
    CHECK(defined == functions.size());
    return functions.size();
  };
  int64_t launches4 = 0, launches8 = 0;
  size_t functions4 = distinct_functions(4, launches4), functions8 = distinct_functions(8, launches8);
  CHECK(launches8 > launches4);
  CHECK(functions8 == functions4);
  CHECK(functions4 * 2 < static_cast<size_t>(launches4));
}

TEST_CASE("cuda source: kernels share a function only if their offsets allow the same 16-byte vector accesses") {
  // Three adds of the same shapes: two at 16-byte aligned offsets, one with
  // an input at an offset that is not (a view starting at element 1).
  KernelPlan plan;
  auto add = [&](int64_t a, int64_t b, int64_t out) {
    Kernel k;
    k.op = napkin::ir::Op::Add;
    k.name = fmt::format("k{}_add", plan.kernels.size());
    k.inputs = {operand(a, {64, 32}, {32, 1}), operand(b, {64, 32}, {32, 1})};
    k.output = operand(out, {64, 32}, {32, 1});
    plan.kernels.push_back(k);
  };
  add(0, 8192, 16384);
  add(32768, 49152, 65536);
  add(32768 + 4, 49152, 65536);
  plan.arena_bytes = 1 << 20;
  CudaSource src = emit_cuda_source(plan, "inline");
  check_source(plan, src, "three adds");
  REQUIRE(src.launches.size() == 3);
  CHECK(src.launches[0][0].function == "k0_add");
  CHECK(src.launches[1][0].function == "k0_add");
  CHECK(src.launches[2][0].function == "k2_add");
  CHECK(src.launches[0][0].offsets == std::vector<int64_t>{0, 8192, 16384});
  CHECK(src.launches[1][0].offsets == std::vector<int64_t>{32768, 49152, 65536});
  CHECK(src.launches[2][0].offsets == std::vector<int64_t>{32768 + 4, 49152, 65536});
  CHECK(function_text(src.text, "k0_add").find("uint4") != std::string::npos);
  CHECK(function_text(src.text, "k2_add").find("uint4") == std::string::npos);
}

#endif  // NAPKIN_HAVE_CUDA
