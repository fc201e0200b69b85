// The report's mixture-of-experts figures (analysis/moe.h, report/moe_report.h,
// the expert-parallel step of analysis/distributed.h) against hand formulas,
// on a step whose moe() layer is spelled out with einsums and whose
// ir::Graph::moe_layers entry the test writes, as the frontend's moe() would.
#include <doctest/doctest.h>

#include <cmath>
#include <sstream>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "analysis/cost.h"
#include "analysis/devices.h"
#include "analysis/distributed.h"
#include "analysis/memory.h"
#include "analysis/moe.h"
#include "analysis/step_time.h"
#include "report/distributed_report.h"
#include "report/moe_report.h"
#include "report/report.h"
#include "support/test_io.h"
#include "support/test_models.h"

namespace napkin {
namespace {

// One expert layer of E experts over T tokens with C slots each, its
// dispatch gathered by `dispatch` (an expression giving xe [E, C, d]).
std::string expert_model(const std::string& dims, const std::string& extra_inputs, const std::string& dispatch) {
  return R"yaml(
model: fake-moe
dims: {)yaml" + dims + R"yaml(}
inputs:
  x: {shape: [T, d]}
  src: {shape: [E, C], dtype: i32}
)yaml" + extra_inputs + R"yaml(
params:
  router: {shape: [E, d], init: xavier}
  w_gate: {shape: [E, f, d], init: xavier}
  w_up: {shape: [E, f, d], init: xavier}
  w_down: {shape: [E, d, f], init: xavier}
  w_out: {shape: [d, d], init: xavier}
forward:
  - logits: einsum(x, router, "t d, e d -> t e")
  - xe: )yaml" + dispatch + R"yaml(
  - h: silu(einsum(xe, w_gate, "e c d, e f d -> e c f")) * einsum(xe, w_up, "e c d, e f d -> e c f")
  - ye: einsum(h, w_down, "e c f, e d f -> e c d")
  - y: einsum(ye, w_out, "e c d, o d -> e c o")
loss: mean(y) + mean(logits)
optimizer: adamw(lr=0.001)
train: {tokens_per_step: 12}
)yaml";
}

const char* const kDims = "T: 12, d: 8, E: 4, f: 6, C: 6";

ir::ValueId param_named(const ir::Graph& g, const std::string& name) {
  for (const ir::Param& p : g.params)
    if (g.value(p.value).name == name) return p.value;
  FAIL("no parameter " << name);
  return ir::kNoValue;
}

// The moe_layers entry moe() would make for the model's layer: top-k of E, T tokens, C slots.
void add_layer(ir::Graph& g, int64_t top_k, const std::string& dropped = "metric.moe_dropped.0") {
  ir::Graph::MoeLayer l;
  const ir::TensorType& xe = g.value(param_named(g, "w_gate")).type;
  l.experts = xe.dims[0].size;
  l.top_k = top_k;
  l.tokens = g.value(g.inputs[0]).type.dims[0].size;
  l.capacity = g.value(g.inputs[1]).type.dims[1].size;
  l.capacity_factor = static_cast<double>(l.capacity * l.experts) / static_cast<double>(l.tokens * top_k);
  l.d_model = xe.dims[2].size;
  l.router = param_named(g, "router");
  l.expert_params = {param_named(g, "w_gate"), param_named(g, "w_up"), param_named(g, "w_down")};
  l.dropped_output = dropped;
  g.moe_layers.push_back(l);
}

ir::Graph gathered_step(int64_t top_k = 2) {
  ir::Graph g = testing::compile_training(expert_model(kDims, "", "embedding(x, src)"));
  add_layer(g, top_k);
  return g;
}

TEST_CASE("moe report: active parameters are the total less (E-k)/E of each expert parameter, exactly") {
  const int64_t E = 4, d = 8, f = 6;
  const int64_t experts = 3 * E * f * d;             // w_gate, w_up, w_down
  const int64_t total = E * d + experts + d * d;     // + router, w_out
  for (int64_t k : {1, 2, 4}) {
    CAPTURE(k);
    ir::Graph g = gathered_step(k);
    const analysis::MoeFigures m = analysis::analyze_moe(g);
    CHECK(m.total_params == total);
    CHECK(m.active_params == total - experts * (E - k) / E);
    CHECK(m.active_exact);
    REQUIRE(m.layers.size() == 1u);
    CHECK(m.layers[0].expert_params == experts);
    CHECK(m.layers[0].slots() == 4 * 6);
    CHECK(m.layers[0].assignments() == 12 * k);
  }
  CHECK(analysis::analyze_moe(gathered_step(4)).active_params == total);  // k = E: every parameter active

  // Two layers reading the same experts: each parameter is counted once.
  ir::Graph shared = gathered_step(2);
  add_layer(shared, 2, "metric.moe_dropped.1");
  CHECK(analysis::analyze_moe(shared).active_params == total - experts / 2);

  // An expert parameter whose numel·(E-k) is no multiple of E: rounded down, and said.
  ir::Graph odd = testing::compile_training(expert_model(kDims, "", "embedding(x, src)"));
  add_layer(odd, 1);
  odd.moe_layers[0].experts = 5;  // each of 192 elements: 192·4/5 = 153.6
  const analysis::MoeFigures m = analysis::analyze_moe(odd);
  CHECK_FALSE(m.active_exact);
  CHECK(m.active_params == total - 3 * (192 * 4 / 5));  // 153 of each, not 460 of the three

  // No moe() layer: no figures, active is the total.
  ir::Graph plain = testing::compile_training(expert_model(kDims, "", "embedding(x, src)"));
  CHECK_FALSE(analysis::analyze_moe(plain).has_moe());
  CHECK(analysis::analyze_moe(plain).active_params == total);
}

TEST_CASE("moe report: all experts' memory is their parameters, gradients and AdamW's two moments") {
  const ir::Graph g = gathered_step();
  const analysis::MoeFigures m = analysis::analyze_moe(g);
  const int64_t experts = 3 * 4 * 6 * 8;
  CHECK(m.expert_param_bytes == 4 * experts);
  CHECK(m.expert_grad_bytes == 4 * experts);
  CHECK(m.expert_state_bytes == 2 * 4 * experts);
  REQUIRE(m.layers[0].dispatch_found);
  CHECK(m.layers[0].dispatch_dtype == ir::DType::F32);
  CHECK(m.layers[0].dispatch_bytes == 4 * 6 * 8 * 4);
}

TEST_CASE("moe report: the routing check passes the [E, C, d] dispatch and fails a [E, C, T] one-hot") {
  const analysis::MoeFigures gathered = analysis::analyze_moe(gathered_step());
  CHECK(gathered.no_tokens_experts_capacity_tensor);
  // The largest routing value has E·C routing elements (src, xe, h, ye, y: d and f are feature axes).
  CHECK(gathered.largest_routing_elements == 4 * 6);

  ir::Graph one_hot = testing::compile_training(
      expert_model(kDims, "  dispatch: {shape: [E, C, T]}\n", "einsum(dispatch, x, \"e c t, t d -> e c d\")"));
  add_layer(one_hot, 2);
  const analysis::MoeFigures m = analysis::analyze_moe(one_hot);
  CHECK_FALSE(m.no_tokens_experts_capacity_tensor);
  CHECK(m.largest_routing_elements == 12 * 4 * 6);
  CHECK(one_hot.value(m.largest_routing_value).name == "dispatch");

  // d == T == C (dropless, a context as wide as the model): [E, C, d] is still no [E, C, T], by d's name.
  // And a [T, heads, C] value with as many heads as experts is none either: its axis is named heads, not E.
  std::string square_model = expert_model("T: 6, d: 6, E: 4, f: 5, C: 6, heads: 4", "  kv: {shape: [T, heads, C]}\n",
                                          "embedding(x, src)");
  square_model.replace(square_model.find("loss: mean(y)"), 13, "loss: mean(kv) + mean(y)");
  ir::Graph square = testing::compile_training(square_model);
  add_layer(square, 2);
  const analysis::MoeFigures s = analysis::analyze_moe(square);
  CHECK(s.layers[0].capacity == s.layers[0].tokens);
  CHECK(s.no_tokens_experts_capacity_tensor);
  CHECK(s.largest_routing_elements == 4 * 6);
}

TEST_CASE("moe report: the text and JSON give the layer, the active count, 6·tokens·active and the check") {
  const ir::Graph g = gathered_step();
  const analysis::StepCost cost = analysis::analyze_step(g, nullptr);
  const analysis::MemoryReport memory = analysis::analyze_memory(g);
  const std::string text = report::render_report_text(g, cost, memory, {"fake.yaml", false});
  INFO(text);
  CHECK(text.find("  active per token                        384  (less (E-k)/E of each expert parameter") !=
        std::string::npos);
  CHECK(text.find("mixture of experts (1 moe() layer;") != std::string::npos);
  CHECK(text.find("(top level)                    4   2         12          6       1           24           24  "
                  "[4, 6, 8] f32, 768 B") != std::string::npos);
  CHECK(text.find("routing tensors      no [tokens, experts, capacity] tensor") != std::string::npos);
  // 6 · 12 tokens · 384 active parameters.
  CHECK(text.find("  6·tokens·active                      27,648  (27.6 KFLOP; counted step is") != std::string::npos);

  const nlohmann::json j = nlohmann::json::parse(report::render_report_json(g, cost, memory, {"fake.yaml", false}));
  CHECK(j.at("params").get<int64_t>() == 672);
  CHECK(j.at("params_active").get<int64_t>() == 384);
  CHECK(j.at("flops").at("six_tokens_active_params").get<double>() == 6.0 * 12 * 384);
  const nlohmann::json& moe = j.at("moe");
  CHECK(moe.at("no_tokens_experts_capacity_tensor") == true);
  CHECK(moe.at("params_active_exact") == true);
  CHECK(moe.at("layers")[0].at("capacity") == 6);
  CHECK(moe.at("layers")[0].at("dispatch_bytes") == 768);
  CHECK(moe.at("expert_memory").at("total") == 4 * 576 * 4);
  CHECK(moe.at("largest_routing_value").at("tokens_experts_capacity") == 12 * 4 * 6);
  CHECK_FALSE(moe.contains("dropped"));

  // A model without moe() layers has none of it.
  ir::Graph plain = testing::compile_training(expert_model(kDims, "", "embedding(x, src)"));
  const analysis::StepCost plain_cost = analysis::analyze_step(plain, nullptr);
  const analysis::MemoryReport plain_memory = analysis::analyze_memory(plain);
  const std::string plain_text = report::render_report_text(plain, plain_cost, plain_memory, {"fake.yaml", false});
  CHECK(plain_text.find("active") == std::string::npos);
  CHECK(plain_text.find("mixture of experts") == std::string::npos);
  const nlohmann::json pj = nlohmann::json::parse(report::render_report_json(plain, plain_cost, plain_memory, {"fake.yaml", false}));
  CHECK_FALSE(pj.contains("moe"));
  CHECK_FALSE(pj.contains("params_active"));
}

TEST_CASE("moe report: the tokens dropped are the last metrics record's, per layer and as a share of T·k per micro-batch") {
  std::string error;
  std::istringstream in(R"({"run": "r1", "start_step": 0}
{"step": 1, "loss": 2.5, "moe_dropped": {"0": 3}}
{"step": 2, "loss": 2.4, "moe_dropped": {"0": 5, "layers.9": 1}, "moe_load": {"0": [12, 6, 4, 2]}}
{"step": 3, "loss": 2.3}
{"summary": true, "steps": 3}
)");
  const std::optional<report::DroppedTokens> d = report::read_dropped_tokens(in, "m.jsonl", error);
  REQUIRE(d.has_value());
  CHECK(d->found);
  CHECK(d->step == 2);
  REQUIRE(d->layers.size() == 2u);
  CHECK(d->layers[0] == std::pair<std::string, double>{"0", 5});

  const ir::Graph g = gathered_step();
  const analysis::MoeFigures m = analysis::analyze_moe(g);
  const std::string text = report::moe_section_text(g, m, &*d, 1);
  INFO(text);
  CHECK(text.find("tokens dropped       (from m.jsonl, step 2:") != std::string::npos);
  // 5 of T·k = 12·2 = 24 assignments.
  CHECK(text.find("    0                                       5  (20.83% of T·k x 1 = 24)") != std::string::npos);
  CHECK(text.find("layers.9                                1  (not a moe() layer of this model)") != std::string::npos);
  const nlohmann::json j = report::moe_json(g, m, &*d, 1);
  CHECK(j.at("dropped").at("layers")[0].at("fraction").get<double>() == doctest::Approx(5.0 / 24));
  // Summed over 2 ranks x 2 micro-batches a rank: of 4 x 24 assignments.
  CHECK(report::moe_section_text(g, m, &*d, 4).find("5  (5.21% of T·k x 4 = 96)") != std::string::npos);
  CHECK(report::moe_json(g, m, &*d, 4).at("dropped").at("layers")[0].at("assignments") == 96);
  CHECK(j.at("dropped").at("layers")[1].at("fraction").is_null());
  // The load: 24 assignments over 4 experts, a mean of 6: the busiest 12 (2x), the idlest 2 (1/3).
  REQUIRE(d->load.size() == 1u);
  CHECK(text.find("    0                  busiest 2.00x the mean, idlest 0.33x, over 4 experts: 12 6 4 2") !=
        std::string::npos);
  CHECK(j.at("load")[0].at("max_over_mean").get<double>() == doctest::Approx(2.0));
  CHECK(j.at("load")[0].at("min_over_mean").get<double>() == doctest::Approx(1.0 / 3));

  std::istringstream without(R"({"step": 1, "loss": 2.5})" "\n");
  const std::optional<report::DroppedTokens> none = report::read_dropped_tokens(without, "old.jsonl", error);
  REQUIRE(none.has_value());
  CHECK_FALSE(none->found);
  CHECK(report::moe_section_text(g, m, &*none, 1).find("old.jsonl has no record with \"moe_dropped\"") != std::string::npos);
  CHECK(report::moe_json(g, m, &*none, 1).at("dropped").at("found") == false);

  std::istringstream bad("{\"step\": 1}\nnot json\n");
  CHECK_FALSE(report::read_dropped_tokens(bad, "bad.jsonl", error).has_value());
  CHECK(error.rfind("bad.jsonl:2: not a JSON line", 0) == 0);
}

TEST_CASE("distributed: an all-to-all sends (N-1)/N of the buffer in N-1 exchanges, and on two levels (L-1)/N inside and (N-L)/N across") {
  const analysis::Interconnect fast{"fast", "a test link", 100e9, 1e-6, "none"}, slow{"slow", "another", 10e9, 1e-5, "none"};
  const double b = 1e9;
  const analysis::Collective one = analysis::all_to_all(b, {8, &fast});
  CHECK(one.bytes == doctest::Approx(7.0 / 8 * b));
  CHECK(one.across_bytes == 0);
  CHECK(one.seconds == doctest::Approx(7.0 / 8 * b / 100e9 + 7 * 1e-6));
  CHECK(analysis::all_to_all(b, {1, &fast}).seconds == 0);
  const analysis::Collective two = analysis::all_to_all(b, {16, &fast, &slow, 8});
  CHECK(two.bytes == doctest::Approx(15.0 / 16 * b));
  CHECK(two.across_bytes == doctest::Approx(8.0 / 16 * b));
  CHECK(two.seconds == doctest::Approx(7.0 / 16 * b / 100e9 + 7 * 1e-6 + 8.0 / 16 * b / 10e9 + 1 * 1e-5));
}

TEST_CASE("distributed: expert parallelism adds 4 all-to-alls a moe() layer a micro-batch, shards the experts' state, all-reduces the rest") {
  const ir::Graph g = gathered_step();
  const analysis::Device& h100 = *analysis::find_device("h100");
  const analysis::StepCost cost = analysis::analyze_step(g, &h100);
  const analysis::MemoryReport memory = analysis::analyze_memory(g);
  const analysis::StepTime time = analysis::predict_step_time(g, cost, h100);
  const double peak = analysis::matmul_peak(h100, cost.matmul_dtype);
  const analysis::Interconnect link{"test", "a test link", 1e9, 1e-6, "none"};
  const analysis::MoeFigures moe = analysis::analyze_moe(g);
  for (int64_t micro_batches : {1, 3}) {
    CAPTURE(micro_batches);
    const analysis::DistributedStep d =
        analysis::predict_distributed(g, time, memory, cost.total.flops, peak, {2, &link}, micro_batches);
    REQUIRE(d.expert_parallel.has_value());
    const analysis::ExpertParallel& e = *d.expert_parallel;
    REQUIRE(e.possible);
    CHECK(e.experts_per_rank == 2);
    CHECK(e.all_to_alls == 4 * micro_batches);
    const double buffer = 4 * 6 * 8 * 4;  // [E, C, d] f32
    CHECK(e.all_to_all_bytes == doctest::Approx(4.0 * micro_batches * buffer / 2));
    CHECK(e.all_to_all_seconds == doctest::Approx(4.0 * micro_batches * (buffer / 2 / 1e9 + 1e-6)));
    CHECK(e.dense_grad_bytes == (4 * 8 + 8 * 8) * 4);  // router and w_out
    CHECK(e.step.bytes_sent == doctest::Approx(e.all_to_all_bytes + analysis::all_reduce_bytes(e.dense_grad_bytes, 2)));
    CHECK(e.step.exposed_seconds >= e.all_to_all_seconds);
    CHECK(e.step.hidden_seconds + e.step.exposed_seconds == doctest::Approx(e.step.comm_seconds));
    // The experts' parameters, gradients and moments halved; the rest whole.
    const analysis::ZeroStage& plain = d.stages[0];
    CHECK(e.step.params == doctest::Approx(plain.params - moe.expert_param_bytes / 2.0));
    CHECK(e.step.grads == doctest::Approx(plain.grads - moe.expert_grad_bytes / 2.0));
    CHECK(e.step.optimizer_state == doctest::Approx(plain.optimizer_state - moe.expert_state_bytes / 2.0));
    CHECK(e.step.peak < plain.peak);
    // The row under the ZeRO stages, and its line; the JSON.
    const std::string text = report::distributed_section_text(d, 12);
    INFO(text);
    CHECK(text.find("  expert parallel ") != std::string::npos);
    CHECK(text.find(fmt::format("expert parallel      2 experts of each moe() layer a rank; {} all-to-alls a step (1 moe() "
                                "layer x 4 (dispatch, combine, forward and backward) x {} micro-batch",
                                4 * micro_batches, micro_batches)) != std::string::npos);
    const nlohmann::json j = report::distributed_json(d, 12).at("expert_parallel");
    CHECK(j.at("possible") == true);
    CHECK(j.at("all_to_alls") == 4 * micro_batches);
    CHECK(j.at("all_to_all_bytes_per_rank").get<double>() == doctest::Approx(e.all_to_all_bytes));
    CHECK(j.at("peak_bytes").get<double>() == doctest::Approx(e.step.peak));
  }
  const analysis::DistributedStep odd = analysis::predict_distributed(g, time, memory, cost.total.flops, peak, {3, &link});
  REQUIRE(odd.expert_parallel.has_value());
  CHECK_FALSE(odd.expert_parallel->possible);
  CHECK(odd.expert_parallel->why_not == "4 experts do not divide over 3 ranks");
  CHECK(report::distributed_section_text(odd, 12).find("expert parallel      not possible: 4 experts do not divide over 3 ranks") !=
        std::string::npos);
  CHECK(report::distributed_json(odd, 12).at("expert_parallel") ==
        nlohmann::json{{"possible", false}, {"reason", "4 experts do not divide over 3 ranks"}});
  // Without moe() layers: no expert-parallel figures.
  const ir::Graph plain = testing::compile_training(expert_model(kDims, "", "embedding(x, src)"));
  const analysis::StepCost plain_cost = analysis::analyze_step(plain, &h100);
  const analysis::MemoryReport plain_memory = analysis::analyze_memory(plain);
  const analysis::StepTime plain_time = analysis::predict_step_time(plain, plain_cost, h100);
  CHECK_FALSE(analysis::predict_distributed(plain, plain_time, plain_memory, plain_cost.total.flops, peak, {2, &link})
                  .expert_parallel.has_value());
}

TEST_CASE("moe report: Mixtral-8x7B has 46,702,792,704 parameters and 12,879,925,248 active per token, in the text and the JSON") {
  // Mixtral's config: V 32000, d 4096, 32 layers of 32 query / 8 kv heads of 128, 8 experts of 14336, top-2, untied head.
  const int64_t V = 32000, d = 4096, L = 32, kv = 8 * 128, E = 8, k = 2, f = 14336;
  const int64_t experts = 3 * E * f * d;
  const int64_t layer = 2 * d * d + 2 * kv * d + 2 * d + E * d + experts;  // wq, wo, wk, wv, two norms, router, experts
  const int64_t total = 2 * V * d + d + L * layer;
  const int64_t active = total - L * experts * (E - k) / E;
  REQUIRE(total == 46702792704);
  REQUIRE(active == 12879925248);

  const ir::Graph g =
      testing::compile_training(testing::read_source("models/mixtral-8x7b.yaml"), "models/mixtral-8x7b.yaml");
  const analysis::StepCost cost = analysis::analyze_step(g, nullptr);
  const analysis::MemoryReport memory = analysis::analyze_memory(g);
  const std::string text = report::render_report_text(g, cost, memory, {"models/mixtral-8x7b.yaml", false});
  CHECK(text.find("  count                        46,702,792,704\n") != std::string::npos);
  CHECK(text.find("  active per token             12,879,925,248  (") != std::string::npos);
  CHECK(text.find("  layers.0 .. layers.31 (32)       8   2      4,096      4,096       4       32,768        8,192  "
                  "[8, 4096, 4096] f32, 512 MiB") != std::string::npos);
  // Dropless at d = T = C = 4096 with as many kv heads as experts: still no [tokens, experts, capacity] tensor.
  CHECK(text.find("routing tensors      no [tokens, experts, capacity] tensor") != std::string::npos);

  const nlohmann::json j = nlohmann::json::parse(report::render_report_json(g, cost, memory, {"models/mixtral-8x7b.yaml", false}));
  CHECK(j.at("params").get<int64_t>() == 46702792704);
  CHECK(j.at("params_active").get<int64_t>() == 12879925248);
  CHECK(j.at("flops").at("six_tokens_active_params").get<double>() == 6.0 * 4096 * 12879925248.0);
  const nlohmann::json& moe = j.at("moe");
  CHECK(moe.at("params_active_exact") == true);
  CHECK(moe.at("no_tokens_experts_capacity_tensor") == true);
  REQUIRE(moe.at("layers").size() == 32u);
  for (const nlohmann::json& l : moe.at("layers")) {
    CHECK(l.at("capacity") == 4096);
    CHECK(l.at("inactive_params").get<int64_t>() == experts * (E - k) / E);
  }
}

TEST_CASE("moe report: napkin report on models/moe.yaml reads the trainer's dropped tokens and prints expert parallelism") {
  const std::string napkin = NAPKIN_BINARY;
  testing::TempDir dir("moe-metrics");
  // A trainer's records (docs/runtime.md): the last with moe_dropped is read.
  testing::write_bytes(dir / "m.jsonl",
                       "{\"run\": \"a1\", \"start_step\": 0}\n"
                       "{\"step\": 10, \"loss\": 3.1, \"moe_dropped\": {\"layers.0\": 1, \"layers.1\": 1, \"layers.2\": 1, \"layers.3\": 1}}\n"
                       "{\"step\": 20, \"loss\": 3.0, \"moe_dropped\": {\"layers.0\": 100, \"layers.1\": 0, \"layers.2\": 7, \"layers.3\": 2048}}\n"
                       "{\"step\": 20, \"eval_loss\": 3.2}\n");
  const std::string metrics = " --metrics " + (dir / "m.jsonl");
  testing::CommandResult text = testing::run_in_source_tree(napkin + " report models/moe.yaml" + metrics);
  INFO(text.out);
  REQUIRE(text.status == 0);
  CHECK(text.out.find(", step 20: the (token, choice) assignments past capacity in a step, summed over its 1 micro-batch") !=
        std::string::npos);
  // T·k = 4·256 tokens x 2 = 2,048 assignments a micro-batch.
  CHECK(text.out.find("    layers.0                              100  (4.88% of T·k x 1 = 2,048)") != std::string::npos);
  CHECK(text.out.find("    layers.3                            2,048  (100.00% of T·k x 1 = 2,048)") != std::string::npos);
  testing::CommandResult accumulated = testing::run_in_source_tree(napkin + " report models/moe.yaml --accumulate 4" + metrics);
  CHECK(accumulated.out.find("    layers.0                              100  (1.22% of T·k x 4 = 8,192)") != std::string::npos);

  testing::CommandResult json = testing::run_in_source_tree(
      napkin + " report models/moe.yaml --json --no-ops --device h100 --ranks 8 --interconnect nvlink4" + metrics);
  REQUIRE(json.status == 0);
  const nlohmann::json j = nlohmann::json::parse(json.out);
  CHECK(j.at("moe").at("no_tokens_experts_capacity_tensor") == true);
  CHECK(j.at("moe").at("dropped").at("step") == 20);
  // --ranks 8: the counts are read as a run's on 8 ranks, summed over their 8 micro-batches.
  CHECK(j.at("moe").at("dropped").at("micro_batches") == 8);
  CHECK(j.at("moe").at("dropped").at("layers")[2].at("fraction").get<double>() == doctest::Approx(7.0 / (8 * 2048)));
  // 8 experts over 8 ranks: 4 layers x 4 all-to-alls, each 7/8 of the [8, 320, 256] f32 dispatch buffer.
  const nlohmann::json& ep = j.at("distributed").at("expert_parallel");
  CHECK(ep.at("experts_per_rank") == 1);
  CHECK(ep.at("all_to_alls") == 16);
  CHECK(ep.at("all_to_all_bytes_per_rank").get<double>() == doctest::Approx(16 * 7.0 / 8 * 8 * 320 * 256 * 4));

  // A file without the field, an unreadable one, a model without moe() layers.
  testing::write_bytes(dir / "old.jsonl", "{\"step\": 1, \"loss\": 2.0}\n");
  testing::CommandResult old = testing::run_in_source_tree(napkin + " report models/moe.yaml --metrics " + (dir / "old.jsonl"));
  CHECK(old.status == 0);
  CHECK(old.out.find("old.jsonl has no record with \"moe_dropped\"") != std::string::npos);
  testing::CommandResult missing = testing::run_in_source_tree(napkin + " report models/moe.yaml --metrics " + (dir / "none.jsonl"));
  CHECK(missing.status == 1);
  CHECK(missing.out.find("none.jsonl: cannot read it") != std::string::npos);
  testing::CommandResult dense = testing::run_in_source_tree(napkin + " report models/linear.yaml" + metrics);
  CHECK(dense.status == 1);
  CHECK(dense.out.find("models/linear.yaml has no moe() layer") != std::string::npos);
}

}  // namespace
}  // namespace napkin
