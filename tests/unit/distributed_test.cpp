// analysis/distributed: the distributed step's figures against hand formulas
// (ring collectives, ZeRO's shards), its invariants (one rank is the
// single-rank step, the overlap never hides more than the backward), and the
// report's section and errors.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>

#include <nlohmann/json.hpp>

#include "analysis/cost.h"
#include "analysis/devices.h"
#include "analysis/distributed.h"
#include "analysis/memory.h"
#include "analysis/step_time.h"
#include "frontend/frontend.h"
#include "passes/pipeline.h"
#include "support/test_io.h"
#include "support/test_models.h"

namespace napkin {
namespace {

using analysis::Interconnect;

TEST_CASE("distributed: ring collectives send 2(N-1)/N of the bytes for an all-reduce, (N-1)/N for the halves") {
  const Interconnect link{"test", "a test link", 100e9, 1e-5, "none"};
  for (int n : {1, 2, 3, 4, 8, 64}) {
    CAPTURE(n);
    const double b = 1e9;
    CHECK(analysis::all_reduce_bytes(b, n) == doctest::Approx(2.0 * (n - 1) / n * b));
    CHECK(analysis::reduce_scatter_bytes(b, n) == doctest::Approx(double(n - 1) / n * b));
    // An all-reduce is a reduce-scatter then an all-gather: twice the bytes and the steps.
    CHECK(analysis::all_reduce_seconds(b, n, link) == doctest::Approx(2 * analysis::reduce_scatter_seconds(b, n, link)));
    if (n > 1)
      CHECK(analysis::all_reduce_seconds(b, n, link) == doctest::Approx(2.0 * (n - 1) / n * b / 100e9 + 2 * (n - 1) * 1e-5));
  }
  CHECK(analysis::all_reduce_seconds(1e9, 1, link) == 0);
  CHECK(analysis::find_interconnect("NVLink4") != nullptr);
  CHECK(analysis::find_interconnect("carrier pigeon") == nullptr);
  CHECK(analysis::known_interconnect_names() == "100gbe, ib-ndr, nvlink4, pcie5, shm");
}

struct Fixture {
  ir::Graph g;
  analysis::StepCost cost;
  analysis::MemoryReport memory;
  analysis::StepTime time;
  double peak = 0;
  Fixture()
      : g(testing::compile_small_model(testing::source_path("models/gpt2-124m.yaml"), ir::PrecisionPolicy::BF16Mixed)) {
    const analysis::Device* h100 = analysis::find_device("h100");
    REQUIRE(h100 != nullptr);
    cost = analysis::analyze_step(g, h100);
    memory = analysis::analyze_memory(g);
    time = analysis::predict_step_time(g, cost, *h100);
    peak = analysis::matmul_peak(*h100, cost.matmul_dtype);
  }
  analysis::DistributedStep at(int ranks, const Interconnect& link) const {
    return analysis::predict_distributed(g, time, memory, cost.total.flops, peak, {ranks, &link});
  }
  analysis::DistributedStep at(const analysis::Topology& t) const {
    return analysis::predict_distributed(g, time, memory, cost.total.flops, peak, t);
  }
};

TEST_CASE("distributed: GPT-2's bytes per rank and memory per ZeRO stage are the hand formulas") {
  const Fixture f;
  const Interconnect& link = *analysis::find_interconnect("ib-ndr");
  for (int n : {2, 4, 8}) {
    CAPTURE(n);
    const analysis::DistributedStep d = f.at(n, link);
    const double P = d.param_bytes, G = d.grad_bytes, S = d.state_bytes;
    CHECK(P > 0);
    CHECK(P == doctest::Approx(4 * f.cost.params));  // one f32 copy of each parameter
    CHECK(G == P);  // f32 gradients of f32 master parameters
    CHECK(S == doctest::Approx(2 * P).epsilon(1e-3));  // AdamW's m and v (and the step counter)
    const double k = double(n - 1) / n;
    CHECK(d.stages[0].bytes_sent == doctest::Approx(2 * k * G));          // all-reduce the gradients
    CHECK(d.stages[1].bytes_sent == doctest::Approx(k * G + k * P));      // reduce-scatter, all-gather the parameters
    CHECK(d.stages[2].bytes_sent == doctest::Approx(k * G + k * P));      // the same traffic
    CHECK(d.stages[3].bytes_sent == doctest::Approx(k * G + 2 * k * P));  // gathered for the forward and the backward
    // Model states per rank: DeepSpeed's memory estimators' shards of the parameters and the optimizer state;
    // the gradients whole at every stage, as napkin's step writes them on every rank (its arena's bytes).
    CHECK(d.stages[0].params == doctest::Approx(P));
    CHECK(d.stages[0].optimizer_state == doctest::Approx(S));
    CHECK(d.stages[1].optimizer_state == doctest::Approx(S / n));
    CHECK(d.stages[1].grads == doctest::Approx(G));
    CHECK(d.stages[2].grads == doctest::Approx(G));
    CHECK(d.stages[3].grads == doctest::Approx(G));
    CHECK(d.stages[2].peak == d.stages[1].peak);
    CHECK(d.stages[2].params == doctest::Approx(P));
    CHECK(d.stages[3].params == doctest::Approx(P / n));
    // The unsharded sweep is the single-rank peak to the byte; sharding never raises it.
    CHECK(d.stages[0].peak == static_cast<double>(f.memory.peak.bytes));
    for (int s = 1; s < 4; ++s) CHECK(d.stages[s].peak <= d.stages[s - 1].peak);
    CHECK(d.stages[1].peak < d.stages[0].peak);
    for (const analysis::ZeroStage& z : d.stages) {
      CHECK(z.hidden_seconds + z.exposed_seconds == doctest::Approx(z.comm_seconds));
      CHECK(z.exposed_seconds >= 0);
      CHECK(z.mfu == doctest::Approx(f.cost.total.flops / (z.step_seconds * f.peak)));
      CHECK(z.mfu < 1);
    }
    CHECK(d.buckets >= 1);
  }
}

TEST_CASE("distributed: two levels send 2(L-1)/L inside a node and 2(M-1)/M of a 1/L share across, in three timed parts") {
  const Interconnect inside{"inside", "fast", 400e9, 2e-6, "none"}, across{"across", "slow", 50e9, 6e-6, "none"};
  const double b = 1e9;
  const analysis::Topology t{16, &inside, &across, 8};  // 2 nodes of 8
  REQUIRE(t.two_level());
  CHECK(t.nodes() == 2);
  const analysis::Collective ar = analysis::all_reduce(b, t);
  CHECK(ar.across_bytes == doctest::Approx(2.0 * 1 / 2 * b / 8));
  CHECK(ar.bytes == doctest::Approx(2.0 * 7 / 8 * b + b / 8));
  CHECK(ar.seconds == doctest::Approx(2 * (7.0 / 8 * b / 400e9 + 7 * 2e-6) + (b / 8 / 50e9 + 2 * 6e-6)));
  const analysis::Collective rs = analysis::reduce_scatter(b, t);
  CHECK(rs.across_bytes == doctest::Approx(0.5 * b / 8));
  CHECK(rs.seconds == doctest::Approx(7.0 / 8 * b / 400e9 + 7 * 2e-6 + 0.5 * b / 8 / 50e9 + 6e-6));
  // One node, or no second link: the one-level ring.
  const analysis::Topology one{8, &inside, &across, 8};
  CHECK(!one.two_level());
  CHECK(analysis::all_reduce(b, one).seconds == doctest::Approx(analysis::all_reduce_seconds(b, 8, inside)));
  // GPT-2 across 2 nodes, by bandwidth alone (no latency): cheaper than every rank on the slow link, dearer
  // than every rank on the fast one. (With latency, fewer ring steps can make two levels the cheapest.)
  const Fixture f;
  const Interconnect fast{"fast", "", 400e9, 0, "none"}, slow{"slow", "", 50e9, 0, "none"};
  const analysis::Topology nodes{16, &fast, &slow, 8};
  const double two = f.at(nodes).stages[0].comm_seconds;
  CHECK(two < f.at(16, slow).stages[0].comm_seconds);
  CHECK(two > f.at(16, fast).stages[0].comm_seconds);
  CHECK(f.at(nodes).stages[0].across_bytes == doctest::Approx(f.at(nodes).grad_bytes / 8));
}

TEST_CASE("distributed: one rank is the single-rank step, a free link hides everything, a slow one hides at most the backward") {
  const Fixture f;
  const analysis::DistributedStep one = f.at(1, *analysis::find_interconnect("nvlink4"));
  for (const analysis::ZeroStage& z : one.stages) CHECK(z.comm_seconds == 0);
  CHECK(one.stages[0].step_seconds == doctest::Approx(f.time.seconds));
  CHECK(one.stages[0].peak == static_cast<double>(f.memory.peak.bytes));

  const Interconnect free_link{"free", "instant", 1e30, 0, "none"};
  const analysis::DistributedStep fast = f.at(8, free_link);
  CHECK(fast.stages[0].exposed_seconds <= 1e-12);
  CHECK(fast.stages[0].step_seconds == doctest::Approx(f.time.seconds));

  const Interconnect slow{"slow", "a slow link", 1e6, 0, "none"};
  const analysis::DistributedStep d = f.at(4, slow);
  for (const analysis::ZeroStage& z : d.stages) {
    CHECK(z.comm_seconds > 100 * f.time.seconds);
    CHECK(z.hidden_seconds <= d.backward_seconds + (z.stage == 3 ? f.time.seconds : 0) + 1e-12);
  }
  // Plain data parallel: every byte on the link, one bucket after the other.
  CHECK(d.stages[0].comm_seconds == doctest::Approx(analysis::all_reduce_bytes(d.grad_bytes, 4) / 1e6));
}

TEST_CASE("distributed: napkin report --ranks --interconnect prints the section and JSON, and refuses what it cannot do") {
  const std::string napkin = NAPKIN_BINARY;
  const std::string model = " models/gpt2-124m.yaml --dims vocab=256,d=64,heads=4,layers=2,batch=4,seq=32 --no-ops";
  testing::CommandResult text = testing::run_in_source_tree(napkin + " report" + model + " --device h100 --ranks 4 --interconnect ib-ndr");
  INFO(text.out);
  REQUIRE(text.status == 0);
  CHECK(text.out.find("distributed step: 4 ranks over ib-ndr") != std::string::npos);
  CHECK(text.out.find("ZeRO-3") != std::string::npos);
  testing::CommandResult json = testing::run_in_source_tree(napkin + " report" + model + " --device h100 --ranks 4 --interconnect ib-ndr --json");
  REQUIRE(json.status == 0);
  const nlohmann::json d = nlohmann::json::parse(json.out).at("distributed");
  CHECK(d.at("ranks") == 4);
  CHECK(d.at("stages").size() == 4u);
  CHECK(d.at("global_tokens").get<double>() == 4 * d.at("tokens_per_rank").get<double>());
  CHECK(d.at("stages")[0].at("bytes_sent_per_rank").get<double>() == doctest::Approx(1.5 * d.at("grad_bytes").get<double>()));
  // The interconnects are in the device table's listing, with their sources.
  testing::CommandResult devices = testing::run_in_source_tree(napkin + " devices --sources");
  REQUIRE(devices.status == 0);
  CHECK(devices.out.find("nvlink4 (interconnect, built in)") != std::string::npos);
  CHECK(devices.out.find("a modelling figure of NCCL's order, not a measurement") != std::string::npos);
  // Without the flags: no section.
  testing::CommandResult plain = testing::run_in_source_tree(napkin + " report" + model + " --device h100 --json");
  REQUIRE(plain.status == 0);
  CHECK(!nlohmann::json::parse(plain.out).contains("distributed"));
  testing::CommandResult nodes = testing::run_in_source_tree(
      napkin + " report" + model + " --device h100 --ranks 16 --interconnect nvlink4 --ranks-per-node 8 --inter-node ib-ndr");
  REQUIRE(nodes.status == 0);
  CHECK(nodes.out.find("16 ranks, 2 nodes of 8 over nvlink4, ib-ndr between nodes") != std::string::npos);
  for (const char* bad : {" --device h100 --ranks 4", " --ranks 4 --interconnect nvlink4", " --device h100 --ranks 0 --interconnect nvlink4",
                          " --device h100 --interconnect nvlink4",
                          " --device h100 --ranks 4 --interconnect carrier-pigeon",
                          " --device h100 --ranks 12 --interconnect nvlink4 --ranks-per-node 8 --inter-node ib-ndr",
                          " --device h100 --ranks 16 --interconnect nvlink4 --ranks-per-node 8"}) {
    CAPTURE(bad);
    testing::CommandResult r = testing::run_in_source_tree(napkin + " report" + model + bad);
    CHECK(r.status == 1);
    CHECK(r.out.find("interconnects: 100gbe, ib-ndr, nvlink4, pcie5, shm") != std::string::npos);
  }
}

TEST_CASE("distributed: napkin estimate's data-parallel step is the same all-reduce, hidden at most behind 4/6 of the compute") {
  const Interconnect link{"test", "a test link", 10e9, 1e-5, "none"};
  // 1e9 params, 1e6 tokens a step on 8 GPUs of 1e15 FLOP/s at MFU 0.5: 1.5 s of compute, 1 s of backward.
  const analysis::DataParallelEstimate e = analysis::estimate_data_parallel(1e9, 1e6, 8, 1e15, 0.5, 4, link);
  CHECK(e.compute_seconds == doctest::Approx(6e15 / (8 * 1e15 * 0.5)));
  CHECK(e.backward_seconds == doctest::Approx(e.compute_seconds * 4 / 6));
  CHECK(e.bytes_sent == doctest::Approx(2.0 * 7 / 8 * 4e9));
  CHECK(e.comm_seconds == doctest::Approx(2.0 * 7 / 8 * 4e9 / 10e9 + 14 * 1e-5));
  CHECK(e.hidden_seconds == doctest::Approx(std::min(e.comm_seconds, e.backward_seconds)));
  CHECK(e.exposed_seconds == doctest::Approx(std::max(0.0, e.comm_seconds - e.backward_seconds)));
  CHECK(e.step_seconds == doctest::Approx(e.compute_seconds + e.exposed_seconds));
  // A slow link: what the backward cannot hide lowers the MFU in proportion.
  const Interconnect slow{"slow", "a slow link", 1e9, 0, "none"};
  const analysis::DataParallelEstimate s = analysis::estimate_data_parallel(1e9, 1e6, 8, 1e15, 0.5, 4, slow);
  CHECK(s.exposed_seconds == doctest::Approx(2.0 * 7 / 8 * 4e9 / 1e9 - s.backward_seconds));
  CHECK(s.mfu == doctest::Approx(0.5 * s.compute_seconds / s.step_seconds));
  CHECK(s.mfu < 0.5);

  const std::string napkin = NAPKIN_BINARY;
  testing::CommandResult r = testing::run_in_source_tree(
      napkin + " estimate --params 124e6 --tokens 10e9 --gpus 8 --device h100 --mfu 0.4 --interconnect nvlink4 --batch-tokens 524288");
  INFO(r.out);
  REQUIRE(r.status == 0);
  CHECK(r.out.find("data parallel on nvlink4") != std::string::npos);
  testing::CommandResult bad = testing::run_in_source_tree(napkin + " estimate --params 7e9 --tokens 1e12 --gpus 64 --interconnect 100gbe");
  CHECK(bad.status == 1);
  CHECK(bad.out.find("needs --interconnect, --batch-tokens and --tokens") != std::string::npos);
  CHECK(bad.out.find("training compute") == std::string::npos);  // refused before printing anything
}

}  // namespace
}  // namespace napkin

