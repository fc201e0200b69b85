// moe() against the mixture of experts a user writes densely by hand, and its
// capacity against a hand count.
//
// The hand-written model routes every token through every expert and weighs
// the results by a dense gate: expert e is among a token's top k when fewer
// than k experts have a larger router probability (a [.., E, E] comparison),
// so it needs no top_k, no slots and no gathers; its load-balancing and z-loss
// terms are the formulas of docs/model-language.md written out. At a capacity
// factor of E/k nothing is dropped, so both compute the same function: their
// losses and gradients must agree, in the float64 interpreter and in the
// compiled CPU trainer in f32.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <iostream>
#include <set>
#include <string>
#include <vector>

#include "interp/gradient_check.h"
#include "interp/interpreter.h"
#include "support/compiled_step.h"
#include "support/test_io.h"
#include "support/test_models.h"

using namespace napkin;

namespace {

struct Routing {
  std::string name;   // moe()'s routing= and normalize= as written, "" for the defaults
  std::string gate;   // the hand-written weights from p{i} (probs), l{i} (logits), c{i} (the chosen mask)
};

const std::vector<Routing> kRoutings = {
    {"", "w{0}: p{0} * c{0} / sum(p{0} * c{0}, axis=-1, keepdims=true)"},
    {", normalize=false", "w{0}: p{0} * c{0}"},
    {", routing=topk_softmax", "w{0}: exp(l{0}) * c{0} / sum(exp(l{0}) * c{0}, axis=-1, keepdims=true)"},
};

// Two layers, x [batch=2, seq=6, d=8]: 12 tokens, 4 experts of ffn 6, top 2.
std::string model(const Routing& r, bool by_op, const std::string& capacity = "") {
  std::string params, forward;
  for (int i = 0; i < 2; ++i) {
    params += fmt::format(
        "  router{0}: {{shape: [experts, d], init: normal(0.5)}}\n"
        "  w_gate{0}: {{shape: [experts, ffn, d], init: normal(0.3)}}\n"
        "  w_up{0}: {{shape: [experts, ffn, d], init: normal(0.3)}}\n"
        "  w_down{0}: {{shape: [experts, d, ffn], init: normal(0.3)}}\n",
        i);
    const std::string in = i == 0 ? "x" : "x1";
    if (by_op) {
      forward += fmt::format("  - x{0}: {1} + moe({1}, router{2}, w_gate{2}, w_up{2}, w_down{2}, k=top_k{3}{4})\n",
                             i + 1, in, i, r.name, capacity);
      continue;
    }
    forward += fmt::format(
        "  - l{0}: einsum({1}, router{0}, \"b s d, e d -> b s e\")\n"
        "  - p{0}: softmax(l{0})\n"
        "  - beaten{0}: sum(cast(rearrange(p{0}, \"b s (one f) -> b s one f\", one=1) > "
        "rearrange(p{0}, \"b s (e one) -> b s e one\", one=1), f32), axis=-1)\n"
        "  - c{0}: cast(beaten{0} < top_k, f32)\n"
        "  - {2}\n"
        "  - h{0}: silu(einsum({1}, w_gate{0}, \"b s d, e f d -> b s e f\")) * einsum({1}, w_up{0}, \"b s d, e f d -> b s e f\")\n"
        "  - y{0}: einsum(einsum(h{0}, w_down{0}, \"b s e f, e d f -> b s e d\"), w{0}, \"b s e d, b s e -> b s d\")\n"
        "  - x{3}: {1} + y{0}\n"
        "  - lse{0}: log(sum(exp(l{0}), axis=-1))\n",
        i, in, fmt::format(fmt::runtime(r.gate), i), i + 1);
  }
  const std::string aux =
      by_op ? "0.1 * moe_load_balance() + 0.01 * moe_z_loss()"
            : "0.1 * experts * sum((sum(c0, axis=[0, 1]) + sum(c1, axis=[0, 1])) * (sum(p0, axis=[0, 1]) + "
              "sum(p1, axis=[0, 1]))) / (24 * 24) + 0.01 * (sum(lse0 * lse0) + sum(lse1 * lse1)) / 24";
  return fmt::format(R"yaml(
model: moe-{}
dims: {{batch: 2, seq: 6, d: 8, experts: 4, top_k: 2, ffn: 6}}
inputs:
  x: {{shape: [batch, seq, d], dtype: f32}}
  target: {{shape: [batch, seq, d], dtype: f32}}
params:
{}forward:
{}loss: mse(x2, target) + {}
optimizer: sgd(lr=0.1)
precision: fp32
)yaml",
                     by_op ? "op" : "hand", params, forward, aux);
}

}  // namespace

