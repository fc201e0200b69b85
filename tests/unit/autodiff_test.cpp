// Autodiff, structurally: every parameter of every model gets a gradient of its
// own type, tied weights accumulate once, a linear layer's backward costs
// exactly twice its forward matmul, data gets no gradient, the saved activations
// of an MLP, and the error for an op that cannot be differentiated. Numeric
// (finite-difference) checks of the rules live with the reference interpreter.
#include <doctest/doctest.h>

#include <functional>
#include <map>
#include <memory>
#include <set>

#include "analysis/cost.h"
#include "frontend/frontend.h"
#include "ir/builder.h"
#include "ir/printer.h"
#include "passes/autodiff.h"
#include "passes/dce.h"
#include "passes/pipeline.h"
#include "support/test_models.h"

using namespace napkin;
using napkin::testing::compile;
using napkin::testing::differentiate;

namespace {

ir::Graph load_model(const std::string& file) {
  ir::Diagnostics diag;
  auto g = frontend::load_model_file(napkin::testing::source_path("models/" + file), diag);
  if (g) passes::run_forward_pipeline(*g, diag);
  INFO(diag.render());
  REQUIRE(g.has_value());
  REQUIRE_FALSE(diag.has_errors());
  return std::move(*g);
}

bool same_type(const ir::TensorType& a, const ir::TensorType& b) { return a.dtype == b.dtype && a.same_shape(b); }

// Every param has "grad.<name>": its type, a contiguous buffer of its own, that name.
void check_param_grads(const ir::Graph& g) {
  std::set<ir::ValueId> seen;
  for (const ir::Param& p : g.params) {
    const ir::Value& param = g.value(p.value);
    CAPTURE(param.name);
    ir::ValueId v = g.find_output("grad." + param.name);
    REQUIRE(v != ir::kNoValue);
    const ir::Value& grad = g.value(v);
    CHECK(same_type(grad.type, param.type));
    CHECK_FALSE(grad.is_view());
    CHECK(grad.name == "grad." + param.name);
    CHECK(g.node(grad.producer).phase == ir::Phase::Backward);
    CHECK(seen.insert(v).second);
  }
  CHECK(g.outputs.size() == g.params.size() + 1);
}

double backward_flops(const ir::Graph& g, ir::OpClass only = ir::OpClass::Source, bool filter = false) {
  analysis::StepCost c = analysis::analyze_step(g, nullptr);
  double f = 0;
  for (const analysis::OpRow& row : c.rows) {
    const ir::Node& n = g.node(row.node);
    if (n.phase != ir::Phase::Backward) continue;
    if (filter && ir::op_info(n.op).op_class != only) continue;
    f += row.cost.flops;
  }
  return f;
}

int count_backward(const ir::Graph& g, ir::Op op) {
  int count = 0;
  for (ir::NodeId id : g.schedule())
    if (g.node(id).phase == ir::Phase::Backward && g.node(id).op == op) ++count;
  return count;
}

// The node producing v, looking through views.
const ir::Node& producer_through_views(const ir::Graph& g, ir::ValueId v) {
  const ir::Node* n = &g.node(g.value(v).producer);
  while (ir::op_info(n->op).op_class == ir::OpClass::View) n = &g.node(g.value(n->in(0)).producer);
  return *n;
}

}  // namespace

TEST_CASE("autodiff: every param of every model gets a gradient of its own type") {
  for (const char* file : {"linear.yaml", "cruncher.yaml", "mlp.yaml", "gpt.yaml", "gpt2-124m.yaml"}) {
    CAPTURE(file);
    ir::Graph g = load_model(file);
    size_t forward_nodes = g.schedule().size();
    differentiate(g);
    check_param_grads(g);
    // Backward nodes follow the forward ones and carry a YAML location and an origin.
    size_t backward = 0;
    for (ir::NodeId id : g.schedule()) {
      const ir::Node& n = g.node(id);
      if (n.phase != ir::Phase::Backward) continue;
      ++backward;
      CHECK(n.loc.known());
    }
    CHECK(backward > 0);
    CHECK(g.schedule().size() == forward_nodes + backward);
  }
}

