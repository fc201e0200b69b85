// The cost model against hand formulas: the lecture's linear layer, Cruncher's
// parameter count, GPT-2 small's 124,439,808 parameters, Llama 3.1 8B's
// 8,030,261,248 and its PaLM terms, attention FLOPs, and
// the exact decomposition of forward FLOPs against 2·tokens·params.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "analysis/cost.h"
#include "ir/rope.h"
#include "report/report.h"
#include "support/test_models.h"

using namespace napkin;
using napkin::testing::compile;

namespace {
ir::Graph compile_model_file(const std::string& name) {
  return compile(napkin::testing::read_source("models/" + name), "models/" + name);
}

double flops_of(const analysis::StepCost& c, const ir::Graph& g, ir::Op op) {
  double f = 0;
  for (const auto& row : c.rows)
    if (g.node(row.node).op == op) f += row.cost.flops;
  return f;
}
}  // namespace

TEST_CASE("a linear layer's forward is 2·B·D·K FLOPs (lecture sizes, nothing allocated)") {
  // CS336 lecture 2: B=16384, D=32768, K=8192.
  const double B = 16384, D = 32768, K = 8192;
  ir::Graph g = compile(R"yaml(
model: linear
dims: {B: 16384, D: 32768, K: 8192}
inputs: {x: {shape: [B, D]}}
params: {w: {shape: [D, K], init: xavier}}
forward:
  - y: x @ w
loss: mean(y)
optimizer: sgd(lr=0.1)
)yaml");
  analysis::StepCost c = analysis::analyze_step(g, nullptr);
  CHECK(flops_of(c, g, ir::Op::MatMul) == 2 * B * D * K);
  CHECK(c.params == D * K);
  // The mean reads every element of y once.
  CHECK(flops_of(c, g, ir::Op::ReduceMean) == B * K + 1);
  // Bytes: x and w read, y written (fp32).
  for (const auto& row : c.rows)
    if (g.node(row.node).op == ir::Op::MatMul) {
      CHECK(row.cost.bytes_read == 4 * (B * D + D * K));
      CHECK(row.cost.bytes_written == 4 * B * K);
    }
}

TEST_CASE("Cruncher: params = D·D·L + D and forward = 2·B·params + the loss") {
  ir::Graph g = compile_model_file("cruncher.yaml");
  const double B = 256, D = 1024, L = 4;
  analysis::StepCost c = analysis::analyze_step(g, nullptr);
  CHECK(c.params == D * D * L + D);
  CHECK(c.phase(ir::Phase::Forward).param_matmul_flops == 2 * B * (D * D * L + D));
  CHECK(c.tokens == B);
  // mse over B predictions: sub, square, sum per element.
  CHECK(c.phase(ir::Phase::Forward).other_flops == 3 * B);
}

TEST_CASE("GPT-2 small has 124,439,808 parameters, 7,087,872 per block") {
  ir::Graph g = compile_model_file("gpt2-124m.yaml");
  analysis::StepCost c = analysis::analyze_step(g, analysis::find_device("h100"));
  CHECK(c.params == 124439808);
  int64_t block0 = 0;
  for (const ir::Param& p : g.params)
    if (g.value(p.value).name.rfind("h.0.", 0) == 0) block0 += g.value(p.value).type.numel();
  CHECK(block0 == 7087872);
  CHECK(c.params - 1024 * 768 == 123653376);  // without the position embedding
  CHECK(c.tokens == 8 * 1024);
  // Attention (fused, causal): per layer, scores and mixing are each 2·hd FLOPs per visible
  // (query, key) pair, T(T+1)/2 of them per (batch, head).
  const double attention = 12 * 2 * (2.0 * 8 * 12 * (1024.0 * 1025 / 2) * 64);
  CHECK(c.phase(ir::Phase::Forward).activation_matmul_flops == attention);
  // Tied embeddings: the logits matmul uses wte, so wte counts as a matmul param.
  CHECK(c.params_in_matmuls == 50257 * 768 + 12 * (768 * 2304 + 768 * 768 + 2 * 768 * 3072));
  // Weight matmuls are exactly 2 FLOPs per matmul weight per token.
  CHECK(c.phase(ir::Phase::Forward).param_matmul_flops == 2 * c.tokens * c.params_in_matmuls);
}

