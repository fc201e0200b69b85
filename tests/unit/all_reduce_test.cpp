// all_reduce_sum (ir/ops.def): its op table row, where the optimizer and
// loss-scaling passes put it, and the CPU executor's collective kernel with
// and without a sum over ranks (runtime/executor.h collectives). A hook
// that doubles the value is what two ranks holding the same partial sum
// would give: the clipped update must then see sqrt(2) times the norm,
// checked against the update computed by hand from the gradient's formula.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "ir/internal_check.h"
#include "ir/op.h"
#include "runtime/tensor_element.h"
#include "support/compiled_step.h"
#include "support/test_models.h"

using namespace napkin;
using ir::DType;
using ir::Op;
using ir::ValueId;

namespace {

std::vector<const ir::Node*> nodes_of(const ir::Graph& g, Op op) {
  std::vector<const ir::Node*> r;
  for (ir::NodeId id : g.schedule())
    if (g.node(id).op == op) r.push_back(&g.node(id));
  return r;
}

// The nodes that read value v.
std::vector<const ir::Node*> readers(const ir::Graph& g, ValueId v) {
  std::vector<const ir::Node*> r;
  for (ir::NodeId id : g.schedule())
    for (ValueId in : g.node(id).inputs)
      if (in == v) r.push_back(&g.node(id));
  return r;
}

// y = x * w, loss = mean(y²): dloss/dw_j = 2 / (batch · d) · Σ_b x_bj² · w_j.
std::string clipped_model(const std::string& optimizer) {
  return R"(
dims: {batch: 4, d: 3}
inputs:
  x: {shape: [batch, d]}
params:
  w: {shape: [d], init: ones}
forward:
  - y: x * w
loss: mean(y * y)
optimizer: )" + optimizer + "\n";
}

const codegen::PlannedTensor& planned(const testing::CompiledStep& step, const std::string& name) {
  for (const codegen::PlannedTensor& t : step.plan.tensors)
    if (t.name == name) return t;
  FAIL("no tensor " << name);
  return step.plan.tensors.front();
}

std::vector<double> read_tensor(const testing::CompiledStep& step, const std::string& name) {
  const codegen::PlannedTensor& t = planned(step, name);
  const runtime::DType dtype = runtime::parse_dtype(ir::dtype_name(t.dtype));
  std::vector<double> r;
  for (int64_t i = 0; i < t.bytes / static_cast<int64_t>(ir::dtype_size(t.dtype)); ++i)
    r.push_back(runtime::read_element(step.ex->arena() + t.byte_offset, dtype, i));
  return r;
}

int all_reduce_kernel(const testing::CompiledStep& step) {
  int found = -1, count = 0;
  for (size_t i = 0; i < step.program.kernels.size(); ++i)
    if (step.program.kernels[i].as<runtime::CollectiveSpec>()) found = static_cast<int>(i), ++count;
  CHECK(count == 1);
  return found;
}

}  // namespace

TEST_CASE("all_reduce_sum: an f32 value of any shape keeps its type, costs no FLOP and moves its bytes once each way") {
  const ir::OpInfo& info = ir::op_info(Op::AllReduceSum);
  CHECK(info.op_class == ir::OpClass::Collective);
  CHECK(info.loop == ir::LoopKind::Collective);
  CHECK(info.backward_only);  // no VJP, never meets the mixed-precision pass
  CHECK(info.user_function == ir::UserFunction::None);
  ir::TensorType scalar{DType::F32, {}}, matrix{DType::F32, {{3, "a"}, {4, ""}}};
  for (const ir::TensorType* t : {&scalar, &matrix}) {
    ir::InferResult r = info.infer({t}, {});
    REQUIRE(r.ok());
    REQUIRE(r.outputs.size() == 1);
    CHECK(r.outputs[0].dtype == DType::F32);
    CHECK(r.outputs[0].sizes() == t->sizes());
  }
  // Only passes make it, of an f32 sum: anything else is a compiler bug.
  ir::TensorType narrow{DType::BF16, {}};
  CHECK_THROWS_AS(info.infer({&narrow}, {}), ir::InternalError);

  ir::Graph g = testing::compile_training(clipped_model("sgd(lr=1, grad_clip=0.1)"));
  const std::vector<const ir::Node*> all_reduces = nodes_of(g, Op::AllReduceSum);
  REQUIRE(all_reduces.size() == 1);
  const ir::OpCost cost = info.cost(g, *all_reduces[0]);
  CHECK(cost.flops == 0);
  CHECK(cost.bytes_read == 4);
  CHECK(cost.bytes_written == 4);
}