TEST_CASE("autodiff: backward nodes take the scope and location of the forward node they differentiate") {
  ir::Graph g = load_model("gpt.yaml");
  std::set<std::string> forward_scopes;
  for (ir::NodeId id : g.schedule()) forward_scopes.insert(g.node(id).scope);
  differentiate(g);
  std::set<std::string> backward_scopes;
  for (ir::NodeId id : g.schedule()) {
    const ir::Node& n = g.node(id);
    if (n.phase != ir::Phase::Backward || n.origin == ir::kNoNode) continue;
    backward_scopes.insert(n.scope);
    const ir::Node& origin = g.node(n.origin);
    CHECK(origin.phase == ir::Phase::Forward);
    CHECK(origin.scope == n.scope);
    CHECK(origin.loc.line == n.loc.line);
    CHECK(origin.loc.col == n.loc.col);
  }
  CHECK(backward_scopes == forward_scopes);
  CHECK(backward_scopes.count("blocks.3"));
}

TEST_CASE("autodiff: tied weights accumulate with exactly one add") {
  ir::Graph g = load_model("gpt.yaml");
  differentiate(g);
  ir::ValueId wte = g.find_output("grad.wte");
  REQUIRE(wte != ir::kNoValue);
  const ir::Node& add = g.node(g.value(wte).producer);
  REQUIRE(add.op == ir::Op::Add);
  // The output projection's gradient (visited first: it comes later in the
  // forward; the fused classifier's dw) plus the embedding's, each straight from its rule.
  CHECK(producer_through_views(g, add.in(0)).op == ir::Op::LinearCrossEntropyGrad);
  CHECK(producer_through_views(g, add.in(1)).op == ir::Op::EmbeddingGrad);
  CHECK(count_backward(g, ir::Op::EmbeddingGrad) == 2);  // wte and wpe
  // wpe is used once: its gradient is the embedding_grad itself.
  CHECK(g.node(g.value(g.find_output("grad.wpe")).producer).op == ir::Op::EmbeddingGrad);
}

TEST_CASE("autodiff: the gradient of a value split by selects (q, k, v) is one concat, not a sum of pads") {
  ir::Graph g = load_model("gpt.yaml");
  differentiate(g);
  CHECK(count_backward(g, ir::Op::Concat) == 4);  // one per layer
  CHECK(count_backward(g, ir::Op::Pad) == 0);
  // Selects that do not cover the axis fall back to padded gradients and an add.
  ir::Graph partial = compile(R"yaml(
model: t
params: {w: {shape: [3, 4], init: ones}}
forward:
  - a, b, c: split(w, 3, axis=0)
loss: sum(a * b)
optimizer: sgd(lr=0.1)
)yaml");
  differentiate(partial);
  check_param_grads(partial);
  CHECK(count_backward(partial, ir::Op::Concat) == 0);
  CHECK(count_backward(partial, ir::Op::Pad) == 2);
  CHECK(count_backward(partial, ir::Op::Add) == 1);
  // Slices that tile the axis, used in any order, concatenate in axis order.
  ir::Graph full = compile(R"yaml(
model: t
params: {w: {shape: [4, 6], init: ones}}
forward:
  - a, b, c: split(w, 3, axis=1)
loss: sum(c * b + a)
optimizer: sgd(lr=0.1)
)yaml");
  differentiate(full);
  check_param_grads(full);
  REQUIRE(count_backward(full, ir::Op::Concat) == 1);
  CHECK(count_backward(full, ir::Op::Pad) == 0);
  for (ir::NodeId id : full.schedule()) {
    const ir::Node& n = full.node(id);
    if (n.op != ir::Op::Concat) continue;
    CHECK(n.attrs.get_int("axis") == 1);
    CHECK(full.value(n.out()).type.sizes() == std::vector<int64_t>{4, 6});
  }
}

