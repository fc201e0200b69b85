// The CPU kernels that sum across their parallel dim (fused reductions over
// rows, layernorm's dx with its gain and bias gradients, batches of reductions) split it
// into parts fixed by the shape and combine the parts in order: the thread
// count changes who computes a part, never the sums. Checked bit for bit on
// GPT-2's block at 148 rows (which 16 parts do not divide evenly).
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "frontend/frontend.h"
#include "passes/pipeline.h"
#include "support/compiled_step.h"
#include "support/test_io.h"
#include "support/test_models.h"

using namespace napkin;

namespace {

ir::Graph gpt2_block() {
  ir::Diagnostics diag;
  frontend::LoadOptions options;
  options.dim_overrides = testing::small_dims().at("gpt2-124m");
  options.dim_overrides["batch"] = 4;
  options.dim_overrides["seq"] = 37;
  std::optional<ir::Graph> g = frontend::load_model_file(testing::source_path("models/gpt2-124m.yaml"), diag, options);
  REQUIRE(g.has_value());
  passes::run_training_pipeline(*g, diag);
  REQUIRE_FALSE(diag.has_errors());
  return std::move(*g);
}

bool sums_across_parts(const codegen::Kernel& k) {
  if (k.kind == codegen::KernelKind::Reduction) return k.fused.has_value();
  if (k.kind != codegen::KernelKind::Rows) return false;
  const ir::RowParams& p = k.rows();
  return p.variant == ir::RowVariant::NormGrad && p.gains;
}

}  // namespace

TEST_CASE("numeric: CPU kernels that sum across their parallel dim give the same bits on 1, 2 and 3 threads") {
  std::vector<std::vector<double>> first;
  for (int threads : {1, 2, 3}) {
    CAPTURE(threads);
    testing::CompiledStep step(gpt2_block(), threads);
    // Each such kernel's outputs as it leaves them (later kernels may reuse the buffers).
    std::vector<std::vector<double>> got;
    std::vector<std::string> names;
    int norm_gains = 0;
    step.ex->after_kernel = [&](int i) {
      const codegen::Kernel& k = step.plan.kernels[static_cast<size_t>(i)];
      if (!sums_across_parts(k)) return;
      norm_gains += k.kind == codegen::KernelKind::Rows;
      std::vector<const codegen::Operand*> outputs;
      if (k.fused)
        for (const codegen::Operand& o : k.fused->outputs) outputs.push_back(&o);
      else
        outputs.push_back(&k.output);
      for (const codegen::Operand& o : k.extra_outputs) outputs.push_back(&o);
      for (const codegen::BatchMember& m : k.batch)
        for (const codegen::Operand& o : m.outputs) outputs.push_back(&o);
      for (const codegen::Operand* o : outputs) {
        got.push_back(testing::read_operand(step.ex->arena(), *o));
        names.push_back(k.name + " at " + k.where);
      }
    };
    step.ex->run_forward();
    step.ex->run_rest();
    CHECK(norm_gains == 5);  // two layernorms per block, two blocks, and the final one
    REQUIRE(!got.empty());
    if (first.empty()) first = got;
    REQUIRE(got.size() == first.size());
    for (size_t i = 0; i < got.size(); ++i) {
      INFO(names[i]);
      CHECK(got[i] == first[i]);
    }
  }
}
