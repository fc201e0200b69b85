// The kernels of a step are listed once (analysis/step_kernels.h): the kernel
// plan, the time model and the program description read that list, so they
// describe the same kernels, one for one, in one order, under one name and kind.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <set>

#include "analysis/step_kernels.h"
#include "codegen/plan.h"
#include "codegen/program_json.h"
#include "ir/fusion_group.h"
#include "support/test_models.h"

namespace napkin {
namespace {

using analysis::KernelKind;

TEST_CASE("step kernels: the plan, the time model and the program agree kernel by kernel") {
  // GPT: fusion groups, GEMMs with epilogues, fused attention and classifier, the optimizer's batches.
  const ir::Graph g = testing::compile_small_model(testing::source_path("models/gpt.yaml"));
  const std::vector<analysis::StepKernel> steps = analysis::step_kernels(g, ir::fusion_groups(g));
  const codegen::KernelPlan plan = codegen::plan_kernels(g);
  const codegen::ProgramFacts facts = codegen::step_facts(g, "h100", "hash", "cpu");
  const analysis::StepTime& time = facts.predicted;
  const nlohmann::json program =
      nlohmann::json::parse(codegen::program_json(g, plan, std::vector<codegen::Launch>(plan.kernels.size()), facts));
  const nlohmann::json& described = program.at("kernels");
  REQUIRE(plan.kernels.size() == steps.size());
  REQUIRE(time.kernels.size() == steps.size());
  REQUIRE(described.size() == steps.size());

  std::set<KernelKind> kinds;
  int batches = 0, gemm_groups = 0;
  for (size_t i = 0; i < steps.size(); ++i) {
    const analysis::StepKernel& step = steps[i];
    const codegen::Kernel& k = plan.kernels[i];
    const analysis::KernelTime& t = time.kernels[i];
    INFO(i << " " << step.name);
    CHECK(k.name == step.name);
    CHECK(k.kind == step.kind);
    CHECK(k.phase == step.phase);
    CHECK(t.node == step.nodes.back());
    CHECK(t.phase == step.phase);
    CHECK(t.kind == analysis::kernel_class(g, step));
    CHECK(described[i].at("name") == step.name);
    CHECK(described[i].at("class") == analysis::kernel_class_name(t.kind));
    CHECK(described[i].at("flops") == t.flops);
    CHECK(described[i].at("bytes") == t.bytes);
    kinds.insert(step.kind);
    batches += step.batch >= 0;
    gemm_groups += step.kind == KernelKind::Gemm && step.group >= 0;
  }
  for (KernelKind kind : {KernelKind::FusedElementwise, KernelKind::Reduction, KernelKind::Gemm, KernelKind::Rows,
                          KernelKind::Attention, KernelKind::Classifier})
    CHECK_MESSAGE(kinds.count(kind) == 1, "no kernel of kind " << static_cast<int>(kind));
  CHECK(batches > 0);
  CHECK(gemm_groups > 0);
}

}  // namespace
}  // namespace napkin