TEST_CASE("all_reduce_sum: the optimizer sums the squared gradients over the ranks once, before the norm's sqrt") {
  ir::Graph g = testing::compile_training(clipped_model("adamw(lr=1, grad_clip=0.1)"));
  const std::vector<const ir::Node*> all_reduces = nodes_of(g, Op::AllReduceSum);
  REQUIRE(all_reduces.size() == 1);
  const ir::Node& n = *all_reduces[0];
  CHECK(n.phase == ir::Phase::Optimizer);
  CHECK(g.value(n.out()).type.rank() == 0);
  // Its input is the sum of squares (the last add of the chain, or the one
  // parameter's reduce_sum); its one reader is the norm's sqrt.
  const ir::Node& total = g.node(g.value(n.in(0)).producer);
  CHECK((total.op == Op::ReduceSum || total.op == Op::Add));
  const std::vector<const ir::Node*> uses = readers(g, n.out());
  REQUIRE(uses.size() == 1);
  CHECK(uses[0]->op == Op::Sqrt);
  // Not fused: a kernel of its own between the sum and the coefficient.
  CHECK(n.group < 0);

  for (const char* unclipped : {"adamw(lr=1)", "sgd(lr=1)"}) {
    CAPTURE(unclipped);
    CHECK(nodes_of(testing::compile_training(clipped_model(unclipped)), Op::AllReduceSum).empty());
  }
}

TEST_CASE("all_reduce_sum: loss scaling sums the overflow probe over the ranks once, before found_inf") {
  ir::Graph g = testing::compile_training(clipped_model("sgd(lr=1)\nprecision: fp16-mixed"));
  const std::vector<const ir::Node*> all_reduces = nodes_of(g, Op::AllReduceSum);
  REQUIRE(all_reduces.size() == 1);
  const ValueId found_inf = g.find_output("loss_scale.found_inf");
  REQUIRE(found_inf != ir::kNoValue);
  const ir::Node& test = g.node(g.value(found_inf).producer);
  CHECK(test.op == Op::NotEqual);
  CHECK(test.in(0) == all_reduces[0]->out());
  CHECK(test.in(1) == all_reduces[0]->out());
  CHECK(all_reduces[0]->phase == ir::Phase::Optimizer);
  // fp16-mixed with clipping: one before the sqrt, one before found_inf.
  CHECK(nodes_of(testing::compile_training(clipped_model("sgd(lr=1, grad_clip=0.1)\nprecision: fp16-mixed")),
                 Op::AllReduceSum)
            .size() == 2);
}