TEST_CASE("autodiff: a linear layer on data costs 2·B·D·K backward and computes no gradient for the data") {
  const double B = 24, K = 40, D = 56;
  ir::Graph g = compile(R"yaml(
model: t
dims: {B: 24, K: 40, D: 56}
inputs: {x: {shape: [B, K]}}
params: {w: {shape: [K, D], init: xavier}}
forward:
  - y: x @ w
loss: sum(y)
optimizer: sgd(lr=0.1)
)yaml");
  differentiate(g);
  check_param_grads(g);
  // sum's gradient is a broadcast view: the whole backward is dW = xᵀ·dY.
  CHECK(backward_flops(g) == 2 * B * D * K);
  CHECK(count_backward(g, ir::Op::Einsum) == 1);
  CHECK(count_backward(g, ir::Op::MatMul) == 0);
  CHECK(count_backward(g, ir::Op::Permute) == 0);  // no transposes
  for (ir::NodeId id : g.schedule()) {
    const ir::Node& n = g.node(id);
    if (n.phase == ir::Phase::Backward)
      CHECK_FALSE(g.value(n.out()).type.sizes() == std::vector<int64_t>{24, 40});  // no dx
  }
}

TEST_CASE("autodiff: a linear layer on activations costs exactly 4·B·D·K backward (2x its forward)") {
  const double B = 24, K0 = 8, K = 40, D = 56;
  ir::Graph g = compile(R"yaml(
model: t
dims: {B: 24, K0: 8, K: 40, D: 56}
inputs: {x0: {shape: [B, K0]}}
params: {w0: {shape: [K0, K], init: xavier}, w: {shape: [K, D], init: xavier}}
forward:
  - x: x0 @ w0
  - y: x @ w
loss: sum(y)
optimizer: sgd(lr=0.1)
)yaml");
  differentiate(g);
  check_param_grads(g);
  // y = x @ w: dx and dw, 2·B·D·K each; x = x0 @ w0: dw0 only (x0 is data).
  CHECK(backward_flops(g) == 4 * B * D * K + 2 * B * K * K0);
  CHECK(backward_flops(g, ir::OpClass::Contraction, true) == 4 * B * D * K + 2 * B * K * K0);
  CHECK(count_backward(g, ir::Op::Einsum) == 3);
}

TEST_CASE("autodiff: batched matmul with broadcast batch axes sums them inside the einsum") {
  // a [2, 1, 3, 4] @ b [5, 4, 6] -> [2, 5, 3, 6]: a is broadcast over axis 1, b over axis 0.
  ir::Graph g = compile(R"yaml(
model: t
inputs: {x: {shape: [2, 1, 3, 4]}}
params: {a: {shape: [2, 1, 3, 4], init: ones}, b: {shape: [5, 4, 6], init: ones}}
forward:
  - y: (x * a) @ b
loss: sum(y)
optimizer: sgd(lr=0.1)
)yaml");
  differentiate(g);
  check_param_grads(g);
  // Each gradient einsum costs the forward's 2·(2·5)·3·6·4; no separate reductions.
  CHECK(backward_flops(g, ir::OpClass::Contraction, true) == 2 * (2 * 2 * 5 * 3 * 6 * 4));
  CHECK(count_backward(g, ir::Op::ReduceSum) == 0);
}

