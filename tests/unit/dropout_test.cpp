// dropout(x, p) (ir/rng.h): the interpreter's masks against Philox computed
// here, their statistics, the frontend's checks of p, the backward rule under
// `napkin check`, the CPU backend against the interpreter bit for bit, and a
// step recomputed under a memory budget, which must draw the same masks.
#include <doctest/doctest.h>

#include <cmath>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "interp/gradient_check.h"
#include "interp/interpreter.h"
#include "ir/rng.h"
#include "passes/recompute.h"
#include "runtime/rng.h"
#include "support/compiled_step.h"
#include "support/test_models.h"

using namespace napkin;

namespace {

// Two dropouts of the same input: each must draw its own mask.
const char* kTwoDropouts = R"yaml(
model: drop
optimizer: sgd(lr=0.1)
dims: {n: 20000}
inputs: {x: {shape: [n]}}
forward:
  - a: dropout(x, 0.3)
  - b: dropout(x, p=0.3)
loss: mean(a * b)
)yaml";

std::vector<double> rng_words(uint64_t seed, int64_t step, bool training) {
  std::vector<double> out;
  for (int64_t w : runtime::rng_tensor_words(seed, step, training)) out.push_back(static_cast<double>(w));
  return out;
}

std::vector<const ir::Node*> dropouts(const ir::Graph& g) {
  std::vector<const ir::Node*> out;
  for (ir::NodeId id : g.schedule())
    if (g.node(id).op == ir::Op::Dropout) out.push_back(&g.node(id));
  return out;
}

// The forward values of `kTwoDropouts` at x = 1 for the rng tensor of (seed, step, training).
struct Drawn {
  std::vector<double> a, b;
};
Drawn draw(const ir::Graph& g, uint64_t seed, int64_t step, bool training) {
  interp::Interpreter in(g, interp::Numerics::Native);
  in.set(g.inputs[0], std::vector<double>(20000, 1.0));
  in.set(g.rng, rng_words(seed, step, training));
  in.run();
  std::vector<const ir::Node*> d = dropouts(g);
  return {in.get(d[0]->out()), in.get(d[1]->out())};
}

int differences(const std::vector<double>& a, const std::vector<double>& b) {
  int n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += a[i] != b[i];
  return n;
}

}  // namespace

TEST_CASE("dropout: the interpreter keeps element i iff its Philox word passes the threshold - about 1-p of them") {
  ir::Graph g = testing::compile(kTwoDropouts);
  REQUIRE(g.rng != ir::kNoValue);
  std::vector<const ir::Node*> d = dropouts(g);
  REQUIRE(d.size() == 2);
  CHECK(d[0]->attrs.get_int("stream") != d[1]->attrs.get_int("stream"));
  const uint64_t seed = 0x123456789abcdefULL;  // both halves of the key matter
  const int64_t step = 5;
  Drawn r = draw(g, seed, step, true);
  const double p = 0.3, n = 20000;
  const float scale = static_cast<float>(1 / (1 - p));

  // The mask from the definition, with the runtime's Philox.
  for (int k = 0; k < 2; ++k) {
    const std::vector<double>& out = k == 0 ? r.a : r.b;
    const auto stream = static_cast<uint32_t>(d[k]->attrs.get_int("stream"));
    int kept = 0;
    double sum = 0;
    bool all_match = true;
    for (uint32_t i = 0; i < n; ++i) {
      uint32_t word = runtime::philox4x32_10({i, stream, static_cast<uint32_t>(step), 0},
                                             {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)})[0];
      bool keep = static_cast<double>(word) >= std::floor(p * 4294967296.0);
      all_match = all_match && out[i] == (keep ? scale : 0.0);
      kept += keep;
      sum += out[i];
    }
    CHECK(all_match);
    // Binomial(n, 1-p): 5 standard deviations.
    const double sd = std::sqrt(n * p * (1 - p));
    CHECK(std::fabs(kept - n * (1 - p)) < 5 * sd);
    // E[out] = x = 1: the mean of n draws of scale * Bernoulli(1-p).
    CHECK(std::fabs(sum / n - 1.0) < 5 * scale * std::sqrt(p * (1 - p) / n));
  }
  // Two dropouts, two masks: agreeing on a fraction p^2 + (1-p)^2 of the elements.
  int both = differences(r.a, r.b);
  const double disagree = 2 * p * (1 - p);
  CHECK(std::fabs(both - n * disagree) < 5 * std::sqrt(n * disagree * (1 - disagree)));

  // The same (seed, step) draws the same masks; another step or seed others.
  Drawn again = draw(g, seed, step, true);
  CHECK(again.a == r.a);
  CHECK(again.b == r.b);
  CHECK(differences(draw(g, seed, step + 1, true).a, r.a) > n * disagree / 2);
  CHECK(differences(draw(g, seed + 1, step, true).a, r.a) > n * disagree / 2);
  // Evaluating: the identity.
  Drawn eval = draw(g, seed, step, false);
  CHECK(eval.a == std::vector<double>(20000, 1.0));
  CHECK(eval.b == std::vector<double>(20000, 1.0));
}

