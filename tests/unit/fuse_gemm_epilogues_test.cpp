// passes/fuse_gemm_epilogues: which contractions take the elementwise work
// after them as their GEMM's epilogue (ir/gemm_epilogue.h: D = cast(acc +
// residual + bias)), which do not and why, and that a compiled step with the
// epilogues computes what the step without them does: the same bits in fp32
// (the same sums, added in the same order), within bf16 rounding under
// bf16-mixed (the epilogue adds to unrounded sums).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "ir/fusion_group.h"
#include "ir/gemm_epilogue.h"
#include "passes/pipeline.h"
#include "passes/rematerialize.h"
#include "support/compiled_step.h"
#include "support/test_models.h"

namespace napkin {
namespace {

ir::Graph compile(const std::string& model, ir::PrecisionPolicy precision, bool epilogues) {
  passes::PipelineOptions options;
  options.matmul_epilogues = epilogues;
  return testing::compile_small_model(testing::source_path("models/" + model + ".yaml"), precision, options);
}

struct Epilogues {
  int groups = 0, residual = 0, bias = 0, cast = 0, gelu = 0, gelu_grad = 0, aux_stored = 0;
  std::vector<ir::NodeId> contractions;
  std::vector<ir::NodeId> bias_grads;  // the reductions that weight gradients' GEMMs run (GemmBiasGrad)
};

// Every GEMM epilogue group of g, each checked against the form, and every
// weight gradient's GEMM storing its bias gradient.
Epilogues epilogues_of(const ir::Graph& g) {
  Epilogues e;
  const ir::FusionGroups groups = ir::fusion_groups(g);
  for (const ir::FusionGroup& fg : groups.groups) {
    if (fg.contraction == ir::kNoNode) continue;
    if (fg.reduction != ir::kNoNode) {
      REQUIRE(fg.nodes.size() == 2u);
      const auto bias_grad = ir::match_gemm_bias_grad(g, fg.contraction, fg.reduction);
      REQUIRE(bias_grad.has_value());
      CHECK(!groups.internal[g.node(fg.contraction).out()]);  // dW is stored, and the sums of B besides
      CHECK(fg.outputs.size() == 2u);
      e.bias_grads.push_back(fg.reduction);
      continue;
    }
    ++e.groups;
    e.contractions.push_back(fg.contraction);
    const ir::Node& c = g.node(fg.contraction);
    CHECK(fg.nodes.front() == c.id);
    CHECK(groups.internal[c.out()]);  // the sums are never stored
    CHECK(g.value(c.out()).type.dtype == ir::DType::F32);
    const std::vector<ir::NodeId> steps(fg.nodes.begin() + 1, fg.nodes.end());
    const auto form = ir::match_gemm_epilogue(g, c.id, c.out(), steps);
    REQUIRE(form.has_value());
    // D leaves the kernel, and a gelu's input stored for its gradient.
    const bool stores_aux = form->activation == ir::GemmActivation::Gelu && form->aux != ir::kNoValue;
    REQUIRE(fg.outputs.size() == (stores_aux ? 2u : 1u));
    CHECK(fg.outputs[0] == form->result);
    if (stores_aux) CHECK(fg.outputs[1] == form->aux);
    e.residual += form->residual != ir::kNoValue;
    e.bias += form->bias != ir::kNoValue;
    e.cast += form->out != ir::DType::F32;
    e.gelu += form->activation == ir::GemmActivation::Gelu;
    e.gelu_grad += form->activation == ir::GemmActivation::GeluGrad;
    e.aux_stored += stores_aux;
  }
  return e;
}

TEST_CASE("fuse_gemm_epilogues: GPT-2's qkv, both residual projections, the fc's gelu and its gradient become epilogues") {
  const ir::Graph g = compile("gpt2-124m", ir::PrecisionPolicy::BF16Mixed, true);
  const Epilogues e = epilogues_of(g);
  const int layers = 2;  // small dims
  // Forward, per layer: qkv = bf16(x W + b); x + y W_proj + b and x + m W_fc_proj + b
  // (residual, bias); m = bf16(gelu(x W_fc + b)) storing its input in bf16.
  // Backward, per layer: the gelu's gradient, bf16(gelu'(input) * (dm W_fc_projᵀ)).
  int forward = 0, backward = 0;
  for (ir::NodeId id : e.contractions) (g.node(id).phase == ir::Phase::Forward ? forward : backward) += 1;
  CHECK(forward == 4 * layers);
  CHECK(backward == layers);
  CHECK(e.bias == 4 * layers);
  CHECK(e.residual == 2 * layers);
  CHECK(e.gelu == layers);
  CHECK(e.aux_stored == layers);
  CHECK(e.gelu_grad == layers);
  CHECK(e.cast == 3 * layers);  // qkv, m, the gelu's gradient
  // The fc bias's gradient sums the stored bf16 gradient, widening as it loads, and the qkv bias's the
  // attention's packed bf16 gradient: each in the GEMM of its weight's gradient, which reads the same B.
  int bias_grads = 0;
  for (const auto& [label, v] : g.outputs) {
    const bool fc = label.size() > 5 && label.substr(label.size() - 5) == ".fc_b";
    const bool qkv = label.size() > 7 && label.substr(label.size() - 7) == ".attn_b";
    if (!fc && !qkv) continue;
    const ir::Node& sum = g.node(g.value(v).producer);
    CHECK(sum.op == ir::Op::ReduceSum);
    CHECK(std::count(e.bias_grads.begin(), e.bias_grads.end(), sum.id) == 1);
    CHECK(g.value(sum.in(0)).type.dtype == ir::DType::BF16);
    CHECK(sum.attrs.get_dtype("dtype") == ir::DType::F32);
    ++bias_grads;
  }
  CHECK(bias_grads == 2 * layers);
  CHECK(e.bias_grads.size() == 2u * layers);  // the residual projections' biases sum f32 gradients their GEMMs do not read
  // Without the option no contraction is in a group.
  CHECK(epilogues_of(compile("gpt2-124m", ir::PrecisionPolicy::BF16Mixed, false)).groups == 0);
  // What rematerialize reported is corrected: the gelu inputs are stored, not recomputed, so no FLOPs are added.
  passes::PipelineResult result;
  const ir::Graph with = testing::compile_small_model(testing::source_path("models/gpt2-124m.yaml"),
                                                      ir::PrecisionPolicy::BF16Mixed, {}, &result);
  const passes::Rematerialized& did = result.rematerialized;
  CHECK(did.values == layers);
  CHECK(did.stored_by_epilogues == layers);
  CHECK(did.flops_added == 0);
}

TEST_CASE("fuse_gemm_epilogues: a result read outside the chain, a bias before the residual, a reduction: no epilogue") {
  auto model = [](const std::string& forward) {
    return R"(
dims: {batch: 8, d: 16}
inputs:
  x: {shape: [batch, d]}
params:
  w: {shape: [d, d], init: normal(0.1)}
  b: {shape: [d], init: normal(0.1)}
  c: {shape: [batch, 1], init: normal(0.1)}
  r: {shape: [batch, d], init: normal(0.1)}
forward:
)" + forward + R"(
loss: mean(y @ w)
optimizer: sgd(lr=0.1)
)";
  };
  auto forward_epilogues = [](const ir::Graph& g) {
    int n = 0;
    for (ir::NodeId id : epilogues_of(g).contractions) n += g.node(id).phase == ir::Phase::Forward;
    return n;
  };
  // The form: residual, then bias.
  CHECK(forward_epilogues(testing::compile_training(model("  - y: r + x @ w + b"))) == 1);
  // The bias first, then the residual: cuBLASLt adds C before the bias, so the sums would differ.
  CHECK(forward_epilogues(testing::compile_training(model("  - y: x @ w + b + r"))) == 0);
  // The residual is the product's own A: the epilogue reads only what the GEMM does not.
  CHECK(forward_epilogues(testing::compile_training(model("  - y: x + x @ w + b"))) == 0);
  // The product is read again after the add: it would have to be stored.
  CHECK(forward_epilogues(testing::compile_training(model("  - h: x @ w\n  - y: (h + b) * h"))) == 0);
  // Work the form does not have (a multiply) after the add.
  CHECK(forward_epilogues(testing::compile_training(model("  - y: (x @ w + b) * 2"))) == 0);
  // A bias that broadcasts along the other dim ([batch, 1]) is not the [n] vector.
  CHECK(forward_epilogues(testing::compile_training(model("  - y: x @ w + c"))) == 0);
}

TEST_CASE("fuse_gemm_epilogues: a weight gradient's GEMM stores the bias gradient that sums its B, other sums stay apart") {
  auto model = [](const std::string& forward) {
    return R"(
dims: {batch: 24, d: 16, e: 40}
inputs:
  x: {shape: [batch, d]}
params:
  w: {shape: [d, e], init: normal(0.1)}
  v: {shape: [e, d], init: normal(0.1)}
  b: {shape: [e], init: normal(0.1)}
  c: {shape: [batch, 1], init: normal(0.1)}
forward:
)" + forward + R"(
loss: mean(y @ v)
optimizer: adamw(lr=0.01)
)";
  };
  // db = sum over the rows of dy, dw = xᵀ dy: one kernel reads dy once. (Where dy comes out of an
  // elementwise kernel, the sum joins that kernel instead: fuse_elementwise.)
  const std::string with_bias = model("  - y: x @ w + b");
  CHECK(epilogues_of(testing::compile_training(with_bias)).bias_grads.size() == 1u);
  // A [batch, 1] term's gradient sums dy along the other dim: not the GEMM's k.
  CHECK(epilogues_of(testing::compile_training(model("  - y: x @ w + c"))).bias_grads.empty());
  // The step computes what it did with the sum in a kernel of its own: the same loss, state within f32 rounding.
  passes::PipelineOptions off;
  off.matmul_epilogues = false;
  testing::CompiledStep a(testing::compile_training(with_bias, "inline.yaml", off)), b(testing::compile_training(with_bias));
  int kernels = 0;
  for (const codegen::Kernel& k : b.plan.kernels) kernels += k.bias_grad != ir::kNoNode;
  CHECK(kernels == 1);
  CHECK(b.plan.kernels.size() + 2 == a.plan.kernels.size());  // and the forward bias as an epilogue
  for (int step = 0; step < 3; ++step) CHECK(testing::run_step(a) == doctest::Approx(testing::run_step(b)).epsilon(1e-6));
  CHECK(testing::worst_state_error(a, b) <= 1e-5);
}