TEST_CASE("autodiff: a branch that does not depend on params gets no backward nodes") {
  ir::Graph g = compile(R"yaml(
model: t
inputs: {x: {shape: [4, 3]}, z: {shape: [4, 3]}}
params: {w: {shape: [3, 2], init: ones}}
forward:
  - data_only: exp(z) * 2 + tanh(z)
  - y: x @ w
loss: sum(y) + sum(data_only)
optimizer: sgd(lr=0.1)
)yaml");
  int data_line = 0;
  for (ir::NodeId id : g.schedule())
    if (g.node(id).op == ir::Op::Exp) data_line = g.node(id).loc.line;
  REQUIRE(data_line > 0);
  differentiate(g);
  check_param_grads(g);
  for (ir::NodeId id : g.schedule()) {
    const ir::Node& n = g.node(id);
    if (n.phase != ir::Phase::Backward) continue;
    CHECK(n.loc.line != data_line);
    CHECK(n.op != ir::Op::ReduceSum);  // the gradient of sum(data_only) is never formed
  }
  CHECK(backward_flops(g) == 2 * 4 * 3 * 2);
}

TEST_CASE("autodiff: a parameter the loss does not depend on gets no gradient - a model without any gets none") {
  ir::Graph g = compile(R"yaml(
model: t
inputs: {x: {shape: [4, 3]}}
params: {w: {shape: [3, 2], init: ones}}
forward:
  - y: x * 2
loss: mean(y)
optimizer: sgd(lr=0.1)
)yaml");
  size_t before = g.schedule().size();
  differentiate(g);
  CHECK(g.outputs.size() == 1);
  CHECK(g.schedule().size() == before);
}

const char* const kTwoLayerMlp = R"yaml(
model: t
dims: {B: 8, D: 5, H: 7, C: 3}
inputs: {x: {shape: [B, D]}, t: {shape: [B, C]}}
params:
  w1: {shape: [D, H], init: xavier}
  b1: {shape: [H], init: zeros}
  w2: {shape: [H, C], init: xavier}
  b2: {shape: [C], init: zeros}
forward:
  - z: x @ w1 + b1
  - h: relu(z)
  - out: h @ w2 + b2
loss: mse(out, t)
optimizer: sgd(lr=0.1)
)yaml";

TEST_CASE("autodiff: saved activations of a 2-layer MLP are the hidden layer and the prediction") {
  ir::Graph g = compile(kTwoLayerMlp);
  differentiate(g);
  check_param_grads(g);
  // relu's rule reads its output (h > 0 iff z > 0), so z is not kept; x, t and
  // the weights are inputs and params, not activations.
  std::vector<std::string> names;
  for (ir::ValueId v : passes::saved_activations(g)) names.push_back(g.value(v).name);
  CHECK(names == std::vector<std::string>{"h", "out"});
  // Deterministic: a second compile gives the same graph text.
  ir::Graph again = compile(kTwoLayerMlp);
  differentiate(again);
  CHECK(ir::print_graph(g) == ir::print_graph(again));
}

TEST_CASE("autodiff: the gradient of a sum of identical params is two distinct buffers") {
  // add's rule gives both operands the same dy: the second export must copy.
  ir::Graph g = compile(R"yaml(
model: t
params: {a: {shape: [3], init: ones}, b: {shape: [3], init: ones}}
forward:
  - y: a + b
loss: sum(y * y)
optimizer: sgd(lr=0.1)
)yaml");
  differentiate(g);
  check_param_grads(g);
}