TEST_CASE("dropout: p outside 0 to 1 (1 excluded) is an error at its line and column - p = 0 is x itself") {
  for (const char* p : {"1", "1.5", "-0.1"}) {
    CAPTURE(p);
    std::string out = testing::compile_errors(std::string(R"yaml(model: t
optimizer: sgd(lr=0.1)
inputs: {x: {shape: [4]}}
forward:
  - y: dropout(x, )yaml") + p + R"yaml()
loss: mean(y)
)yaml",
                                              "bad.yaml");
    CHECK(out.find(std::string("bad.yaml:5:19: error: dropout: p must be in [0, 1), got ") + p) != std::string::npos);
  }
  ir::Graph g = testing::compile(R"yaml(model: t
optimizer: sgd(lr=0.1)
inputs: {x: {shape: [4]}}
forward:
  - y: dropout(x, 0)
loss: mean(y)
)yaml");
  CHECK(dropouts(g).empty());
  CHECK(g.rng == ir::kNoValue);
  std::string ints = testing::compile_errors(R"yaml(model: t
optimizer: sgd(lr=0.1)
inputs: {x: {shape: [4], dtype: i32}}
forward:
  - y: dropout(x, 0.5)
loss: mean(cast(y, f32))
)yaml");
  CHECK(ints.find("dropout needs a floating-point input, got i32") != std::string::npos);
}

namespace {

// A small MLP with two dropouts in a row after the first layer: the first
// one's output is saved for the backward pass's last matmul, which a memory
// budget makes worth recomputing.
const char* kMlp = R"yaml(
model: mlp_dropout
dims: {batch: 16, d_in: 8, hidden: 32, classes: 5}
inputs:
  images: {shape: [batch, d_in]}
  labels: {shape: [batch], dtype: i32}
params:
  w1: {shape: [d_in, hidden], init: xavier}
  b1: {shape: [hidden], init: zeros}
  w2: {shape: [hidden, hidden], init: xavier}
  w3: {shape: [hidden, classes], init: xavier}
forward:
  - h: dropout(gelu(images @ w1 + b1), 0.5)
  - g: gelu(dropout(h, 0.2) @ w2)
  - logits: g @ w3
loss: cross_entropy(logits, labels)
optimizer: adamw(lr=1e-3)
)yaml";

}  // namespace

TEST_CASE("dropout: the gradient through a fixed mask passes napkin check") {
  ir::Graph g = testing::compile_training(kMlp);
  // The backward rule is dropout again, of dy, with the forward's words and attributes: no mask is saved.
  int backward = 0;
  for (ir::NodeId id : g.schedule()) {
    const ir::Node& n = g.node(id);
    if (n.op != ir::Op::Dropout || n.phase != ir::Phase::Backward) continue;
    ++backward;
    const ir::Node& forward = g.node(n.origin);
    CHECK(forward.op == ir::Op::Dropout);
    CHECK(forward.attrs == n.attrs);
    CHECK(std::vector<ir::ValueId>(forward.inputs.begin() + 1, forward.inputs.end()) ==
          std::vector<ir::ValueId>(n.inputs.begin() + 1, n.inputs.end()));
  }
  CHECK(backward == 2);
  interp::GradCheckOptions options;
  options.samples = 6;
  interp::GradCheckResult r = interp::check_gradients(g, options);
  for (const interp::TensorCheck& t : r.tensors) {
    CAPTURE(t.name);
    CAPTURE(t.error_f64);
    CAPTURE(t.error_native);
    CHECK(t.passed);
  }
  CHECK(r.passed);
}

