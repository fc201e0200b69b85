// passes/sink_casts: under bf16-mixed a GPT-2's q, k, v (the qkv matmul has
// a bias, so its result is f32) are views of one bf16 qkv (no cast reads a view), the attention gradient is concatenated in
// bf16 and handed to the qkv matmuls without a round trip through f32, and a
// compiled training step gives the same bits with and without the pass; a
// layernorm or rmsnorm read only by a cast stores in the cast's dtype.
#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "frontend/frontend.h"
#include "passes/pipeline.h"
#include "report/fusion_report.h"
#include "support/test_io.h"
#include "support/compiled_step.h"
#include "support/test_models.h"

namespace napkin {
namespace {

// models/<model>.yaml at its small dims under bf16-mixed, sink_casts on or off.
ir::Graph compile(const std::string& model, bool sink, bool epilogues = true) {
  passes::PipelineOptions options;
  options.sink_casts = sink;
  options.matmul_epilogues = epilogues;
  return testing::compile_small_model(testing::source_path("models/" + model + ".yaml"), ir::PrecisionPolicy::BF16Mixed,
                                      options);
}

bool is_view(const ir::Graph& g, ir::ValueId v) { return g.value(v).is_view(); }

TEST_CASE("sink_casts: a bf16-mixed GPT-2's q, k, v are views of one bf16 qkv, its gradient a bf16 concat") {
  const ir::Graph before = compile("gpt2-124m", false), after = compile("gpt2-124m", true);
  auto casts_of_views = [](const ir::Graph& g) {
    int n = 0;
    for (ir::NodeId id : g.schedule())
      n += g.node(id).op == ir::Op::Cast && is_view(g, g.node(id).in(0));
    return n;
  };
  CHECK(casts_of_views(before) > 0);
  CHECK(casts_of_views(after) == 0);
  int attentions = 0;
  for (ir::NodeId id : after.schedule()) {
    const ir::Node& n = after.node(id);
    if (n.op == ir::Op::Attention) {
      ++attentions;
      // q, k and v: views of one buffer, the bf16 cast of the qkv matmul's result.
      const ir::ValueId storage = after.value(n.in(0)).storage;
      CHECK(after.value(storage).type.dtype == ir::DType::BF16);
      CHECK(after.value(n.in(1)).storage == storage);
      CHECK(after.value(n.in(2)).storage == storage);
    }
    if (n.op == ir::Op::Concat && n.phase == ir::Phase::Backward) {
      CHECK(after.value(n.out()).type.dtype == ir::DType::BF16);
    }
  }
  CHECK(attentions == 2);
  // Every layernorm feeds a bf16 matmul: it stores bf16 itself, and no cast reads a norm.
  int norms = 0;
  for (ir::NodeId id : after.schedule()) {
    const ir::Node& n = after.node(id);
    if (n.op == ir::Op::LayerNorm) {
      ++norms;
      CHECK(after.value(n.out()).type.dtype == ir::DType::BF16);
    }
    if (n.op == ir::Op::Cast) {
      const ir::NodeId p = after.value(n.in(0)).producer;
      CHECK_FALSE((p != ir::kNoNode && after.node(p).op == ir::Op::LayerNorm));
    }
  }
  CHECK(norms == 5);  // two per layer and the final one
  // No cast widens a bf16 value whose f32 copy is only narrowed back.
  for (ir::NodeId id : after.schedule()) {
    const ir::Node& n = after.node(id);
    if (n.op != ir::Op::Cast) continue;
    const ir::NodeId p = after.value(after.value(n.in(0)).storage).producer;
    // (A narrowing then a widening is not one: the stored bf16 gelu input a gradient reads, GEMM epilogues.)
    const bool round_trip = p != ir::kNoNode && after.node(p).op == ir::Op::Cast &&
                            after.value(after.node(p).in(0)).type.dtype == after.value(n.out()).type.dtype &&
                            ir::dtype_size(after.value(after.node(p).in(0)).type.dtype) <
                                ir::dtype_size(after.value(after.node(p).out()).type.dtype);
    CHECK_FALSE(round_trip);
  }
}

TEST_CASE("sink_casts: one compiled bf16-mixed training step gives the same bits with and without the pass") {
  for (const char* model : {"gpt", "lm-gqa", "gpt2-124m"}) {
    CAPTURE(model);
    // Against the policy's casts (no GEMM stores f32 for a widening cast it no longer finds: matmul_epilogues off).
    testing::CompiledStep a(compile(model, false, false)), b(compile(model, true, false));
    CHECK(b.plan.kernels.size() < a.plan.kernels.size());  // the norms store the matmul inputs' casts
    CHECK(testing::run_step(a) == testing::run_step(b));
    const int compared = testing::check_same_state_bits(a, b);
    CHECK(compared > 10);
  }
}

}  // namespace
}  // namespace napkin

namespace napkin {
namespace {

TEST_CASE("sink_casts: the report counts the rewrites by rule and compares the step with the policy's casts") {
  const testing::CommandResult r =
      testing::run_in_source_tree(std::string(NAPKIN_BINARY) + " report models/gpt2-124m.yaml --device h100 --json");
  REQUIRE(r.status == 0);
  const nlohmann::json casts = nlohmann::json::parse(r.out).at("fusion").at("casts");
  REQUIRE(casts.is_object());
  // One of each per layer (12): q, k, v from one bf16 qkv; dq, dk, dv
  // concatenated in bf16; that concat handed to the matmuls without a round
  // trip. Every layernorm (2 per layer and the final one) stores bf16, and
  // every layernorm gradient reads its bf16 dy (the input gradient of the
  // matmul after the norm, the classifier's dx for the last); the weight
  // gradients (4 per layer) leave their GEMMs in f32.
  CHECK(casts.at("cast_before_views") == 12);
  CHECK(casts.at("cast_after_concat") == 12);
  CHECK(casts.at("round_trips_removed") == 12);
  CHECK(casts.at("norms_storing_cast") == 25);
  CHECK(casts.at("norm_grads_widening") == 25);
  CHECK(casts.at("gemms_storing_f32") == 48);
  CHECK(casts.at("reductions_widening").get<int>() > 0);
  // The policy's step is the same model compiled with both passes off.
  ir::Diagnostics diag;
  std::optional<ir::Graph> g = frontend::load_model_file(testing::source_path("models/gpt2-124m.yaml"), diag, {});
  REQUIRE(g.has_value());
  passes::PipelineOptions off;
  off.sink_casts = false;
  off.matmul_epilogues = false;
  passes::run_training_pipeline(*g, diag, off);
  const report::FusionSummary policy = report::summarize_fusion(*g);
  CHECK(casts.at("bytes_policy").get<double>() == policy.bytes_after);
  CHECK(casts.at("kernels_policy") == policy.kernels_after[0] + policy.kernels_after[1] + policy.kernels_after[2]);
  CHECK(casts.at("bytes_placed").get<double>() < 0.85 * policy.bytes_after);
  CHECK(casts.at("kernels_placed").get<int>() < casts.at("kernels_policy").get<int>());
}

}  // namespace
}  // namespace napkin