TEST_CASE("numeric: moe() equals the dense mixture of experts written by hand: loss (load balance and z-loss included) and gradients, each routing, f64 interpreter and compiled CPU") {
  std::vector<double> losses;
  for (const Routing& r : kRoutings) {
    CAPTURE(r.name);
    const ir::Graph hand = napkin::testing::compile_training(model(r, false), "hand.yaml");
    const ir::Graph op = napkin::testing::compile_training(model(r, true), "moe.yaml");
    REQUIRE(op.moe_layers.size() == 2);
    CHECK(op.moe_layers[0].capacity == 12);  // the default capacity factor E/k: C = T, dropless
    const napkin::testing::LossAndGradients hand64 = napkin::testing::evaluate_f64(hand),
                                            op64 = napkin::testing::evaluate_f64(op);
    const double f64 = napkin::testing::check_same_loss_and_gradients(hand64, op64, 1e-12);
    losses.push_back(op64.loss);
    const double f32 = napkin::testing::check_same_loss_and_gradients(napkin::testing::evaluate_compiled(hand),
                                                                       napkin::testing::evaluate_compiled(op), 2e-5);
    if (std::getenv("NAPKIN_NUMERIC_VERBOSE"))
      std::cout << fmt::format("moe vs dense by hand{:<24} loss {:.6f}  worst error: f64 {:.1e}, compiled f32 {:.1e}\n",
                               r.name, op64.loss, f64, f32);
  }
  // Renormalising matters; the softmax over the top k logits is, in exact
  // arithmetic, the top k of the softmax renormalised (the same weights).
  CHECK(std::fabs(losses[0] - losses[1]) > 1e-4);
  CHECK(std::fabs(losses[0] - losses[2]) <= 1e-12 * std::fabs(losses[0]));
}

namespace {

// One layer over 12 tokens of d=8: tokens 0-7 are all ones, tokens 8-11 all
// minus ones, and the router's rows are 3, 2, 1 and 0 times ones, so tokens
// 0-7 pick experts 0 then 1, tokens 8-11 experts 3 then 2.
std::string crafted(const std::string& capacity_factor) {
  return fmt::format(R"yaml(
model: moe-drops
dims: {{tokens: 12, d: 8, experts: 4, ffn: 6}}
inputs:
  x: {{shape: [tokens, d], dtype: f32}}
params:
  router: {{shape: [experts, d], init: zeros}}
  w_gate: {{shape: [experts, ffn, d], init: normal(0.3)}}
  w_up: {{shape: [experts, ffn, d], init: normal(0.3)}}
  w_down: {{shape: [experts, d, ffn], init: normal(0.3)}}
forward:
  - y: moe(x, router, w_gate, w_up, w_down, k=2, capacity_factor={})
loss: sum(y * y)
optimizer: sgd(lr=0.1)
precision: fp32
)yaml",
                     capacity_factor);
}

struct CraftedRun {
  double dropped = 0;
  std::vector<double> y;  // [12, 8]
};

CraftedRun run_crafted(const std::string& capacity_factor, int64_t expected_capacity) {
  const ir::Graph g = napkin::testing::compile_training(crafted(capacity_factor), "drops.yaml");
  REQUIRE(g.moe_layers.size() == 1);
  CHECK(g.moe_layers[0].capacity == expected_capacity);
  std::map<ir::ValueId, std::vector<double>> values = interp::initial_values(g, 7);
  std::vector<double> x(12 * 8), router(4 * 8);
  for (int t = 0; t < 12; ++t)
    for (int i = 0; i < 8; ++i) x[static_cast<size_t>(t * 8 + i)] = t < 8 ? 1.0 : -1.0;
  for (int e = 0; e < 4; ++e)
    for (int i = 0; i < 8; ++i) router[static_cast<size_t>(e * 8 + i)] = 3.0 - e;
  values[g.inputs.at(0)] = x;
  values[g.params.at(0).value] = router;
  interp::Interpreter it(g, interp::Numerics::Float64);
  it.set(values);
  it.run();
  CraftedRun r;
  r.dropped = it.get(g.find_output(g.moe_layers[0].dropped_output))[0];
  for (ir::ValueId v = 0; v < static_cast<ir::ValueId>(g.num_values()); ++v)
    if (g.value(v).name == "y") r.y = it.get(v);
  REQUIRE(r.y.size() == 96);
  return r;
}

}  // namespace