TEST_CASE("dropout: the CPU backend's kernels equal the interpreter's bit for bit") {
  // No transcendental next to the dropouts: every fused member is one
  // correctly rounded f32 operation on both sides.
  testing::CompiledStep step(testing::compile_training(R"yaml(
model: t
dims: {batch: 8, d: 100}
inputs: {x: {shape: [batch, d]}}
params:
  w: {shape: [d], init: ones}
forward:
  - h: dropout(x * w, 0.25)
  - y: dropout(h, 0.5) * 3
loss: mean(y * y)
optimizer: sgd(lr=0.1)
)yaml"));
  int checked = 0;
  testing::check_each_kernel(step, [&](const testing::KernelOutputCheck& c) {
    bool has_dropout = c.kernel->op == ir::Op::Dropout;
    if (c.kernel->fused)
      for (const codegen::FusedOp& op : c.kernel->fused->ops) has_dropout = has_dropout || op.op == ir::Op::Dropout;
    CAPTURE(c.kernel->name);
    if (has_dropout) {
      CHECK(c.error == 0);
      ++checked;
    } else {
      CHECK(c.error <= testing::kernel_tolerance(c.precision));
    }
  });
  CHECK(checked >= 2);  // the forward and the backward dropouts
}

TEST_CASE("dropout: a step recomputed under a memory budget draws the same masks") {
  auto compile = [](int64_t budget, passes::RecomputeReport* report, std::string* errors) -> std::optional<ir::Graph> {
    ir::Diagnostics diag;
    std::string text = std::string(kMlp);
    text = std::regex_replace(text, std::regex("batch: 16"), "batch: 256");
    std::optional<ir::Graph> g = frontend::load_model_text(text, "mlp_dropout.yaml", diag);
    REQUIRE(g.has_value());
    std::optional<passes::PipelineResult> result = passes::run_training_pipeline(*g, diag, {}, {budget});
    *errors = diag.render();
    if (!result) return std::nullopt;
    *report = result->recompute;
    return g;
  };
  std::string errors;
  passes::RecomputeReport none;
  std::optional<ir::Graph> base = compile(0, &none, &errors);
  REQUIRE(base.has_value());
  REQUIRE_FALSE(compile(1, &none, &errors).has_value());
  std::smatch match;
  REQUIRE(std::regex_search(errors, match, std::regex("the smallest budget that can be met is --memory-budget ([0-9]+)")));
  passes::RecomputeReport report;
  std::optional<ir::Graph> tight = compile(std::stoll(match[1]), &report, &errors);
  INFO(errors);
  REQUIRE(tight.has_value());
  bool recomputed_dropout = false;
  for (const passes::RecomputedValue& v : report.values) {
    recomputed_dropout = recomputed_dropout || v.op == "dropout";
  }
  CHECK(recomputed_dropout);

  // Every output and update bit-identical, on the same point.
  auto values = interp::initial_values(*base, 7);
  for (auto& [v, data] : interp::random_inputs(*base, 7)) values[v] = data;
  interp::Interpreter a(*base, interp::Numerics::Native), b(*tight, interp::Numerics::Native);
  a.set(values);
  b.set(values);
  a.run();
  b.run();
  REQUIRE(base->outputs.size() == tight->outputs.size());
  for (size_t i = 0; i < base->outputs.size(); ++i) {
    CAPTURE(base->outputs[i].first);
    CHECK(a.get(base->outputs[i].second) == b.get(tight->outputs[i].second));
  }
  for (size_t i = 0; i < base->updates.size(); ++i) CHECK(a.get(base->updates[i].value) == b.get(tight->updates[i].value));
}

TEST_CASE("dropout: each copy in a repeated block draws its own mask - and a dropout fuses with its elementwise chain") {
  ir::Graph g = testing::compile_training(R"yaml(
model: t
dims: {batch: 4, d: 8}
inputs: {x: {shape: [batch, d]}}
blocks:
  layer:
    params:
      w: {shape: [d, d], init: xavier}
    forward:
      - h: dropout(relu(x @ w), 0.1)
      - y: x + h
forward:
  - z: repeat(layer, 3, x)
loss: mean(z * z)
optimizer: sgd(lr=0.1)
)yaml");
  std::set<int64_t> streams;
  int forward = 0;
  for (ir::NodeId id : g.schedule()) {
    const ir::Node& n = g.node(id);
    if (n.op != ir::Op::Dropout || n.phase != ir::Phase::Forward) continue;
    ++forward;
    streams.insert(n.attrs.get_int("stream"));
    // relu, dropout and the residual add are one kernel.
    CHECK(n.group >= 0);
    int members = 0;
    for (ir::NodeId m : g.schedule()) members += g.node(m).group == n.group;
    CHECK(members >= 3);
    // The report's cost: 2 FLOPs per element; it reads x and the four rng words.
    ir::OpCost cost = ir::op_info(n.op).cost(g, n);
    CHECK(cost.flops == 2 * 4 * 8);
    CHECK(cost.bytes_read == 4 * 8 * 4 + 4 * 8);
  }
  CHECK(forward == 3);
  CHECK(streams.size() == 3);
}
