// passes/embedding_grad_into: a tied table's lookup gradient is scattered
// into the classifier's gradient of the table, in place, instead of into a
// zeroed table added to it by a kernel of its own; the compiled step computes
// what it did (the adds in another order: within f32 rounding).
#include <doctest/doctest.h>

#include <string>

#include "analysis/memory.h"
#include "support/compiled_step.h"
#include "support/test_models.h"

namespace napkin {
namespace {

ir::Graph compile(const std::string& model, bool into, ir::PrecisionPolicy precision) {
  passes::PipelineOptions options;
  options.embedding_grad_into = into;
  return testing::compile_small_model(testing::source_path("models/" + model + ".yaml"), precision, options);
}

// The embedding_grad nodes of g, and how many of them add into a base.
std::pair<int, int> scatters(const ir::Graph& g) {
  int all = 0, into = 0;
  for (ir::NodeId id : g.schedule()) {
    const ir::Node& n = g.node(id);
    if (n.op != ir::Op::EmbeddingGrad) continue;
    ++all;
    into += n.inputs.size() == 3;
  }
  return {all, into};
}

TEST_CASE("embedding_grad_into: GPT-2's tied wte takes its lookup gradient into the classifier's, in place") {
  for (ir::PrecisionPolicy precision : {ir::PrecisionPolicy::FP32, ir::PrecisionPolicy::BF16Mixed}) {
    CAPTURE(ir::precision_name(precision));
    const ir::Graph g = compile("gpt2-124m", true, precision);
    CHECK(scatters(g) == std::pair{2, 1});  // wpe's is not tied: into zeros, as before
    ir::ValueId grad_wte = ir::kNoValue;
    for (const auto& [label, v] : g.outputs) grad_wte = label == "grad.wte" ? v : grad_wte;
    REQUIRE(grad_wte != ir::kNoValue);
    const ir::Value& grad = g.value(grad_wte);
    const ir::Node& scatter = g.node(grad.producer);
    REQUIRE(scatter.op == ir::Op::EmbeddingGrad);
    REQUIRE(scatter.inputs.size() == 3u);
    // The base is the classifier's gradient of the table (widened under bf16-mixed), read by the scatter alone.
    const ir::Node& base = g.node(g.value(scatter.in(2)).producer);
    CHECK((base.op == ir::Op::LinearCrossEntropyGrad || base.op == ir::Op::Cast));
    // The memory plan hands the base's buffer to the gradient: written in place, no second table.
    const analysis::MemoryReport memory = analysis::analyze_memory(g);
    bool in_place = false;
    for (const analysis::MemoryBuffer& b : memory.buffers)
      in_place = in_place || (b.value == grad.storage && b.reuses == g.value(scatter.in(2)).storage);
    CHECK(in_place);
    // No add of two [vocab, d] tables is left.
    for (ir::NodeId id : g.schedule()) {
      const ir::Node& n = g.node(id);
      if (n.op == ir::Op::Add && n.phase == ir::Phase::Backward) CHECK(!g.value(n.out()).type.same_shape(grad.type));
    }
    CHECK(scatters(compile("gpt2-124m", false, precision)) == std::pair{2, 0});
  }
  // gpt ties its table too; lm-gqa's head is a param of its own: nothing to add into.
  CHECK(scatters(compile("gpt", true, ir::PrecisionPolicy::FP32)).second == 1);
  CHECK(scatters(compile("lm-gqa", true, ir::PrecisionPolicy::FP32)).second == 0);
}

TEST_CASE("embedding_grad_into: one compiled step agrees with the step that adds the two tables, fp32 and bf16-mixed") {
  for (ir::PrecisionPolicy precision : {ir::PrecisionPolicy::FP32, ir::PrecisionPolicy::BF16Mixed}) {
    CAPTURE(ir::precision_name(precision));
    testing::CompiledStep a(compile("gpt2-124m", false, precision)), b(compile("gpt2-124m", true, precision));
    CHECK(b.plan.kernels.size() <= a.plan.kernels.size());
    for (int step = 0; step < 3; ++step) CHECK(testing::run_step(a) == doctest::Approx(testing::run_step(b)).epsilon(1e-5));
    CHECK(testing::worst_state_error(a, b) <= 1e-4);
  }
}

}  // namespace
}  // namespace napkin