TEST_CASE("autodiff: a backward-only op between a param and the loss is an error naming it and its location") {
  ir::Graph g;
  g.name = "hand";
  auto file = std::make_shared<const std::string>("hand.yaml");
  ir::SourceLoc param_loc{file, 2, 3}, op_loc{file, 4, 7}, loss_loc{file, 5, 7};
  ir::TensorType t{ir::DType::F32, {{4, "d"}}};
  ir::ValueId w = g.add_param("w", t, {}, param_loc);
  ir::Builder b(g);
  b.set_loc(op_loc);
  ir::ValueId s = b.must(b.add(ir::Op::SoftmaxGrad, {w, w}, {{"axis", int64_t{0}}}));
  b.set_loc(loss_loc);
  ir::ValueId loss = b.must(b.add(ir::Op::ReduceSum, {s}, {{"axes", std::vector<int64_t>{0}}, {"keepdims", int64_t{0}}}));
  g.outputs.emplace_back("loss", loss);
  size_t before = g.schedule().size();

  ir::Diagnostics diag;
  diag.add_source("hand.yaml", "params:\n  w: [4]\nforward:\n  - s: softmax_grad(w, w)\nloss: sum(s)\n");
  passes::PassManager pm({});
  pm.add(passes::make_autodiff_pass());
  CHECK_FALSE(pm.run(g, diag));
  std::string out = diag.render();
  CHECK(out.find("hand.yaml:4:7: error: cannot differentiate 'softmax_grad': it has no vector-Jacobian product") !=
        std::string::npos);
  CHECK(out.find("  - s: softmax_grad(w, w)") != std::string::npos);
  CHECK(out.find("hint:") != std::string::npos);
  CHECK(diag.error_count() == 1);
  CHECK(g.schedule().size() == before);  // nothing was built
}