namespace napkin {
namespace {

TEST_CASE("distributed: K micro-batches run the forward and backward K times, the optimizer and the all-reduce once") {
  const Fixture f;
  const Interconnect& link = *analysis::find_interconnect("ib-ndr");
  double forward = 0, backward = 0;
  for (const analysis::KernelTime& k : f.time.kernels) {
    if (k.phase == ir::Phase::Forward) forward += k.seconds;
    if (k.phase == ir::Phase::Backward) backward += k.seconds;
  }
  const double optimizer_flops = f.cost.phase(ir::Phase::Optimizer).flops;
  const analysis::DistributedStep one = f.at(4, link);
  const analysis::DistributedStep four =
      analysis::predict_distributed(f.g, f.time, f.memory, f.cost.total.flops, f.peak, {4, &link}, 4, optimizer_flops);
  CHECK(four.micro_batches == 4);
  CHECK(four.single_rank_seconds == doctest::Approx(f.time.seconds + 3 * (forward + backward)));
  for (int stage = 0; stage < 3; ++stage) {
    CAPTURE(stage);
    // The same collectives, hidden behind the same (last) backward: only the compute grows.
    CHECK(four.stages[stage].bytes_sent == one.stages[stage].bytes_sent);
    CHECK(four.stages[stage].exposed_seconds == doctest::Approx(one.stages[stage].exposed_seconds));
    CHECK(four.stages[stage].step_seconds == doctest::Approx(one.stages[stage].step_seconds + 3 * (forward + backward)));
    const double flops = 4 * (f.cost.total.flops - optimizer_flops) + optimizer_flops;
    CHECK(four.stages[stage].mfu == doctest::Approx(flops / (four.stages[stage].step_seconds * f.peak)));
    CHECK(four.stages[stage].peak == one.stages[stage].peak);
  }
  // ZeRO-3 gathers the parameters before every micro-batch's forward and backward: 2·4 gathers, not 2.
  const double gather = analysis::reduce_scatter_bytes(four.param_bytes, 4);
  CHECK(four.stages[3].bytes_sent - one.stages[3].bytes_sent == doctest::Approx(6 * gather));
}

TEST_CASE("report: train.accumulate and --accumulate count K micro-batches a step and the f32 gradient sum") {
  const std::string napkin = NAPKIN_BINARY;
  const std::string model = " models/gpt2-124m.yaml --dims vocab=256,d=64,heads=4,layers=2,batch=4,seq=32 --no-ops --device h100";
  testing::CommandResult one = testing::run_in_source_tree(napkin + " report" + model + " --json");
  testing::CommandResult four = testing::run_in_source_tree(napkin + " report" + model + " --json --accumulate 4");
  REQUIRE(one.status == 0);
  REQUIRE(four.status == 0);
  const nlohmann::json a1 = nlohmann::json::parse(one.out), a4 = nlohmann::json::parse(four.out);
  const nlohmann::json& acc = a4.at("accumulation");
  const double step = a1.at("accumulation").at("flops").get<double>();
  const double optimizer = acc.at("optimizer_flops").get<double>();
  CHECK(a1.at("accumulation").at("micro_batches") == 1);
  CHECK(a1.at("accumulation").at("gradient_sum_bytes") == 0.0);
  CHECK(acc.at("micro_batches") == 4);
  CHECK(acc.at("tokens").get<double>() == 4 * a4.at("tokens").get<double>());
  CHECK(acc.at("flops").get<double>() == doctest::Approx(4 * (step - optimizer) + optimizer));
  CHECK(optimizer > 0);
  // One f32 per parameter element: every parameter has a gradient here.
  CHECK(acc.at("gradient_sum_bytes").get<double>() == 4.0 * a4.at("params").get<double>());
  CHECK(acc.at("predicted_step_s").get<double>() > 3 * a1.at("accumulation").at("predicted_step_s").get<double>());
  testing::CommandResult text = testing::run_in_source_tree(napkin + " report" + model + " --accumulate 4");
  REQUIRE(text.status == 0);
  CHECK(text.out.find("gradient accumulation: 4 micro-batches per step (--accumulate") != std::string::npos);
  CHECK(testing::run_in_source_tree(napkin + " report" + model + " --accumulate 0").status != 0);

  // The model's own train.accumulate, and a bad one with its line and column.
  testing::TempDir tmp("accumulate");
  std::string yaml = testing::read_source("models/gpt.yaml");
  const size_t train = yaml.find("\ntrain:\n");
  REQUIRE(train != std::string::npos);
  testing::write_bytes(tmp / "two.yaml", std::string(yaml).insert(train + 8, "  accumulate: 2\n"));
  testing::write_bytes(tmp / "zero.yaml", std::string(yaml).insert(train + 8, "  accumulate: 0\n"));
  testing::CommandResult two = testing::run_in_source_tree(napkin + " report " + tmp / "two.yaml" + " --no-ops");
  INFO(two.out);
  CHECK(two.status == 0);
  CHECK(two.out.find("gradient accumulation: 2 micro-batches per step (train.accumulate") != std::string::npos);
  testing::CommandResult zero = testing::run_in_source_tree(napkin + " report " + tmp / "zero.yaml" + " --no-ops");
  INFO(zero.out);
  CHECK(zero.status == 1);
  CHECK(zero.out.find("zero.yaml:" + std::to_string(std::count(yaml.begin(), yaml.begin() + train + 1, '\n') + 2) +
                      ":15") != std::string::npos);
  CHECK(zero.out.find("train.accumulate") != std::string::npos);
}

TEST_CASE("distributed: --memory-per-rank's state shares are the lecture's 16 bytes a parameter divided per stage") {
  // AdamW in fp32: params 4 + grads 4 + moments 8; 8 ranks of 80 GB.
  const auto shares = analysis::state_shares(4, 4, 8, 8, 80e9);
  CHECK(shares[0].bytes_per_param == 16);
  CHECK(shares[1].bytes_per_param == 4 + 4 + 8.0 / 8);
  CHECK(shares[2].bytes_per_param == 4 + (4 + 8.0) / 8);
  CHECK(shares[3].bytes_per_param == 16.0 / 8);
  CHECK(shares[0].largest_params == doctest::Approx(5e9));
  CHECK(shares[3].largest_params == doctest::Approx(40e9));  // the lecture's answer: 8 x 80 GB / 16
  CHECK(shares[2].largest_params == doctest::Approx(80e9 / 5.5));
}

// GPT-2 at small dims (tests/support/test_models.h) with activations that recompute can shrink (batch 8, seq 64),
// with `layers` and a recompute budget, as napkin report compiles it.
std::optional<analysis::CompiledMemory> small_gpt2(int64_t layers, int64_t budget) {
  frontend::LoadOptions options;
  options.dim_overrides = testing::small_dims().at("gpt2-124m");
  options.dim_overrides["batch"] = 8;
  options.dim_overrides["seq"] = 64;
  if (layers > 0) options.dim_overrides["layers"] = layers;
  ir::Diagnostics diag;
  std::optional<ir::Graph> g = frontend::load_model_file(testing::source_path("models/gpt2-124m.yaml"), diag, options);
  REQUIRE(g);
  if (!passes::run_training_pipeline(*g, diag, {}, {budget}) || diag.has_errors()) return std::nullopt;
  return analysis::CompiledMemory{analysis::analyze_memory(*g), static_cast<double>(g->param_count())};
}

TEST_CASE("distributed: --memory-per-rank fits each stage, finds the recompute budget and the largest model by layers") {
  const int ranks = 4;
  const std::optional<analysis::CompiledMemory> base = small_gpt2(0, 0);
  REQUIRE(base);
  double need[4];
  for (int s = 0; s < 4; ++s) need[s] = analysis::rank_memory(base->memory, s, ranks).peak;
  CHECK(need[0] == base->memory.peak.bytes);  // stage 0 is the single-rank step
  CHECK(need[3] < need[2]);
  CHECK(need[2] <= need[1]);
  CHECK(need[1] < need[0]);

  // 1 MiB a rank: no stage fits without recompute (1.42-1.66 MiB); the replicated step cannot (recompute's
  // smallest arena is above it), the sharded ones can.
  const double limit = 1024 * 1024;
  const analysis::MemoryFit f = analysis::fit_memory(base->memory, base->param_count, ranks, limit, small_gpt2);
  REQUIRE(f.scales);
  CHECK(f.layers == 2);  // small dims' layers, found from the parameter counts
  // GPT-2's block: 12 d^2 + 13 d parameters, besides wte V d + wpe T d + the final layernorm 2 d (V 16, T 64, d 32).
  const double d = 32;
  CHECK(f.params_per_layer == 12 * d * d + 13 * d);
  CHECK(base->param_count == 16 * d + 64 * d + 2 * d + 2 * (12 * d * d + 13 * d));
  for (const analysis::StageFit& z : f.stages) CHECK(!z.fits);
  CHECK(f.stages[0].budget == 0);
  CHECK(!small_gpt2(0, static_cast<int64_t>(limit)));  // even a 1 MiB arena is out of recompute's reach
  for (int s = 1; s < 4; ++s) CHECK(f.stages[s].budget > 0);
  const std::optional<analysis::CompiledMemory> four = small_gpt2(4, 0);
  REQUIRE(four);
  CHECK(four->param_count == base->param_count + 2 * f.params_per_layer);
  for (int s = 0; s < 4; ++s) {
    CAPTURE(s);
    const analysis::StageFit& z = f.stages[s];
    CHECK(z.need == need[s]);
    if (z.budget > 0) {
      // The budget it names, compiled: this stage's rank need is under the limit.
      const std::optional<analysis::CompiledMemory> with = small_gpt2(0, z.budget);
      REQUIRE(with);
      CHECK(analysis::rank_memory(with->memory, s, ranks).peak == z.budget_need);
      CHECK(z.budget_need <= limit);
    }
    // Linear in layers: the need a layer adds from 2 to 3 is what each adds from 3 to 4.
    CHECK(z.per_layer > 0);
    CHECK(analysis::rank_memory(four->memory, s, ranks).peak == doctest::Approx(z.need + 2 * z.per_layer));
  }
  // With room: every stage fits; its largest model's need fits, one more layer's does not, and ZeRO-3 trains
  // more layers than plain data parallel.
  const analysis::MemoryFit roomy = analysis::fit_memory(base->memory, base->param_count, ranks, 8 * limit, small_gpt2);
  for (const analysis::StageFit& z : roomy.stages) {
    CAPTURE(z.stage);
    CHECK(z.fits);
    CHECK(z.largest_layers >= 2);
    const double more = static_cast<double>(z.largest_layers - roomy.layers);
    CHECK(z.need + more * z.per_layer <= 8 * limit);
    CHECK(z.need + (more + 1) * z.per_layer > 8 * limit);
    CHECK(z.largest_params == base->param_count + more * roomy.params_per_layer);
  }
  CHECK(roomy.stages[3].largest_layers > roomy.stages[0].largest_layers);

  // A limit below any step's resident bytes: no budget can, and not one layer.
  const analysis::MemoryFit tiny = analysis::fit_memory(base->memory, base->param_count, ranks, 1024, small_gpt2);
  for (const analysis::StageFit& z : tiny.stages) {
    CHECK(!z.fits);
    CHECK(z.budget == 0);
    CHECK(z.largest_layers == 0);
  }
}

TEST_CASE("report: --memory-per-rank prints each stage's fit and the largest model, and in --json") {
  const std::string napkin = NAPKIN_BINARY;
  const std::string model =
      " models/gpt2-124m.yaml --dims vocab=256,d=64,heads=4,layers=2,batch=4,seq=32 --no-ops --device h100 --ranks 4 "
      "--interconnect nvlink4";
  testing::CommandResult text = testing::run_in_source_tree(napkin + " report" + model + " --memory-per-rank 1GiB");
  INFO(text.out);
  REQUIRE(text.status == 0);
  CHECK(text.out.find("memory per rank      1 GiB (1,073,741,824 bytes)") != std::string::npos);
  CHECK(text.out.find("same shape: only `layers` changes") != std::string::npos);
  testing::CommandResult json = testing::run_in_source_tree(napkin + " report" + model + " --json --memory-per-rank 1GiB");
  REQUIRE(json.status == 0);
  const nlohmann::json m = nlohmann::json::parse(json.out).at("distributed").at("memory_per_rank");
  CHECK(m.at("limit_bytes") == 1073741824.0);
  CHECK(m.at("params_per_layer") == 12.0 * 64 * 64 + 13 * 64);
  CHECK(m.at("layers") == 2);
  for (const nlohmann::json& s : m.at("stages")) CHECK(s.at("fits") == true);
  CHECK(m.at("stages").at(3).at("largest_layers").get<int64_t>() > m.at("stages").at(0).at("largest_layers").get<int64_t>());
  // Without the distributed step, or with a bad size: user errors.
  CHECK(testing::run_in_source_tree(napkin + " report models/gpt2-124m.yaml --memory-per-rank 1GiB").status == 1);
  CHECK(testing::run_in_source_tree(napkin + " report" + model + " --memory-per-rank lots").status == 1);
  testing::CommandResult both = testing::run_in_source_tree(napkin + " report" + model + " --memory-per-rank 1GiB --memory-budget 1GiB");
  CHECK(both.status == 1);
  CHECK(both.out.find("leave --memory-budget out") != std::string::npos);
  // estimate: the lecture's 8 x 80 GB question per stage.
  testing::CommandResult est = testing::run_in_source_tree(napkin + " estimate --gpus 8 --memory-per-rank 80GB");
  INFO(est.out);
  REQUIRE(est.status == 0);
  CHECK(est.out.find("ZeRO-3         2 bytes a parameter on a rank: largest model 4e+10 parameters") != std::string::npos);
  testing::CommandResult bad = testing::run_in_source_tree(napkin + " estimate --gpus 8 --memory-per-rank lots");
  CHECK(bad.status == 1);
  CHECK(bad.out == "error: --memory-per-rank: 'lots' is not a byte count\n    hint: e.g. --memory-per-rank 80GiB\n");
}

}  // namespace
}  // namespace napkin
