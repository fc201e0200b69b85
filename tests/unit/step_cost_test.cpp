// The training-step report against the lecture's identities, computed by hand:
// backward = 2× forward for weight matmuls (4·B·D·K for a layer whose input
// needs a gradient), Cruncher's step = 6·B·params minus the first layer's input
// gradient plus the loss and AdaGrad's own elementwise work, AdamW's 16 bytes
// per parameter, and the exact decomposition of the step against 6·T·P.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "analysis/cost.h"
#include "analysis/memory.h"
#include "passes/pipeline.h"
#include "report/report.h"
#include "support/test_models.h"

using namespace napkin;
using napkin::testing::compile_training;

namespace {
std::string read_model(const std::string& name) { return napkin::testing::read_source("models/" + name); }
}  // namespace

TEST_CASE("step cost: Cruncher's step is 6·B·params − 2·B·D² + the loss + AdaGrad's 7 FLOPs per parameter") {
  ir::Graph g = compile_training(read_model("cruncher.yaml"), "models/cruncher.yaml");
  const double B = 256, D = 1024, L = 4, P = D * D * L + D;
  analysis::StepCost c = analysis::analyze_step(g, nullptr);
  CHECK(c.params == P);
  // forward: the matmuls, then mse = sub, square, sum per element.
  CHECK(c.phase(ir::Phase::Forward).flops == 2 * B * P + 3 * B);
  // backward: every weight gets dW (2·B·fan_in·fan_out), every layer but the
  // first passes dx back (the data x needs no gradient); mse's gradient is
  // (pred − y) · (2/B): a sub and a mul per element and one scalar mul.
  CHECK(c.phase(ir::Phase::Backward).param_matmul_flops == 4 * B * P - 2 * B * D * D);
  CHECK(c.phase(ir::Phase::Backward).flops == 4 * B * P - 2 * B * D * D + 2 * B + 1);
  // AdaGrad: g², s + g², √s, + ε, g / (√s + ε), · lr, p − ... = 7 per element,
  // plus the step counter's increment.
  CHECK(c.phase(ir::Phase::Optimizer).flops == 7 * P + 1);
  CHECK(c.total.flops == 6 * B * P - 2 * B * D * D + 3 * B + 2 * B + 1 + 7 * P + 1);
}

TEST_CASE("step cost: a linear layer inside a network has a 4·B·D·K backward") {
  const double B = 64, D = 32, K = 16;
  ir::Graph g = compile_training(R"yaml(
model: two-layers
dims: {B: 64, D: 32, K: 16}
inputs: {x: {shape: [B, D]}}
params:
  w0: {shape: [D, D], init: xavier}
  w: {shape: [D, K], init: xavier}
forward:
  - y: (x @ w0) @ w
loss: mean(y)
optimizer: sgd(lr=0.1)
)yaml");
  analysis::StepCost c = analysis::analyze_step(g, nullptr);
  double w_backward = 0;
  for (const analysis::OpRow& row : c.rows) {
    const ir::Node& n = g.node(row.node);
    if (row.phase == ir::Phase::Backward && row.category == "param-matmul" && g.node(n.origin).loc.line == 9 &&
        g.value(g.node(n.origin).in(1)).name == "w")
      w_backward += row.cost.flops;
  }
  CHECK(w_backward == 4 * B * D * K);  // dW and dx of y = h @ w
  // w0's input is data: only its dW.
  CHECK(c.phase(ir::Phase::Backward).param_matmul_flops == 4 * B * D * K + 2 * B * D * D);
}

TEST_CASE("step cost: AdamW in fp32 keeps 16 bytes per parameter (params, grads, m, v)") {
  ir::Graph g = compile_training(read_model("gpt.yaml"), "models/gpt.yaml");
  analysis::MemoryReport m = analysis::analyze_memory(g);
  double p = static_cast<double>(g.param_count());
  using analysis::MemoryCategory;
  CHECK(m.category_bytes(MemoryCategory::Parameters) == 4 * p);
  CHECK(m.category_bytes(MemoryCategory::Gradients) == 4 * p);
  // m and v, plus the 8-byte step counter.
  CHECK(m.category_bytes(MemoryCategory::OptimizerState) == 8 * p + 8);
  CHECK(m.peak.bytes >= 16 * p);
  CHECK(m.peak.bytes == m.live_bytes.at(m.peak.position));
}

