// softplus, the op issue 16 added through the op table alone (ops.def, its
// row, its formula, its VJP), end to end: its values against float64 log1p,
// `napkin check`, the compiled CPU kernels against the interpreter, the cost
// the report prints and its mixed-precision rule. The emulated CUDA kernels
// are checked in cuda_emulated_test.cpp; tests/numeric/softplus.yaml is the
// model.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>

#include "analysis/cost.h"
#include "analysis/memory.h"
#include "interp/float64_arithmetic.h"
#include "interp/gradient_check.h"
#include "passes/mixed_precision.h"
#include "report/report.h"
#include "support/compiled_step.h"
#include "support/test_models.h"

using namespace napkin;

namespace {

ir::Graph softplus_model(ir::PrecisionPolicy policy) {
  return napkin::testing::compile_model_file(napkin::testing::source_path("tests/numeric/softplus.yaml"), {}, policy);
}

const ir::Node& forward_softplus(const ir::Graph& g) {
  for (ir::NodeId id : g.schedule())
    if (g.node(id).op == ir::Op::Softplus) return g.node(id);
  FAIL("the model has no softplus node");
  return g.node(g.schedule().front());
}

}  // namespace

TEST_CASE("softplus: the float64 formula is log1p(exp(x)) to 4 ulps from -745 to 800, and exact at the ends") {
  for (double x : {-745.0, -700.0, -100.0, -37.0, -20.0, -5.0, -1.0, -1e-3, -1e-300, 0.0, 1e-300, 1e-3, 0.5, 1.0, 5.0,
                   20.0, 37.0, 100.0, 800.0}) {
    CAPTURE(x);
    // Independent reference: libm's log1p, folded so exp cannot overflow.
    double reference = x > 0 ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x));
    double got = interp::fold_unary(ir::Op::Softplus, x);
    CHECK(std::fabs(got - reference) <= 4 * std::numeric_limits<double>::epsilon() * std::fabs(reference));
    CHECK(got > 0);  // never rounds to 0 in double over this range (exp(-745) is the smallest subnormal's order)
  }
  const double inf = std::numeric_limits<double>::infinity();
  CHECK(interp::fold_unary(ir::Op::Softplus, inf) == inf);
  CHECK(interp::fold_unary(ir::Op::Softplus, -inf) == 0.0);
  CHECK(std::isnan(interp::fold_unary(ir::Op::Softplus, std::nan(""))));
}

TEST_CASE("softplus: a model using it passes napkin check and its CPU kernels agree with the interpreter, fp32 and bf16-mixed") {
  for (ir::PrecisionPolicy policy : {ir::PrecisionPolicy::FP32, ir::PrecisionPolicy::BF16Mixed}) {
    const std::string_view precision = ir::precision_name(policy);
    CAPTURE(precision);
    ir::Graph g = softplus_model(policy);
    interp::GradCheckOptions options;
    options.seed = 0;
    interp::GradCheckResult r = interp::check_gradients(g, options);
    CHECK(r.tensors.size() == g.params.size());
    for (const interp::TensorCheck& t : r.tensors) {
      CAPTURE(t.name);
      CHECK(t.elements_checked > 0);
      CHECK(t.error_f64 <= t.tolerance_f64);
      CHECK(t.passed);
    }
    CHECK(r.passed);

    napkin::testing::CompiledStep step(std::move(g));
    int softplus_kernels = 0;
    for (const codegen::Kernel& k : step.plan.kernels) {
      if (k.op == ir::Op::Softplus) ++softplus_kernels;
      if (k.fused)
        for (const codegen::FusedOp& op : k.fused->ops) softplus_kernels += op.op == ir::Op::Softplus;
    }
    CHECK(softplus_kernels >= 1);
    int checked = 0;
    napkin::testing::check_each_kernel(step, [&](const napkin::testing::KernelOutputCheck& c) {
      INFO(c.kernel->name << " output " << c.output << " at " << c.kernel->where);
      CHECK(c.error <= napkin::testing::kernel_tolerance(c.precision));
      ++checked;
    });
    CHECK(checked > 0);
  }
}

TEST_CASE("softplus: the report counts 3 FLOPs and 2 transcendentals per element, and bf16-mixed computes it in f32") {
  ir::Graph g = softplus_model(ir::PrecisionPolicy::FP32);
  const ir::Node& n = forward_softplus(g);
  const double elements = g.value(n.out()).type.numel();
  CHECK(elements == 4 * 16);
  CHECK(ir::op_info(ir::Op::Softplus).cost(g, n).flops == 3 * elements);
  CHECK(ir::transcendentals(g, n) == 2 * elements);
  analysis::StepCost cost = analysis::analyze_step(g, nullptr);
  std::string text = report::render_report_text(g, cost, analysis::analyze_memory(g), {"softplus.yaml"});
  CHECK(text.find("softplus") != std::string::npos);

  CHECK(passes::amp_rule(ir::Op::Softplus, false) == passes::AmpRule::Fp32Op);
  ir::Graph mixed = softplus_model(ir::PrecisionPolicy::BF16Mixed);
  const ir::Node& m = forward_softplus(mixed);
  CHECK(mixed.value(m.out()).type.dtype == ir::DType::F32);
  const ir::Node& input = mixed.node(mixed.value(m.in(0)).producer);
  CHECK(input.op == ir::Op::Cast);  // the bf16 matmul output cast up ("fp32 op input")
  CHECK(mixed.value(input.in(0)).type.dtype == ir::DType::BF16);
}
