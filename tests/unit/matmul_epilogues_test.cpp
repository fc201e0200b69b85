// passes/matmul_epilogues (and, under the same option, fuse_gemm_epilogues):
// under bf16-mixed every weight gradient leaves its GEMM in f32 (no cast
// kernel after it; each layernorm's input gradient is read in bf16 by the
// norm's gradient, sink_casts), the forward's bias and
// residual adds after a GEMM become its epilogue, and a compiled step's loss
// and update agree with the ones that round those results to bf16 first
// within bf16's precision.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "frontend/frontend.h"
#include "passes/pipeline.h"
#include "runtime/tensor_element.h"
#include "support/compiled_step.h"
#include "support/test_models.h"

namespace napkin {
namespace {

// models/<model>.yaml at its small dims under bf16-mixed, matmul_epilogues on or off.
ir::Graph compile(const std::string& model, bool epilogues) {
  passes::PipelineOptions options;
  options.matmul_epilogues = epilogues;
  return testing::compile_small_model(testing::source_path("models/" + model + ".yaml"), ir::PrecisionPolicy::BF16Mixed,
                                      options);
}

bool is_contraction(ir::Op op) { return op == ir::Op::MatMul || op == ir::Op::Einsum; }

// Casts to f32 of a contraction's result that are kernels of their own (in no fusion group).
int widened_contractions(const ir::Graph& g, ir::Phase phase) {
  int n = 0;
  for (ir::NodeId id : g.schedule()) {
    const ir::Node& c = g.node(id);
    if (c.op != ir::Op::Cast || c.phase != phase || c.group >= 0 || g.value(c.out()).type.dtype != ir::DType::F32) continue;
    const ir::NodeId p = g.value(c.in(0)).producer;
    n += p != ir::kNoNode && is_contraction(g.node(p).op);
  }
  return n;
}

TEST_CASE("matmul_epilogues: a bf16-mixed GPT-2's weight gradients leave the GEMM in f32") {
  const ir::Graph before = compile("gpt2-124m", false), after = compile("gpt2-124m", true);
  CHECK(widened_contractions(before, ir::Phase::Backward) > 0);
  CHECK(widened_contractions(after, ir::Phase::Backward) == 0);
  // The forward's promotions fuse into the bias adds; where the add is a GEMM
  // epilogue (passes/fuse_gemm_epilogues.h) the GEMM accumulates into f32
  // and the promotion goes: in GPT-2 every one (qkv, proj, fc and fc_proj).
  auto fused_promotions = [](const ir::Graph& g) {
    int n = 0;
    for (ir::NodeId id : g.schedule()) {
      const ir::Node& c = g.node(id);
      n += c.op == ir::Op::Cast && c.phase == ir::Phase::Forward && c.group >= 0 &&
           g.value(c.out()).type.dtype == ir::DType::F32;
    }
    return n;
  };
  CHECK(fused_promotions(before) > 0);
  CHECK(fused_promotions(after) == 0);
  int f32_weight_grads = 0;
  for (const auto& [label, v] : after.outputs) {
    if (label.rfind("grad.", 0) != 0 || label.size() < 2 || label.substr(label.size() - 2) != "_w") continue;
    const ir::NodeId p = after.value(v).producer;
    REQUIRE(p != ir::kNoNode);
    if (!is_contraction(after.node(p).op)) continue;  // the tied embedding's gradient is a sum
    CHECK(after.value(v).type.dtype == ir::DType::F32);
    CHECK(after.node(p).attrs.get_dtype("dtype") == ir::DType::F32);
    ++f32_weight_grads;
  }
  CHECK(f32_weight_grads == 8);  // attn, proj, fc, fc_proj of 2 layers
}

TEST_CASE("matmul_epilogues: one compiled step's loss is the same and its update within bf16 precision of the rounded one") {
  testing::CompiledStep a(compile("gpt2-124m", false)), b(compile("gpt2-124m", true));
  CHECK(b.plan.kernels.size() < a.plan.kernels.size());
  // The forward's epilogues add the bias and residual to unrounded sums: the loss moves by bf16 rounding.
  const double la = testing::run_step(a), lb = testing::run_step(b);
  CHECK(std::fabs(la - lb) <= 2e-3 * std::fabs(la));
  CHECK(la != lb);
  int compared = 0;
  for (const codegen::PlannedTensor& ta : a.plan.tensors) {
    if (ta.role != codegen::TensorRole::State || ta.name.find("adam.m.") != 0) continue;
    const codegen::PlannedTensor* tb = nullptr;
    for (const codegen::PlannedTensor& t : b.plan.tensors) tb = t.name == ta.name ? &t : tb;
    REQUIRE(tb != nullptr);
    INFO(ta.name);
    // The first moment after one step is (1 - beta1) times the clipped
    // gradient: the two differ by the bf16 rounding of the gradient.
    double scale = 0, diff = 0;
    const runtime::DType dtype = runtime::parse_dtype(ir::dtype_name(ta.dtype));
    for (int64_t e = 0; e < ta.bytes / 4; ++e) {
      const double x = runtime::read_element(a.ex->arena() + ta.byte_offset, dtype, e);
      const double y = runtime::read_element(b.ex->arena() + tb->byte_offset, dtype, e);
      scale = std::max(scale, std::fabs(x));
      diff = std::max(diff, std::fabs(x - y));
    }
    CHECK(diff <= scale * 1e-2);
    ++compared;
  }
  CHECK(compared > 10);
}

}  // namespace
}  // namespace napkin
