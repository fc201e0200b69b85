// passes/norm_grad_residual: a pre-norm block's residual gradient is added by
// the norm's gradient kernel (layernorm_grad/rmsnorm_grad with a fourth
// input), and the compiled step gives the same bits with and without it.
#include <doctest/doctest.h>

#include <string>

#include "support/compiled_step.h"
#include "support/test_io.h"
#include "support/test_models.h"

namespace napkin {
namespace {

ir::Graph compile(const std::string& model, bool fold, ir::PrecisionPolicy precision, bool epilogues = true) {
  passes::PipelineOptions options;
  options.norm_grad_residual = fold;
  options.matmul_epilogues = epilogues;
  return testing::compile_small_model(testing::source_path("models/" + model + ".yaml"), precision, options);
}

TEST_CASE("norm_grad_residual: GPT-2's norm gradients add the residual stream's, and no add of a dx is left") {
  const ir::Graph g = compile("gpt2-124m", true, ir::PrecisionPolicy::BF16Mixed);
  int with_residual = 0, norms = 0;
  for (ir::NodeId id : g.schedule()) {
    const ir::Node& n = g.node(id);
    if (n.op == ir::Op::LayerNormGrad) {
      ++norms;
      with_residual += n.inputs.size() == 4;
      if (n.inputs.size() == 4) CHECK(g.value(n.in(3)).type.same_shape(g.value(n.out(0)).type));
    }
    if (n.op == ir::Op::Add)
      for (ir::ValueId in : n.inputs) {
        const ir::NodeId p = g.value(in).producer;
        CHECK_FALSE((p != ir::kNoNode && g.node(p).op == ir::Op::LayerNormGrad && g.node(p).out(0) == in));
      }
  }
  // Two layers, two norms each, and the final norm: each block's norms read
  // a residual-stream value the residual add reads too; the final norm's
  // input nothing else reads.
  CHECK(norms == 5);
  CHECK(with_residual == 4);
}

TEST_CASE("norm_grad_residual: one compiled training step gives the same bits with and without the pass") {
  for (ir::PrecisionPolicy precision : {ir::PrecisionPolicy::BF16Mixed, ir::PrecisionPolicy::FP32}) {
    for (const char* model : {"gpt", "lm-gqa", "gpt2-124m"}) {
      CAPTURE(model);
      CAPTURE(ir::precision_name(precision));
      // Without GEMM epilogues: with them a bias gradient is summed by its weight gradient's GEMM (in
      // double) where the pass leaves the sum a kernel of its own, and by the add's kernel where it does not.
      testing::CompiledStep a(compile(model, false, precision, false)), b(compile(model, true, precision, false));
      CHECK(testing::run_step(a) == testing::run_step(b));
      CHECK(testing::check_same_state_bits(a, b) > 10);
      // With them, the same loss, and the state within the f32 rounding of those sums.
      testing::CompiledStep c(compile(model, false, precision)), d(compile(model, true, precision));
      CHECK(testing::run_step(c) == testing::run_step(d));
      CHECK(testing::worst_state_error(c, d) <= 1e-5);
    }
  }
}

}  // namespace
}  // namespace napkin
