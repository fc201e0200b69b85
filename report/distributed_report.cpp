#include "report/distributed_report.h"

#include <fmt/format.h>

#include "ir/quantities.h"

namespace napkin::report {

std::string distributed_section_text(const analysis::DistributedStep& d, double tokens) {
  using ir::human_bytes;
  using ir::human_seconds;
  const analysis::Topology& t = d.topology;
  std::string out =
      t.two_level()
          ? fmt::format("\ndistributed step: {} ranks, {} nodes of {} over {}, {} between nodes (docs/report.md, "
                        "\"Distributed step\")\n",
                        d.ranks, t.nodes(), t.ranks_per_node, d.link->name, t.across->name)
          : fmt::format("\ndistributed step: {} ranks over {} ({}; docs/report.md, \"Distributed step\")\n", d.ranks,
                        d.link->name, d.link->description);
  if (d.micro_batches > 1)
    out += fmt::format("  global batch         {} ranks x {} micro-batches x {} tokens = {} tokens a step (the model's batch "
                       "is one micro-batch)\n",
                       d.ranks, d.micro_batches, ir::with_commas(tokens),
                       ir::with_commas(tokens * d.ranks * static_cast<double>(d.micro_batches)));
  else
    out += fmt::format("  global batch         {} x {} tokens = {} tokens a step (the model's batch is each rank's micro-batch)\n",
                       d.ranks, ir::with_commas(tokens), ir::with_commas(tokens * d.ranks));
  out += fmt::format("  gradients            {} in {} buckets of at least {} as the backward writes them (backward {})\n",
                     human_bytes(d.grad_bytes), d.buckets, human_bytes(analysis::kBucketBytes),
                     human_seconds(d.backward_seconds));
  out += fmt::format("  {:<15} {:>11} {:>10} {:>10} {:>10} {:>10} {:>7} {:>10} {:>10} {:>10} {:>10}\n", "", "sent/rank", "comm",
                     "hidden", "exposed", "step", "MFU", "params", "grads", "opt state", "peak/rank");
  for (const analysis::ZeroStage& z : d.stages)
    out += fmt::format("  {:<15} {:>11} {:>10} {:>10} {:>10} {:>10} {:>6.1f}% {:>10} {:>10} {:>10} {:>10}\n", analysis::zero_stage_name(z.stage),
                       human_bytes(z.bytes_sent), human_seconds(z.comm_seconds), human_seconds(z.hidden_seconds),
                       human_seconds(z.exposed_seconds), human_seconds(z.step_seconds), 100 * z.mfu, human_bytes(z.params),
                       human_bytes(z.grads), human_bytes(z.optimizer_state), human_bytes(z.peak));
  if (const std::optional<analysis::ExpertParallel>& e = d.expert_parallel; e && e->possible) {
    const analysis::ZeroStage& z = e->step;
    out += fmt::format("  {:<15} {:>11} {:>10} {:>10} {:>10} {:>10} {:>6.1f}% {:>10} {:>10} {:>10} {:>10}\n", "expert parallel",
                       human_bytes(z.bytes_sent), human_seconds(z.comm_seconds), human_seconds(z.hidden_seconds),
                       human_seconds(z.exposed_seconds), human_seconds(z.step_seconds), 100 * z.mfu, human_bytes(z.params),
                       human_bytes(z.grads), human_bytes(z.optimizer_state), human_bytes(z.peak));
    out += fmt::format("  expert parallel      {} expert{} of each moe() layer a rank; {} all-to-alls a step ({} moe() layer{} x 4 "
                       "(dispatch, combine, forward and backward) x {} micro-batch{}), each (N-1)/N of the rank's [E, C, d] "
                       "buffer: {}, {}, not hidden; the other parameters' {} of gradients all-reduced as data parallel\n",
                       e->experts_per_rank, e->experts_per_rank == 1 ? "" : "s", e->all_to_alls, e->layers,
                       e->layers == 1 ? "" : "s", d.micro_batches, d.micro_batches == 1 ? "" : "es",
                       human_bytes(e->all_to_all_bytes), human_seconds(e->all_to_all_seconds),
                       human_bytes(e->dense_grad_bytes));
  } else if (e) {
    out += fmt::format("  expert parallel      not possible: {} (the experts are sharded evenly over the ranks)\n", e->why_not);
  }
  out += fmt::format("  one rank             {} a step; ring collectives: all-reduce sends 2(N-1)/N of the bytes per rank, "
                     "reduce-scatter and all-gather (N-1)/N\n",
                     human_seconds(d.single_rank_seconds));
  for (const analysis::Interconnect* link : {d.link, t.two_level() ? t.across : nullptr})
    if (link)
      out += fmt::format("  {}: {:.4g} GB/s each way, {} a ring step: {}\n", link->name, link->bytes_per_s / 1e9,
                         human_seconds(link->latency_s), link->source);
  if (t.two_level())
    out += fmt::format("  two levels: each collective runs inside the nodes on {}, across them on {} for each rank's 1/{} "
                       "share; between nodes per rank: {}\n",
                       d.link->name, t.across->name, t.ranks_per_node, human_bytes(d.stages[0].across_bytes));
  return out;
}

namespace {

// One way of running the step over the ranks (a ZeRO stage, expert parallelism): what it sends, hides and
// exposes, its step and MFU, and each rank's memory.
nlohmann::json step_figures_json(const analysis::ZeroStage& z) {
  return {{"bytes_sent_per_rank", z.bytes_sent},
          {"bytes_across_nodes_per_rank", z.across_bytes},
          {"comm_s", z.comm_seconds},
          {"hidden_s", z.hidden_seconds},
          {"exposed_s", z.exposed_seconds},
          {"step_s", z.step_seconds},
          {"mfu", z.mfu},
          {"params_bytes", z.params},
          {"grads_bytes", z.grads},
          {"optimizer_state_bytes", z.optimizer_state},
          {"peak_bytes", z.peak}};
}

// {possible: false, reason} when the experts do not divide over the ranks.
nlohmann::json expert_parallel_json(const analysis::ExpertParallel& e) {
  using nlohmann::json;
  if (!e.possible) return {{"possible", false}, {"reason", e.why_not}};
  json j = step_figures_json(e.step);
  j.update({{"possible", true},
            {"experts_per_rank", e.experts_per_rank},
            {"moe_layers", e.layers},
            {"all_to_alls", e.all_to_alls},
            {"all_to_all_bytes_per_rank", e.all_to_all_bytes},
            {"all_to_all_s", e.all_to_all_seconds},
            {"dense_grad_bytes", e.dense_grad_bytes}});
  return j;
}

}  // namespace

nlohmann::json distributed_json(const analysis::DistributedStep& d, double tokens) {
  using nlohmann::json;
  json stages = json::array();
  for (const analysis::ZeroStage& z : d.stages) {
    json stage = step_figures_json(z);
    stage["stage"] = z.stage;
    stages.push_back(std::move(stage));
  }
  json across = nullptr;
  if (d.topology.two_level())
    across = {{"name", d.topology.across->name},
              {"bytes_per_s", d.topology.across->bytes_per_s},
              {"latency_s", d.topology.across->latency_s},
              {"source", d.topology.across->source}};
  json j = {{"ranks", d.ranks},
          {"nodes", d.topology.nodes()},
          {"ranks_per_node", d.topology.two_level() ? d.topology.ranks_per_node : d.ranks},
          {"inter_node", across},
          {"interconnect",
           {{"name", d.link->name},
            {"description", d.link->description},
            {"bytes_per_s", d.link->bytes_per_s},
            {"latency_s", d.link->latency_s},
            {"source", d.link->source}}},
          {"tokens_per_rank", tokens},
          {"micro_batches", d.micro_batches},
          {"global_tokens", tokens * d.ranks * static_cast<double>(d.micro_batches)},
          {"param_bytes", d.param_bytes},
          {"grad_bytes", d.grad_bytes},
          {"optimizer_state_bytes", d.state_bytes},
          {"buckets", d.buckets},
          {"bucket_bytes", analysis::kBucketBytes},
          {"backward_s", d.backward_seconds},
          {"single_rank_step_s", d.single_rank_seconds},
          {"stages", stages}};
  if (d.expert_parallel) j["expert_parallel"] = expert_parallel_json(*d.expert_parallel);
  return j;
}

std::string memory_fit_text(const analysis::MemoryFit& f) {
  using ir::human_bytes;
  std::string out = fmt::format(
      "  memory per rank      {} ({} bytes): a rank's peak with its activations at this micro-batch "
      "(docs/distributed.md, \"Memory per rank\")\n",
      human_bytes(f.limit), ir::with_commas(f.limit));
  out += fmt::format("  {:<14} {:>10}  {:<46} {}\n", "", "peak/rank", "to fit",
                     f.scales ? "largest model (layers at this width, no recompute)" : "largest model");
  for (const analysis::StageFit& s : f.stages) {
    const std::string fit =
        s.fits ? "fits"
        : s.budget > 0
            ? fmt::format("--memory-budget {} (peak/rank {})", s.budget, human_bytes(s.budget_need))
            : std::string("none can: recompute does not bring it under");
    const std::string largest =
        !f.scales ? "-"
        : s.largest_layers > 0
            ? fmt::format("{} layer{}, {:.4g} params ({} a layer)", s.largest_layers, s.largest_layers == 1 ? "" : "s", s.largest_params, human_bytes(s.per_layer))
            : std::string("not one layer");
    out += fmt::format("  {:<14} {:>10}  {:<46} {}\n", analysis::zero_stage_name(s.stage), human_bytes(s.need), fit, largest);
  }
  out += f.scales ? fmt::format("  same shape: only `layers` changes ({} here); a rank's peak a layer measured at {} "
                                "layers, {:.4g} parameters a layer; linear in layers\n",
                                f.layers, f.layers + 1, f.params_per_layer)
                  : "  same shape: the model has no `layers` dim to scale\n";
  return out;
}

nlohmann::json memory_fit_json(const analysis::MemoryFit& f) {
  using nlohmann::json;
  json stages = json::array();
  for (const analysis::StageFit& s : f.stages)
    stages.push_back({{"stage", s.stage},
                      {"peak_bytes", s.need},
                      {"fits", s.fits},
                      {"memory_budget", s.fits || s.budget == 0 ? json(nullptr) : json(s.budget)},
                      {"peak_bytes_with_budget", s.budget > 0 ? json(s.budget_need) : json(nullptr)},
                      {"peak_bytes_per_layer", f.scales ? json(s.per_layer) : json(nullptr)},
                      {"largest_layers", f.scales ? json(s.largest_layers) : json(nullptr)},
                      {"largest_params", f.scales ? json(s.largest_params) : json(nullptr)}});
  return {{"limit_bytes", f.limit},
          {"scaled_dim", f.scales ? json("layers") : json(nullptr)},
          {"layers", f.scales ? json(f.layers) : json(nullptr)},
          {"params_per_layer", f.params_per_layer},
          {"stages", stages}};
}

}  // namespace napkin::report