TEST_CASE("all_reduce_sum: a compiled CPU step clips by the norm its hook sums, sqrt(2) times it for two equal parts") {
  const double lr = 1, clip = 0.1;
  for (const bool hooked : {false, true}) {
    CAPTURE(hooked);
    testing::CompiledStep step(testing::compile_training(clipped_model("sgd(lr=1, grad_clip=0.1)")));
    const std::vector<double> x = read_tensor(step, "x"), w0 = read_tensor(step, "w");
    REQUIRE(x.size() == 12);
    REQUIRE(w0.size() == 3);
    // The gradient and its squared norm by the formula, in double from the f32 operands.
    std::vector<double> grad(3, 0.0);
    double squares = 0;
    for (int j = 0; j < 3; ++j) {
      for (int b = 0; b < 4; ++b) grad[j] += 2.0 / 12.0 * x[b * 3 + j] * x[b * 3 + j] * w0[j];
      squares += grad[j] * grad[j];
    }
    int calls = 0;
    double summed = 0;
    if (hooked)
      step.ex->collectives = [&](const runtime::CollectiveSpec& spec, const char* x, char* y) {
        ++calls;
        std::memcpy(y, x, sizeof(float));
        REQUIRE(spec.collective == "all_reduce_sum");
        REQUIRE(spec.count == 1);
        float* data = reinterpret_cast<float*>(y);
        summed = data[0];
        data[0] *= 2;  // two ranks, each holding this partial sum
      };
    testing::run_step(step);
    const std::vector<double> w1 = read_tensor(step, "w");
    const double norm = std::sqrt((hooked ? 2 : 1) * squares);
    const double coef = std::min(1.0, clip / (norm + 1e-6));
    REQUIRE(coef < 0.5);  // clipping is active, so the norm decides the step
    // f32 arithmetic on O(1) values: a few ulps of w (6e-8 each) against a step of about 0.06.
    for (int j = 0; j < 3; ++j) {
      CAPTURE(j);
      const double step_taken = w0[j] - w1[j], by_hand = lr * coef * grad[j];
      CHECK(std::fabs(step_taken - by_hand) <= 1e-5 * std::fabs(by_hand));
    }
    if (hooked) {
      CHECK(calls == 1);
      CHECK(std::fabs(summed - squares) <= 1e-6 * squares);  // the hook sees this rank's sum of squares
    }
  }
}

TEST_CASE("all_reduce_sum: the executor runs an all-reduce kernel even where it skips every other kernel") {
  testing::CompiledStep step(testing::compile_training(clipped_model("sgd(lr=1, grad_clip=0.1)")));
  const int all_reduce = all_reduce_kernel(step);
  REQUIRE(all_reduce >= step.program.num_gradient_kernels);  // an optimizer kernel
  step.ex->run_forward();
  step.ex->run_backward();
  int calls = 0;
  step.ex->collectives = [&](const runtime::CollectiveSpec&, const char*, char*) { ++calls; };
  step.ex->skip_kernel.assign(step.program.kernels.size(), true);
  std::vector<int> ran;
  step.ex->after_kernel = [&](int kernel) { ran.push_back(kernel); };
  step.ex->run_optimizer();
  CHECK(ran == std::vector<int>{all_reduce});
  CHECK(calls == 1);
}

TEST_CASE("all_reduce_sum: a NaN one rank's hook brings into the overflow probe skips the fp16 update and backs off") {
  // The loss is 0.5 * mean(y²), not mean(y²): the loss-scaling pass stops with
  // an internal error on a loss that is a bare mean of a matmul's square (its
  // seed check), a bug of its own.
  const std::string model =
      "dims: {batch: 8, d: 16}\ninputs:\n  x: {shape: [batch, d]}\nparams:\n  w: {shape: [d, d], init: normal(0.1)}\n"
      "forward:\n  - y: x @ w\nloss: 0.5 * mean(y * y)\noptimizer: sgd(lr=0.1)\n"
      "precision: {policy: fp16-mixed, loss_scale: {init: 1024}}\n";
  for (const bool overflow_elsewhere : {false, true}) {
    CAPTURE(overflow_elsewhere);
    testing::CompiledStep step(testing::compile_training(model));
    const std::vector<double> w0 = read_tensor(step, "w");
    if (overflow_elsewhere)
      step.ex->collectives = [](const runtime::CollectiveSpec&, const char* x, char* y) {
        std::memcpy(y, x, sizeof(float));
        *reinterpret_cast<float*>(y) += std::numeric_limits<float>::quiet_NaN();
      };
    testing::run_step(step);
    const std::vector<double> w1 = read_tensor(step, "w"), scale = read_tensor(step, "loss_scale.scale");
    CHECK((w1 == w0) == overflow_elsewhere);
    CHECK(scale.at(0) == (overflow_elsewhere ? 512 : 1024));
  }
}