TEST_CASE("fuse_gemm_epilogues: a product whose rows have a size-1 dim, [batch, 1, n], runs its epilogue on the CPU") {
  const std::string yaml = R"(
dims: {batch: 8, one: 1, d: 16}
inputs:
  x: {shape: [batch, one, d]}
params:
  w: {shape: [d, d], init: normal(0.1)}
  b: {shape: [d], init: normal(0.1)}
  r: {shape: [batch, one, d], init: normal(0.1)}
forward:
  - y: r + einsum(x, w, "b o d, d e -> b o e") + b
loss: mean(einsum(y, w, "b o d, d e -> b o e"))
optimizer: sgd(lr=0.1)
)";
  for (bool epilogues : {false, true}) {
    passes::PipelineOptions options;
    options.matmul_epilogues = epilogues;
    ir::Graph g = testing::compile_training(yaml, "inline.yaml", options);
    CHECK((epilogues_of(g).groups > 0) == epilogues);
  }
  passes::PipelineOptions off;
  off.matmul_epilogues = false;
  testing::CompiledStep a(testing::compile_training(yaml, "inline.yaml", off)), b(testing::compile_training(yaml));
  CHECK(testing::run_step(a) == testing::run_step(b));  // fp32: the same sums, added in the same order
  CHECK(testing::check_same_state_bits(a, b) > 0);
}