TEST_CASE("Llama 3.1 8B has 8,030,261,248 parameters, 218,112,000 per layer - the report's PaLM line reads L 32, d 4096, T 8192") {
  // By hand: embeddings and head 2·V·d, the final norm d; per layer two norms
  // 2·d, q and o 2·d·d, k and v 2·(kv_heads·head_dim)·d, the MLP 3·hidden·d.
  const int64_t V = 128256, d = 4096, kv = 8 * 128, hidden = 14336, layers = 32;
  const int64_t per_layer = 2 * d + 2 * d * d + 2 * kv * d + 3 * hidden * d;
  CHECK(per_layer == 218112000);
  CHECK(2 * V * d + d + layers * per_layer == 8030261248);
  ir::Graph g = compile_model_file("llama3-8b.yaml");
  CHECK(g.param_count() == 8030261248);
  int64_t layer0 = 0;
  for (const ir::Param& p : g.params)
    if (g.value(p.value).name.rfind("layers.0.", 0) == 0) layer0 += g.value(p.value).type.numel();
  CHECK(layer0 == per_layer);
  // The PaLM term's L, d and T, as the text report prints them and in its JSON.
  ir::Graph step = napkin::testing::compile_training(napkin::testing::read_source("models/llama3-8b.yaml"),
                                                     "models/llama3-8b.yaml");
  analysis::StepCost c = analysis::analyze_step(step, analysis::find_device("h100"));
  CHECK(c.params == 8030261248);
  CHECK(c.tokens == 8192);
  const std::string text =
      report::render_report_text(step, c, analysis::analyze_memory(step), {"models/llama3-8b.yaml", false});
  INFO(text);
  CHECK(text.find("  count                         8,030,261,248\n") != std::string::npos);
  CHECK(text.find("params in matmuls, L = 32, d = 4,096, T = 8,192\n") != std::string::npos);
  auto j = nlohmann::json::parse(report::render_report_json(step, c, analysis::analyze_memory(step), {"llama3-8b", false}));
  CHECK(j["flops"]["palm"]["layers"].get<double>() == 32);
  CHECK(j["flops"]["palm"]["d"].get<double>() == 4096);
  CHECK(j["flops"]["palm"]["seq"].get<double>() == 8192);
  // The rotary embeddings add no kernel and no bytes: every layer's attention
  // and attention_grad rotates q and k as it loads them (passes/fuse_rope).
  int rope_nodes = 0, rotating_attention = 0;
  for (ir::NodeId id : step.schedule()) {
    const ir::Node& n = step.node(id);
    rope_nodes += n.op == ir::Op::Rope;
    rotating_attention += (n.op == ir::Op::Attention || n.op == ir::Op::AttentionGrad) && ir::has_rope(n.attrs, "rope_");
  }
  CHECK(rope_nodes == 0);
  CHECK(rotating_attention == 2 * 32);
}

TEST_CASE("the CS336-sized Llama has 12,718,592 parameters, 3,113,984 per layer") {
  const int64_t V = 256, d = 512, hidden = 1344, layers = 4;
  const int64_t per_layer = 2 * d + 4 * d * d + 3 * hidden * d;  // 16 key/value heads: k and v are d·d
  CHECK(per_layer == 3113984);
  ir::Graph g = compile_model_file("llama.yaml");
  CHECK(g.param_count() == 2 * V * d + d + layers * per_layer);
  CHECK(g.param_count() == 12718592);
}

TEST_CASE("forward - 2·T·P decomposes exactly into the report's terms") {
  for (const char* name : {"linear.yaml", "cruncher.yaml", "mlp.yaml", "gpt.yaml", "gpt2-124m.yaml"}) {
    CAPTURE(name);
    ir::Graph g = compile_model_file(name);
    analysis::StepCost c = analysis::analyze_step(g, nullptr);
    double two_tp = 2 * c.tokens * c.params;
    double terms = -2 * c.tokens * (c.params - c.params_in_matmuls) + (c.phase(ir::Phase::Forward).param_matmul_flops - 2 * c.tokens * c.params_in_matmuls) +
                   c.phase(ir::Phase::Forward).activation_matmul_flops + c.phase(ir::Phase::Forward).other_flops;
    CHECK(c.total.flops - two_tp == doctest::Approx(terms).epsilon(1e-12));
    CHECK(c.total.flops == c.phase(ir::Phase::Forward).param_matmul_flops + c.phase(ir::Phase::Forward).activation_matmul_flops + c.phase(ir::Phase::Forward).other_flops);
  }
}

TEST_CASE("views cost nothing - the rearrange copy costs its bytes") {
  ir::Graph g = compile_model_file("gpt.yaml");
  analysis::StepCost c = analysis::analyze_step(g, nullptr);
  int copies = 0;
  for (const auto& row : c.rows) {
    const ir::Node& n = g.node(row.node);
    if (ir::op_info(n.op).op_class == ir::OpClass::View) {
      CHECK(row.cost.flops == 0);
      CHECK(row.cost.bytes_read + row.cost.bytes_written == 0);
    }
    if (row.copies) {
      ++copies;
      CHECK(row.cost.bytes_read == 16 * 128 * 256 * 4);  // merging heads back: (b s (h hd)) after a permute
    }
  }
  CHECK(copies == 4);  // one per layer
}

