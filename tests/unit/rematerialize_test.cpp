// passes/rematerialize: GPT-2's MLP keeps its bf16 GEMM result for gelu's
// gradient instead of the f32 pre-activation, by the pass's byte rule; a
// compiled training step gives the same bits with and without it; values
// whose backward reader is no elementwise kernel, or whose inputs take more
// bytes, stay saved.
#include <doctest/doctest.h>

#include <cstring>
#include <set>
#include <string>

#include "analysis/memory.h"
#include "passes/rematerialize.h"
#include "support/compiled_step.h"
#include "support/test_io.h"
#include "support/test_models.h"

namespace napkin {
namespace {

ir::Graph compile(const std::string& model, bool rematerialize, ir::PrecisionPolicy precision,
                  passes::PipelineResult* result = nullptr, bool epilogues = true) {
  passes::PipelineOptions options;
  options.rematerialize = rematerialize;
  options.matmul_epilogues = epilogues;
  return testing::compile_small_model(testing::source_path("models/" + model + ".yaml"), precision, options, result);
}

int64_t saved_bytes(const ir::Graph& g) {
  return analysis::analyze_memory(g).category_bytes(analysis::MemoryCategory::SavedActivations);
}

TEST_CASE("rematerialize: a bf16-mixed GPT-2 keeps the bf16 GEMM result, not the f32 pre-activation, for gelu's gradient") {
  // GEMM epilogues off: they store the gelu's input in bf16 instead (tests/unit/fuse_gemm_epilogues_test.cpp).
  passes::PipelineResult result;
  const passes::Rematerialized& did = result.rematerialized;
  const ir::Graph before = compile("gpt2-124m", false, ir::PrecisionPolicy::BF16Mixed, nullptr, false);
  const ir::Graph after = compile("gpt2-124m", true, ir::PrecisionPolicy::BF16Mixed, &result, false);
  // gpt2-124m's small dims: batch 2, seq 8, hidden 4·d = 128, 2 layers.
  const int64_t elements = 2 * 8 * 128;
  CHECK(did.values == 2);
  CHECK(did.bytes_before == 2 * elements * 4);  // f32 fc(x) + b, per layer
  CHECK(did.bytes_after == 2 * elements * 2);   // the bf16 GEMM result, per layer
  CHECK(did.flops_added == 2 * elements);       // the bias add again (casts count no FLOPs)
  CHECK(saved_bytes(before) - saved_bytes(after) == did.bytes_before - did.bytes_after);
  int grads = 0;
  for (ir::NodeId id : after.schedule()) {
    const ir::Node& n = after.node(id);
    if (n.op != ir::Op::GeluGrad) continue;
    ++grads;
    // Its pre-activation is made in the backward, in gelu_grad's own kernel,
    // from the bf16 einsum result the forward stored.
    const ir::Node& pre = after.node(after.value(n.in(0)).producer);
    CHECK(pre.phase == ir::Phase::Backward);
    CHECK(pre.origin != ir::kNoNode);
    CHECK(pre.group == n.group);
    CHECK(n.group >= 0);
  }
  CHECK(grads == 2);
}

TEST_CASE("rematerialize: one compiled training step gives the same bits with and without the pass") {
  for (ir::PrecisionPolicy precision : {ir::PrecisionPolicy::BF16Mixed, ir::PrecisionPolicy::FP32}) {
    for (const char* model : {"gpt", "lm-gqa", "gpt2-124m"}) {
      CAPTURE(model);
      CAPTURE(ir::precision_name(precision));
      // GEMM epilogues off on both sides: where the pass leaves a recomputed gelu input, they store it in bf16
      // instead (a numerics change of their own, tests/unit/fuse_gemm_epilogues_test.cpp).
      testing::CompiledStep a(compile(model, false, precision, nullptr, false)),
          b(compile(model, true, precision, nullptr, false));
      CHECK(testing::run_step(a) == testing::run_step(b));
      const int compared = testing::check_same_state_bits(a, b);
      CHECK(compared > 10);
      CHECK(b.plan.arena_bytes <= a.plan.arena_bytes);
    }
  }
}

// The backward's ops in `after` that `before` (the same model without the pass) lacks.
std::multiset<ir::Op> recomputed_ops(const ir::Graph& before, const ir::Graph& after) {
  std::multiset<ir::Op> ops;
  for (ir::NodeId id : after.schedule())
    if (after.node(id).phase == ir::Phase::Backward) ops.insert(after.node(id).op);
  for (ir::NodeId id : before.schedule())
    if (before.node(id).phase == ir::Phase::Backward) {
      auto it = ops.find(before.node(id).op);
      if (it != ops.end()) ops.erase(it);
    }
  return ops;
}

TEST_CASE("rematerialize: a value a GEMM reads in the backward, or one made from wider inputs, stays saved") {
  // h: read by tanh's gradient and by the backward's dv GEMM, which cannot
  // take a recomputation into its kernel. e = exp of a bf16 cast: exp's
  // gradient reads e, and recomputing it would keep the f32 x @ v instead
  // (twice its bytes). Both stay saved. y = h @ v + cast(e, f32), which
  // y * y's gradient reads, is recomputed from the GEMM result and e (saved
  // anyway): as many bytes kept, and the forward's loss kernel stores no y.
  passes::PipelineResult result;
  const passes::Rematerialized& did = result.rematerialized;
  passes::PipelineOptions off;
  off.rematerialize = false;
  const std::string wide = R"yaml(
model: t
inputs: {x: {shape: [16, 32]}}
params: {w: {shape: [32, 32], init: normal(0.1)}, v: {shape: [32, 32], init: normal(0.1)}}
forward:
  - h: tanh(x @ w)
  - e: exp(cast(x @ v, bf16))
  - y: h @ v + cast(e, f32)
loss: mean(y * y)
optimizer: sgd(lr=0.1)
)yaml";
  const ir::Graph g = testing::compile_training(wide, "inline.yaml", {}, &result);
  CHECK(did.values == 1);
  CHECK(did.bytes_before == 16 * 32 * 4);  // y
  CHECK(did.bytes_after == 16 * 32 * 4);   // h @ v
  CHECK(recomputed_ops(testing::compile_training(wide, "inline.yaml", off), g) == std::multiset<ir::Op>{ir::Op::Add, ir::Op::Cast});
  // The same exp of a bf16 GEMM result plus one: recomputed from that result (as many bytes).
  const std::string narrow = R"yaml(
model: t
inputs: {x: {shape: [16, 32]}}
params: {w: {shape: [32, 32], init: normal(0.1)}, v: {shape: [32, 32], init: normal(0.1)}}
forward:
  - e: exp(cast(x, bf16) @ cast(v, bf16) + 1.0)
  - y: x @ w + cast(e, f32)
loss: mean(y)
optimizer: sgd(lr=0.1)
)yaml";
  const ir::Graph h = testing::compile_training(narrow, "inline.yaml", {}, &result);
  CHECK(did.values == 1);
  CHECK(did.bytes_before == 16 * 32 * 2);
  CHECK(did.bytes_after == 16 * 32 * 2);  // the bf16 GEMM result, kept for the backward now
  CHECK(recomputed_ops(testing::compile_training(narrow, "inline.yaml", off), h) ==
        std::multiset<ir::Op>{ir::Op::Add, ir::Op::Exp, ir::Op::Constant});
}

}  // namespace
}  // namespace napkin