TEST_CASE("fuse_gemm_epilogues: a compiled step gives the same bits in fp32 and agrees within bf16 rounding under bf16-mixed") {
  for (const char* model : {"gpt", "gpt2-124m", "lm-gqa"}) {
    CAPTURE(model);
    {
      testing::CompiledStep a(compile(model, ir::PrecisionPolicy::FP32, false)), b(compile(model, ir::PrecisionPolicy::FP32, true));
      CHECK(epilogues_of(b.g).groups > 0);
      CHECK(b.plan.kernels.size() < a.plan.kernels.size());
      CHECK(testing::run_step(a) == testing::run_step(b));
      if (epilogues_of(b.g).bias_grads.empty()) {
        CHECK(testing::check_same_state_bits(a, b) > 0);  // the same sums, added in the same order
      } else {
        // A bias gradient summed by its GEMM kernel (in double, rounded once) instead of the
        // reduction kernel (f32 partial sums): the update differs by f32 rounding of those sums.
        CHECK(testing::worst_state_error(a, b) <= 1e-5);
      }
    }
    {
      testing::CompiledStep a(compile(model, ir::PrecisionPolicy::BF16Mixed, false)),
          b(compile(model, ir::PrecisionPolicy::BF16Mixed, true));
      const double la = testing::run_step(a), lb = testing::run_step(b);
      CHECK(std::fabs(la - lb) <= 2e-3 * std::fabs(la));
    }
  }
}

}  // namespace
}  // namespace napkin
