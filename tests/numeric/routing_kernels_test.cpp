// top_k and moe_slots compiled for the CPU (runtime/routing.h's kernels)
// inside a training step that routes tokens to experts
// (tests/support/routing_graph.h), every kernel of the step against the
// interpreter on its own inputs: the routing kernels exactly (integers, and
// values copied as stored), the dispatch and combine gathers, the expert
// einsum, top_k's VJP (i32 arange, mul, add and a scatter-add) and the
// rest within their dtype's tolerance. f32 and f64 operands, and bf16 logits
// under bf16-mixed.
#include <doctest/doctest.h>

#include "support/compiled_step.h"
#include "support/routing_graph.h"

namespace napkin {
namespace {

TEST_CASE("numeric: CPU top_k and moe_slots kernels in a routed training step agree with the interpreter, f32, f64, bf16-mixed") {
  struct Case {
    ir::DType dtype;
    ir::PrecisionPolicy policy;
  };
  for (const Case c : {Case{ir::DType::F32, ir::PrecisionPolicy::FP32}, Case{ir::DType::F64, ir::PrecisionPolicy::FP32},
                       Case{ir::DType::F32, ir::PrecisionPolicy::BF16Mixed}}) {
    CAPTURE(ir::dtype_name(c.dtype));
    CAPTURE(ir::precision_name(c.policy));
    napkin::testing::CompiledStep step(napkin::testing::routing_training_graph(c.dtype, c.policy));
    int top_k = 0, moe_slots = 0, integer_loops = 0;
    ir::DType logits = ir::DType::Bool;
    for (const codegen::Kernel& k : step.plan.kernels) {
      top_k += k.kind == codegen::KernelKind::TopK;
      moe_slots += k.kind == codegen::KernelKind::MoeSlots;
      if (k.kind == codegen::KernelKind::TopK) logits = k.inputs[0].dtype;
      // top_k's VJP: the row bases n * arange(R) and the ids indices + base, in i32.
      integer_loops += (k.kind == codegen::KernelKind::Elementwise || k.kind == codegen::KernelKind::FusedElementwise) &&
                       k.output.dtype == ir::DType::I32;
    }
    CHECK(top_k == 1);
    CHECK(moe_slots == 1);
    CHECK(integer_loops >= 1);
    CHECK(logits == (c.policy == ir::PrecisionPolicy::BF16Mixed ? ir::DType::BF16 : c.dtype));
    int checked = 0;
    napkin::testing::check_each_kernel(step, [&](const napkin::testing::KernelOutputCheck& o) {
      INFO(o.kernel->name << " output " << o.output << ", " << ir::dtype_name(o.operand->dtype));
      const bool routing = o.kernel->kind == codegen::KernelKind::TopK || o.kernel->kind == codegen::KernelKind::MoeSlots;
      CHECK(o.error <= (routing ? 0.0 : napkin::testing::kernel_tolerance(o.precision)));
      checked += routing;
    });
    CHECK(checked == 2 + 3);  // values and indices; pos, src and counts
  }
}

}  // namespace
}  // namespace napkin