// Every forward op's rule, on a tiny hand-built graph: param(s) -> op -> sum ->
// loss. The pass checks each gradient's type; the verifier checks every node.
TEST_CASE("autodiff: every differentiable op's rule gives gradients of its inputs' types") {
  using ir::Op;
  using Build = std::function<ir::ValueId(ir::Builder&, const std::function<ir::ValueId(std::vector<int64_t>)>&)>;
  auto ints = [](std::initializer_list<int64_t> v) { return std::vector<int64_t>(v); };
  auto einsum_attrs = [](std::vector<int64_t> lhs, std::vector<int64_t> rhs, std::vector<int64_t> out) {
    return ir::Attrs{{"lhs", lhs}, {"rhs", rhs}, {"out", out}, {"axis_names", std::string("i j k l")}, {"spec", std::string("test")}};
  };
  std::vector<std::pair<std::string, Build>> cases;
  for (Op op : {Op::Neg, Op::Exp, Op::Log, Op::Sqrt, Op::Rsqrt, Op::Abs, Op::Tanh, Op::Relu, Op::Sigmoid, Op::Silu,
                Op::Sin, Op::Cos, Op::Copy})
    cases.push_back({std::string(ir::op_name(op)),
                     [op](ir::Builder& b, const auto& param) { return b.must(b.add(op, {param({3, 4})})); }});
  for (const char* approx : {"tanh", "none"})
    cases.push_back({std::string("gelu ") + approx, [approx](ir::Builder& b, const auto& param) {
                       return b.must(b.add(Op::Gelu, {param({3, 4})}, {{"approximate", std::string(approx)}}));
                     }});
  cases.push_back({"cast", [](ir::Builder& b, const auto& param) {
                     ir::ValueId h = b.must(b.add(Op::Cast, {param({3, 4})}, {{"dtype", ir::DType::BF16}}));
                     return b.must(b.add(Op::Cast, {h}, {{"dtype", ir::DType::F32}}));
                   }});
  cases.push_back({"triu", [](ir::Builder& b, const auto& param) {
                     return b.must(b.add(Op::Triu, {param({2, 3, 3})}, {{"k", int64_t{1}}}));
                   }});
  cases.push_back({"causal_mask", [](ir::Builder& b, const auto& param) {
                     ir::ValueId m = b.must(b.add(Op::CausalMask, {param({2, 3, 3})}));
                     return b.must(b.add(Op::Softmax, {m}, {{"axis", int64_t{2}}}));
                   }});
  // Binary ops with both kinds of broadcasting: a leading axis and a size-1 axis.
  for (Op op : {Op::Add, Op::Sub, Op::Mul, Op::Div, Op::Pow, Op::Maximum, Op::Minimum})
    cases.push_back({std::string(ir::op_name(op)), [op](ir::Builder& b, const auto& param) {
                       return b.must(b.add(op, {param({2, 3, 4}), param({3, 1})}));
                     }});
  cases.push_back({"where", [](ir::Builder& b, const auto& param) {
                     ir::ValueId x = param({2, 3, 4}), y = param({3, 1});
                     ir::ValueId c = b.must(b.add(Op::Greater, {x, y}));
                     ir::ValueId lt = b.must(b.add(Op::Less, {x, y}));
                     ir::ValueId w = b.must(b.add(Op::Where, {c, x, y}));
                     return b.must(b.add(Op::Where, {lt, w, param({4})}));
                   }});
  for (Op op : {Op::ReduceSum, Op::ReduceMean, Op::ReduceMax, Op::ReduceMin})
    for (int64_t keep : {0, 1})
      cases.push_back({std::string(ir::op_name(op)) + (keep ? " keepdims" : ""), [op, keep, ints](ir::Builder& b, const auto& param) {
                         return b.must(b.add(op, {param({2, 3, 4})}, {{"axes", ints({0, 2})}, {"keepdims", keep}}));
                       }});
  cases.push_back({"matmul 2d", [](ir::Builder& b, const auto& param) {
                     return b.must(b.add(Op::MatMul, {param({3, 4}), param({4, 5})}));
                   }});
  cases.push_back({"matmul broadcast", [](ir::Builder& b, const auto& param) {
                     return b.must(b.add(Op::MatMul, {param({2, 1, 3, 4}), param({5, 4, 6})}));
                   }});
  cases.push_back({"matmul broadcast other side", [](ir::Builder& b, const auto& param) {
                     return b.must(b.add(Op::MatMul, {param({3, 4}), param({2, 1, 4, 6})}));
                   }});
  // "i j k, k l -> i l": j appears only in the first operand (summed alone).
  cases.push_back({"einsum", [einsum_attrs](ir::Builder& b, const auto& param) {
                     return b.must(b.add(Op::Einsum, {param({3, 4, 5}), param({5, 6})}, einsum_attrs({0, 1, 2}, {2, 3}, {0, 3})));
                   }});
  // "i j, k j -> k i j": an outer-product-like batch axis shared with the output.
  cases.push_back({"einsum batch", [einsum_attrs](ir::Builder& b, const auto& param) {
                     return b.must(b.add(Op::Einsum, {param({3, 4}), param({5, 4})}, einsum_attrs({0, 1}, {2, 1}, {2, 0, 1})));
                   }});
  cases.push_back({"reshape", [](ir::Builder& b, const auto& param) {
                     return b.must(b.reshape(param({3, 4}), {{12, ""}}));
                   }});
  cases.push_back({"permute then reshape (a copy)", [ints](ir::Builder& b, const auto& param) {
                     ir::ValueId p = b.must(b.permute(param({2, 3, 4}), ints({2, 0, 1})));
                     return b.must(b.reshape(p, {{4, ""}, {6, ""}}));
                   }});
  cases.push_back({"broadcast", [ints](ir::Builder& b, const auto& param) {
                     return b.must(b.add(Op::Broadcast, {param({3, 1})}, {{"shape", ints({2, 3, 4})}}));
                   }});
  cases.push_back({"slice", [](ir::Builder& b, const auto& param) {
                     return b.must(b.add(Op::Slice, {param({3, 4})}, {{"axis", int64_t{1}}, {"start", int64_t{1}}, {"stop", int64_t{3}}}));
                   }});
  cases.push_back({"select", [](ir::Builder& b, const auto& param) {
                     return b.must(b.add(Op::Select, {param({3, 4})}, {{"axis", int64_t{1}}, {"index", int64_t{2}}}));
                   }});
  cases.push_back({"concat", [](ir::Builder& b, const auto& param) {
                     return b.must(b.add(Op::Concat, {param({3, 4}), param({3, 2}), param({3, 1})}, {{"axis", int64_t{1}}}));
                   }});
  cases.push_back({"pad", [](ir::Builder& b, const auto& param) {
                     return b.must(b.add(Op::Pad, {param({3, 4})}, {{"axis", int64_t{0}}, {"before", int64_t{1}}, {"after", int64_t{2}}}));
                   }});
  cases.push_back({"embedding", [](ir::Builder& b, const auto& param) {
                     ir::ValueId ids = b.graph().add_input("ids", {ir::DType::I32, {{2, ""}, {3, ""}}}, {});
                     return b.must(b.add(Op::Embedding, {param({10, 4}), ids}));
                   }});
  cases.push_back({"embedding of arange", [](ir::Builder& b, const auto& param) {
                     ir::ValueId ids = b.must(b.add(Op::Iota, {}, {{"n", int64_t{5}}, {"dtype", ir::DType::I32}}));
                     return b.must(b.add(Op::Embedding, {param({10, 4}), ids}));
                   }});
  cases.push_back({"softmax", [](ir::Builder& b, const auto& param) {
                     return b.must(b.add(Op::Softmax, {param({3, 4})}, {{"axis", int64_t{0}}}));
                   }});
  cases.push_back({"log_softmax", [](ir::Builder& b, const auto& param) {
                     return b.must(b.add(Op::LogSoftmax, {param({3, 4})}, {{"axis", int64_t{1}}}));
                   }});
  cases.push_back({"layernorm", [](ir::Builder& b, const auto& param) {
                     return b.must(b.add(Op::LayerNorm, {param({2, 3, 4}), param({4}), param({4})}, {{"eps", 1e-5}}));
                   }});
  cases.push_back({"layernorm of a vector", [](ir::Builder& b, const auto& param) {
                     return b.must(b.add(Op::LayerNorm, {param({4}), param({4}), param({4})}, {{"eps", 1e-5}}));
                   }});
  cases.push_back({"rmsnorm", [](ir::Builder& b, const auto& param) {
                     return b.must(b.add(Op::RMSNorm, {param({2, 3, 4}), param({4})}, {{"eps", 1e-5}}));
                   }});
  cases.push_back({"cross_entropy", [](ir::Builder& b, const auto& param) {
                     ir::ValueId targets = b.graph().add_input("targets", {ir::DType::I32, {{2, ""}, {3, ""}}}, {});
                     return b.must(b.add(Op::CrossEntropy, {param({2, 3, 7}), targets}));
                   }});
  cases.push_back({"mse", [](ir::Builder& b, const auto& param) {
                     return b.must(b.add(Op::MSE, {param({3, 4}), param({3, 4})}));
                   }});
  cases.push_back({"constant operand", [](ir::Builder& b, const auto& param) {
                     ir::ValueId c = b.must(b.constant(2.0, ir::DType::F32));
                     return b.must(b.add(Op::Mul, {param({3}), c}));
                   }});

  for (const auto& c : cases) {
    const std::string& label = c.first;
    CAPTURE(label);
    ir::Graph g;
    auto file = std::make_shared<const std::string>("ops.yaml");
    ir::Builder b(g);
    b.set_loc({file, 1, 1});
    int count = 0;
    auto param = [&](std::vector<int64_t> shape) {
      ir::TensorType t;
      for (int64_t s : shape) t.dims.push_back({s, ""});
      return g.add_param("p" + std::to_string(count++), t, {}, {file, 1, 1});
    };
    ir::ValueId y = c.second(b, param);
    int rank = g.value(y).type.rank();
    if (rank > 0) {
      std::vector<int64_t> all(rank);
      for (int i = 0; i < rank; ++i) all[i] = i;
      y = b.must(b.add(Op::ReduceSum, {y}, {{"axes", all}, {"keepdims", int64_t{0}}}));
    }
    g.outputs.emplace_back("loss", y);
    differentiate(g);
    check_param_grads(g);
  }
}