TEST_CASE("numeric: moe() drops the (token, choice) pairs past an expert's capacity, first choices first, as a hand count says") {
  // Experts 0 and 1 get 8 tokens each, 2 and 3 get 4. Capacity factor 1:
  // C = ceil(1 * 12 * 2 / 4) = 6 slots, so experts 0 and 1 drop 2 pairs each.
  // Choice-major: tokens 0-5 fill expert 0's slots with their first choices
  // and expert 1's with their second; tokens 6 and 7 lose both and get 0.
  const CraftedRun tight = run_crafted("1", 6);
  CHECK(tight.dropped == 4);
  // Capacity factor 2 (E/k): C = 12, nothing dropped.
  const CraftedRun roomy = run_crafted("2", 12);
  CHECK(roomy.dropped == 0);
  for (int t = 0; t < 12; ++t)
    for (int i = 0; i < 8; ++i) {
      CAPTURE(t);
      const size_t at = static_cast<size_t>(t * 8 + i);
      if (t == 6 || t == 7) {
        CHECK(tight.y[at] == 0.0);
        CHECK(roomy.y[at] != 0.0);
      } else {
        CHECK(tight.y[at] == roomy.y[at]);  // the same experts, the same weights
      }
    }
  // 1.25: C = ceil(7.5) = 8: experts 0 and 1 fit exactly.
  CHECK(run_crafted("1.25", 8).dropped == 0);
  // 0.5: C = 3: 5 + 5 + 1 + 1 dropped.
  CHECK(run_crafted("0.5", 3).dropped == 12);
}

TEST_CASE("numeric: napkin check passes models/moe.yaml (router, experts, load-balancing loss), dropless and with drops") {
  // At the file's inits the router logits are all near 0, so the check's
  // steps cross ties of experts: interp::check_gradients takes such a step
  // again smaller (interp/gradient_check.h).
  for (int64_t percent : {200, 100}) {  // E/k = 2: nothing dropped; 1: some pairs dropped
    CAPTURE(percent);
    frontend::LoadOptions options;
    options.dim_overrides = {{"batch", 2},  {"seq", 8},           {"vocab", 32},
                             {"d", 16},     {"heads", 2},         {"kv_heads", 1},
                             {"experts", 4}, {"expert_hidden", 12}, {"layers", 2},
                             {"capacity_percent", percent}};
    ir::Graph g = napkin::testing::compile_model_file(napkin::testing::source_path("models/moe.yaml"), options,
                                                      ir::PrecisionPolicy::FP32);
    REQUIRE(g.moe_layers.size() == 2);
    interp::GradCheckOptions check;
    check.samples = 4;
    const interp::GradCheckResult r = interp::check_gradients(g, check);
    CHECK(r.tensors.size() == g.params.size());
    for (const interp::TensorCheck& t : r.tensors) {
      CAPTURE(t.name);
      CHECK(t.error_f64 <= t.tolerance_f64);
      CHECK(t.error_native <= t.tolerance_native);
    }
    CHECK(r.passed);
  }
}

TEST_CASE("numeric: moe() layers get distinct metric names, a huge capacity factor is dropless, and a view of a fused weight counts as its parameter") {
  const std::string yaml = R"yaml(
model: moe-two
dims: {batch: 2, seq: 4, d: 8, experts: 4, ffn: 6, layers: 2}
inputs:
  x: {shape: [batch, seq, d], dtype: f32}
params:
  router: {shape: [experts, d], init: normal(0.5)}
  w_gate_up: {shape: [experts, 2 * ffn, d], init: normal(0.3)}
  w_down: {shape: [experts, d, ffn], init: normal(0.3)}
blocks:
  layer:
    params:
      r: {shape: [experts, d], init: normal(0.5)}
      g: {shape: [experts, ffn, d], init: normal(0.3)}
      u: {shape: [experts, ffn, d], init: normal(0.3)}
      w: {shape: [experts, d, ffn], init: normal(0.3)}
    forward:
      - x: x + moe(x, r, g, u, w, k=2)
      - x: x + moe(x, r, g, u, w, k=2, capacity_factor=1e30)
forward:
  - x: repeat(layer, layers, x, prefix="layers")
  - gu: rearrange(w_gate_up, "e (two f) d -> two e f d", two=2)
  - y: x + moe(x, router, gu[0], gu[1], w_down, k=2)
loss: mean(y * y) + 0.01 * moe_load_balance()
optimizer: sgd(lr=0.1)
precision: fp32
)yaml";
  const ir::Graph g = napkin::testing::compile_training(yaml, "two.yaml");
  REQUIRE(g.moe_layers.size() == 5);
  std::set<std::string> names;
  for (const ir::Graph::MoeLayer& l : g.moe_layers) names.insert(l.dropped_output);
  CHECK(names.size() == 5);
  CHECK(names.count("metric.moe_dropped.layers.0") == 1);
  CHECK(names.count("metric.moe_dropped.layers.0.1") == 1);
  CHECK(names.count("metric.moe_dropped.4") == 1);  // the top-level one: its index
  CHECK(g.moe_layers[1].capacity == 8);  // capacity_factor 1e30: C = T, not an overflow
  // The top-level layer's gate and up are views of w_gate_up: it counts once, as an expert parameter.
  REQUIRE(g.moe_layers[4].expert_params.size() == 2);
  CHECK(g.value(g.moe_layers[4].expert_params[0]).name == "w_gate_up");
  CHECK(g.value(g.moe_layers[4].expert_params[1]).name == "w_down");
}