TEST_CASE("roofline: compute- vs memory-bound on h100") {
  ir::Graph g = compile(R"yaml(
model: r
dims: {n: 4096}
inputs: {x: {shape: [n, n]}}
params: {w: {shape: [n, n], init: xavier}}
forward:
  - y: relu(x @ w)
loss: mean(y)
optimizer: sgd(lr=0.1)
)yaml");
  const analysis::Device* h100 = analysis::find_device("h100");
  REQUIRE(h100);
  analysis::StepCost c = analysis::analyze_step(g, h100);
  for (const auto& row : c.rows) {
    const ir::Node& n = g.node(row.node);
    if (n.op == ir::Op::MatMul) {
      CHECK(row.compute_bound);  // 2·n³ FLOPs over 3·n² floats: intensity n/6
      CHECK(row.seconds == doctest::Approx(2.0 * 4096 * 4096 * 4096 / h100->fp32_flops));
    }
    if (n.op == ir::Op::Relu) {
      CHECK_FALSE(row.compute_bound);
      CHECK(row.seconds == doctest::Approx(2.0 * 4096 * 4096 * 4 / h100->bandwidth_bytes_per_s));
    }
  }
}

TEST_CASE("report JSON has the documented keys") {
  ir::Graph g = compile_model_file("mlp.yaml");
  analysis::StepCost c = analysis::analyze_step(g, analysis::find_device("a100"));
  auto j = nlohmann::json::parse(report::render_report_json(g, c, analysis::analyze_memory(g), {"models/mlp.yaml", true}));
  CHECK(j["params"] == 1863690);
  CHECK(j["flops"]["forward"].get<double>() == c.total.flops);
  CHECK(j["bytes"]["forward"].get<double>() == c.total.bytes_read + c.total.bytes_written);
  CHECK(j["memory"]["params"] == 1863690 * 4);
  REQUIRE(j["ops"].is_array());
  CHECK(j["ops"].size() == c.rows.size());
  CHECK(j["ops"][0].contains("line"));
  CHECK(j["ops"][0].contains("seconds"));
  CHECK(j["device"]["name"] == "a100");
}

TEST_CASE("totals past 2^63 print exactly in the text report") {
  // The report used to cast FLOP totals to int64, undefined past 2^63.
  // A 2^25 x 2^25 matmul is 2^76 FLOPs; Llama-405B at 16M tokens a step is 1.3e22.
  ir::Graph g = compile(R"yaml(
model: huge
dims: {n: 2**25}
inputs: {x: {shape: [n, n]}}
params: {w: {shape: [n, n], init: zeros}}
loss: mean(x @ w)
optimizer: sgd(lr=0.1)
)yaml");
  analysis::StepCost c = analysis::analyze_step(g, analysis::find_device("h100"));
  CHECK(c.total.flops > 9.3e18);
  std::string text = report::render_report_text(g, c, analysis::analyze_memory(g), {"huge.yaml", false});
  // matmul 2^76 + mean 2^50 + 1 FLOPs, which a double holds as 2^76 + 2^50: printed in full.
  CHECK(text.find("75,557,864,851,814,230,261,760") != std::string::npos);
  CHECK(text.find("-9,223,372,036,854,775,808") == std::string::npos);
}

TEST_CASE("gelu counts 9 FLOPs per element in its tanh form and 5 exact") {
  ir::Graph g = compile(R"yaml(
model: g
inputs: {x: {shape: [10, 10]}}
forward:
  - a: gelu(x)
  - b: gelu(x, approximate="none")
loss: mean(a + b)
optimizer: sgd(lr=0.1)
)yaml");
  analysis::StepCost c = analysis::analyze_step(g, nullptr);
  std::vector<double> gelu_flops;
  for (const auto& row : c.rows)
    if (g.node(row.node).op == ir::Op::Gelu) gelu_flops.push_back(row.cost.flops);
  CHECK(gelu_flops == std::vector<double>{900, 500});
}

TEST_CASE("a device without a peak for the dtype gets no guessed time") {
  ir::Graph g = compile(R"yaml(
model: f8
inputs: {x: {shape: [64, 64], dtype: f8e4m3}}
params: {w: {shape: [64, 64], init: normal(0.02), dtype: f8e4m3}}
forward:
  - y: x @ w
loss: mean(cast(y, f32))
optimizer: sgd(lr=0.1)
)yaml");
  analysis::StepCost a100 = analysis::analyze_step(g, analysis::find_device("a100"));  // no fp8
  CHECK(a100.ops_without_peak == 1);
  std::string text = report::render_report_text(g, a100, analysis::analyze_memory(g), {"f8.yaml", true});
  CHECK(text.find("no f8e4m3 peak on a100") != std::string::npos);
  CHECK(text.find("INCOMPLETE: 1 kernel computes in a dtype a100 has no peak for") != std::string::npos);
  auto j = nlohmann::json::parse(report::render_report_json(g, a100, analysis::analyze_memory(g), {"f8.yaml", false}));
  CHECK(j["time"]["ops_without_peak"] == 1);
  CHECK(j["time"]["kernels_without_peak"] == 1);
  CHECK_FALSE(j.contains("ops"));  // --no-ops
  analysis::StepCost h100 = analysis::analyze_step(g, analysis::find_device("h100"));
  CHECK(h100.ops_without_peak == 0);
  for (const auto& row : h100.rows)
    if (g.node(row.node).op == ir::Op::MatMul)
      CHECK(row.seconds == doctest::Approx(std::max(2.0 * 64 * 64 * 64 / 1979e12, 3.0 * 64 * 64 / 3.35e12)));
}