TEST_CASE("step cost: counted − 6·T·P splits exactly into the report's terms for every model") {
  for (const auto& model : napkin::testing::model_files()) {
    std::string name = model.filename().string();
    CAPTURE(name);
    ir::Graph g = compile_training(read_model(name), "models/" + name);
    analysis::StepCost c = analysis::analyze_step(g, nullptr);
    auto j = nlohmann::json::parse(report::render_report_json(g, c, analysis::analyze_memory(g), {name, false}));
    const auto& f = j["flops"];
    double t = c.tokens, p = static_cast<double>(c.params), p_mm = static_cast<double>(c.params_in_matmuls);
    double terms = -6 * t * (p - p_mm) + (f["param_matmul"]["forward"].get<double>() - 2 * t * p_mm) +
                   (f["param_matmul"]["backward"].get<double>() - 4 * t * p_mm) +
                   f["activation_matmul"]["forward"].get<double>() + f["activation_matmul"]["backward"].get<double>() +
                   f["other"]["forward"].get<double>() + f["other"]["backward"].get<double>() +
                   f["optimizer"].get<double>();
    CHECK(f["total"].get<double>() - f["six_tokens_params"].get<double>() == doctest::Approx(terms).epsilon(1e-12));
    CHECK(f["total"].get<double>() ==
          f["forward"].get<double>() + f["backward"].get<double>() + f["optimizer"].get<double>());
    // Backward weight matmuls never exceed 2× forward (dW and dx, less where x is data).
    CHECK(f["param_matmul"]["backward"].get<double>() <= 2 * f["param_matmul"]["forward"].get<double>());
    for (const char* key : {"grads", "optimizer", "activations", "peak"}) CHECK(j["memory"].contains(key));
  }
}

TEST_CASE("step cost: GPT's attention matches PaLM's 12·L·d·T per token") {
  ir::Graph g = compile_training(read_model("gpt.yaml"), "models/gpt.yaml");
  analysis::StepCost c = analysis::analyze_step(g, analysis::find_device("h100"));
  // gpt.yaml: L=4, d=256, T=128, batch 16. PaLM counts every (query, key)
  // pair, 12·L·d·T per token; the fused causal kernel computes T(T+1)/2 of the
  // T² pairs, so its matmul FLOPs are PaLM's times (T+1)/(2T).
  const double B = 16, T = 128, d = 256, L = 4;
  double attention = c.phase(ir::Phase::Forward).activation_matmul_flops + c.phase(ir::Phase::Backward).activation_matmul_flops;
  CHECK(attention == 12 * L * d * T * (B * T) * (T + 1) / (2 * T));
  auto j = nlohmann::json::parse(report::render_report_json(g, c, analysis::analyze_memory(g), {"gpt", false}));
  CHECK(j["flops"]["palm"]["layers"].get<double>() == L);
  CHECK(j["flops"]["palm"]["d"].get<double>() == d);
  CHECK(j["flops"]["palm"]["seq"].get<double>() == T);
  CHECK(j["time"]["roofline_ops_s"].get<double>() == doctest::Approx(c.total.seconds));
  CHECK(j["time"]["step_s"].get<double>() > 0);
}

TEST_CASE("step cost: PaLM's L, d and T come from the attention, not from RoPE's outer product") {
  // llama-rope computes its rotary angles with einsum(positions, inv_freq,
  // "s, f -> s f"), a matmul between activations at the top level before any
  // attention: read as attention it gave L = 3 scopes, d = 0.5, T = 4.
  ir::Graph g = compile_training(napkin::testing::read_source("tests/models/llama-rope.yaml"), "tests/models/llama-rope.yaml");
  analysis::StepCost c = analysis::analyze_step(g, analysis::find_device("h100"));
  auto j = nlohmann::json::parse(report::render_report_json(g, c, analysis::analyze_memory(g), {"llama-rope", false}));
  CHECK(j["flops"]["palm"]["layers"].get<double>() == 2);  // two layers' attention
  CHECK(j["flops"]["palm"]["d"].get<double>() == 32);      // heads · head_dim
  CHECK(j["flops"]["palm"]["seq"].get<double>() == 16);    // the keys
}

TEST_CASE("step cost: PaLM's terms from spelled-out attention, and a model without attention says it has none") {
  // gpt.yaml without attention fusion: the scores einsum each softmax reads.
  passes::PipelineOptions unfused;
  unfused.fuse_attention = false;
  ir::Graph gpt = compile_training(read_model("gpt.yaml"), "models/gpt.yaml", unfused);
  analysis::StepCost c = analysis::analyze_step(gpt, nullptr);
  auto j = nlohmann::json::parse(report::render_report_json(gpt, c, analysis::analyze_memory(gpt), {"gpt", false}));
  CHECK(j["flops"]["palm"]["layers"].get<double>() == 4);
  CHECK(j["flops"]["palm"]["d"].get<double>() == 256);
  CHECK(j["flops"]["palm"]["seq"].get<double>() == 128);

  ir::Graph mlp = compile_training(read_model("mlp.yaml"), "models/mlp.yaml");
  analysis::StepCost m = analysis::analyze_step(mlp, nullptr);
  std::string text = report::render_report_text(mlp, m, analysis::analyze_memory(mlp), {"mlp", false});
  CHECK(text.find("PaLM: no attention in the forward") != std::string::npos);
  CHECK(nlohmann::json::parse(report::render_report_json(mlp, m, analysis::analyze_memory(mlp), {"mlp", false}))["flops"]
            .count("palm") == 0);
}
