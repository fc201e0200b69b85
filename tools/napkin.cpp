// The napkin driver: one subcommand per thing a user does.
//
//   napkin report MODEL.yaml [--device h100] [--json]   the static resource report of a training step
//   (report, build and train take --memory-budget BYTES: recompute activations so the arena fits)
//   napkin ir MODEL.yaml [--print-after PASS]           the IR as text
//   napkin graph MODEL.yaml --dot [-o FILE]             the step as Graphviz, fusion groups drawn
//   napkin check MODEL.yaml [--dims d=32,layers=2]      gradients vs float64 finite differences
//   napkin build MODEL.yaml -o TRAINER                  a standalone trainer executable (CPU, LLVM)
//   napkin build MODEL.yaml --target cuda -o TRAINER    ... for an NVIDIA GPU (NVRTC, --arch sm_90)
//   napkin train MODEL.yaml [--target cuda] [-- TRAINER FLAGS]   build (cached) and run the trainer
//   napkin data encode TEXT... -o FILE [--tokenizer tokenizer.json]   a token file (u16/u32, llm.c's header with --llmc)
//   napkin data bpe TEXT... --vocab N -o tok.json       train a byte-level BPE tokenizer (tokenizer.json)
//   napkin data decode FILE [--tokenizer tok.json]      a token file's text
//   napkin hf import MODEL.yaml HF_PATH -o WEIGHTS      a transformers checkpoint's weights, for --init and sample
//   napkin hf export MODEL.yaml CKPT -o DIR             a checkpoint for transformers' from_pretrained
//   napkin estimate --params 70e9 --tokens 15e12 ...    the lecture's napkin math
//   napkin devices [--sources]                          the device table, where each figure comes from
//   napkin devices --measure [--out FILE] [--quick]     measure this host, write the local device file
//   napkin ops                                          the op table
//
// Every command but `devices --measure` first reads the local device file
// (analysis::local_device_file(): $NAPKIN_DEVICES, else ~/.config/napkin/devices.json),
// whose rows replace the built-in ones; a broken file stops it with status 1.
//
// Exit status: 0 success, 1 a user error (bad model, bad flag), 2 an internal
// error (a bug in napkin, reported with the compiler's file:line).
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <unistd.h>

#include <chrono>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "codegen/cpu/build.h"
#ifdef NAPKIN_HAVE_CUDA
#include "codegen/cuda/build.h"
#endif
#include "analysis/cost.h"
#include "analysis/devices.h"
#include "analysis/distributed.h"
#include "analysis/estimate.h"
#include "analysis/inference.h"
#include "frontend/frontend.h"
#include "interp/gradient_check.h"
#include "ir/internal_check.h"
#include "ir/printer.h"
#include "ir/quantities.h"
#include "passes/fuse_attention.h"
#include "passes/derive_inference.h"
#include "passes/fuse_classifier.h"
#include "passes/pipeline.h"
#include "report/graph_dot.h"
#include "report/html_report.h"
#include "report/inference_report.h"
#include "report/report.h"
#include "runtime/error.h"
#include "runtime/tokenizer.h"
#include "tools/bpe_train.h"
#include "tools/decode_tokens.h"
#include "tools/devices_command.h"
#include "tools/files.h"
#include "tools/huggingface.h"
#include "tools/inference_program.h"
#include "tools/plot_command.h"
#include "tools/checkpoint_command.h"
#include "tools/token_files.h"
#include "tools/trainer_build.h"
#include "tools/trainer_cache.h"

namespace {

using namespace napkin;

constexpr int kUserError = 1;
constexpr int kInternalError = 2;

// --dims as overrides; a bad value is printed and gives nullopt.
std::optional<std::map<std::string, int64_t>> dims_or_error(const std::string& text) {
  if (text.empty()) return std::map<std::string, int64_t>{};
  std::string error;
  auto overrides = frontend::parse_dim_overrides(text, error);
  if (!overrides)
    std::cerr << fmt::format("error: --dims: {}\n    hint: write --dims name=value,name=value, e.g. --dims d=32,layers=2\n",
                             error);
  return overrides;
}

// The flags of every command that builds the training step (report, ir,
// graph, check, build, train): passes to leave out, to compare the step
// with and without them.
struct PipelineFlags {
  bool unfused_attention = false;   // keep the spelled-out attention a model writes
  bool unfused_rope = false;        // keep the rope of attention's q and k a kernel of its own (passes/fuse_rope.h)
  bool unfused_classifier = false;  // keep a language-model head's matmul and cross_entropy apart
  bool unfused_epilogues = false;   // keep a contraction's widening cast a kernel of its own (passes/matmul_epilogues.h)
  bool no_rematerialize = false;    // keep every saved activation as the forward made it (passes/rematerialize.h)
  int zero = 0;                     // 3: the step gathers its parameters and reduces their gradients (ZeRO-3)
  bool keep_gathered = false;       // ZeRO-3: the backward reads the forward's gathered parameters
  bool no_prefetch = false;         // ZeRO-3: each gather right before its first use, not ahead of it
  // ZeRO-3's time model for the prefetch: a device row and a link ("" the cpu row and shm); set by the command.
  std::string shard_device, shard_link;
  int shard_ranks = 8;

  passes::PipelineOptions apply(passes::PipelineOptions options) const {
    options.fuse_attention = !unfused_attention;
    options.fuse_rope = !unfused_rope;
    options.fuse_classifier = !unfused_classifier;
    options.matmul_epilogues = !unfused_epilogues;
    options.rematerialize = !no_rematerialize;
    options.shard_parameters = zero == 3;
    options.keep_gathered = keep_gathered;
    options.prefetch = !no_prefetch;
    options.shard_device = shard_device.empty() ? nullptr : analysis::find_device(shard_device);
    options.shard_link = shard_link.empty() ? nullptr : analysis::find_interconnect(shard_link);
    options.shard_ranks = shard_ranks;
    return options;
  }
};

void add_pipeline_flags(CLI::App* command, PipelineFlags& flags) {
  command->add_flag("--unfused-attention", flags.unfused_attention, "keep spelled-out attention unfused (to compare)");
  command->add_flag("--unfused-rope", flags.unfused_rope,
                    "keep the rope of attention's q and k a kernel of its own, not applied as attention loads them (to "
                    "compare)");
  command->add_flag("--unfused-classifier", flags.unfused_classifier,
                    "keep the language-model head's matmul and cross_entropy apart (to compare)");
  command->add_flag("--unfused-epilogues", flags.unfused_epilogues,
                    "keep a matmul's widening cast, bias, residual and gelu kernels of their own: no GEMM epilogues (to "
                    "compare)");
  command->add_flag("--no-rematerialize", flags.no_rematerialize,
                    "keep every saved activation as the forward made it (to compare)");
  command->add_option("--zero", flags.zero,
                      "3: build the step for ZeRO-3 (fully sharded data parallel): each parameter is gathered from "
                      "its owner rank right before its uses and freed after them, its gradient reduced onto its "
                      "owner, as kernels of the step (the identity in one process; docs/distributed.md)")
      ->check(CLI::IsMember({0, 3}));
  command->add_flag("--keep-gathered", flags.keep_gathered,
                    "with --zero 3: the backward reads the forward's gathered parameters instead of gathering them "
                    "again (half the gathers, the parameters held from the forward to the backward)");
  command->add_flag("--no-prefetch", flags.no_prefetch,
                    "with --zero 3: issue each parameter's gather right before its first use, not ahead of it where "
                    "the time model says it arrives in time (to compare)");
}

// A training step and what its passes said about it (the report prints them).
struct LoadedStep {
  ir::Graph graph;
  passes::PipelineResult passes;  // sites, cast placement, rematerialization, recomputation
  // With baselines: the same step built at precision fp32 from the same
  // forward graph when the model's policy is mixed (the AMP audit's
  // baseline), and the same step with the cast passes off when they
  // rewrote anything (the report's comparison).
  std::optional<ir::Graph> fp32_step, policy_casts_step;
};

// What every command's handler gets from main() besides its own arguments.
struct CommandContext {
  PipelineFlags pipeline;

  // Loads a model and builds its training step (forward, backward,
  // optimizer); prints diagnostics (warnings too; a baseline's repeat the
  // model's and are not printed again). precision: the policy instead of the
  // model's (--compare-precision).
  std::optional<LoadedStep> load_step(const std::string& path, const std::string& dims,
                                      const passes::MemoryBudget& budget = {}, const passes::PipelineOptions& options = {},
                                      bool baselines = false,
                                      std::optional<ir::PrecisionPolicy> precision = std::nullopt) const {
    frontend::LoadOptions load_options;
    std::optional<std::map<std::string, int64_t>> overrides = dims_or_error(dims);
    if (!overrides) return std::nullopt;
    load_options.dim_overrides = *overrides;
    ir::Diagnostics diag;
    std::optional<ir::Graph> g = frontend::load_model_file(path, diag, load_options);
    if (!g) {
      std::cerr << diag.render();
      return std::nullopt;
    }
    if (precision) {
      g->config.precision.policy = *precision;
      g->config.precision.fp32.clear();
    }
    LoadedStep step;
    if (baselines && g->config.precision.policy != ir::PrecisionPolicy::FP32) {
      step.fp32_step = *g;
      step.fp32_step->config.precision = {};
      ir::Diagnostics repeated;
      passes::run_training_pipeline(*step.fp32_step, repeated, pipeline.apply({}));
    }
    std::optional<ir::Graph> forward = baselines ? g : std::nullopt;
    std::optional<passes::PipelineResult> result = passes::run_training_pipeline(*g, diag, pipeline.apply(options), budget);
    if (forward && result && result->cast_placement.total() > 0) {
      passes::PipelineOptions policy = pipeline.apply(options);
      policy.sink_casts = false;
      policy.matmul_epilogues = false;
      ir::Diagnostics repeated;
      passes::run_training_pipeline(*forward, repeated, policy, budget);
      step.policy_casts_step = std::move(forward);
    }
    std::cerr << diag.render();
    if (!result || diag.has_errors()) return std::nullopt;
    step.passes = std::move(*result);
    step.graph = std::move(*g);
    return step;
  }

  // The step alone, for the commands that need nothing else.
  std::optional<ir::Graph> load(const std::string& path, const std::string& dims, const passes::MemoryBudget& budget = {},
                                const passes::PipelineOptions& options = {}) const {
    std::optional<LoadedStep> step = load_step(path, dims, budget, options);
    if (!step) return std::nullopt;
    return std::move(step->graph);
  }
};

const analysis::Device* device_or_error(const std::string& name) {
  if (name.empty()) return nullptr;
  const analysis::Device* d = analysis::find_device(name);
  if (!d) {
    std::cerr << fmt::format("error: unknown device '{}'\n    hint: known devices: {} (napkin devices lists them)\n", name,
                             analysis::known_device_names());
    throw CLI::RuntimeError(kUserError);
  }
  return d;
}

// --memory-budget as bytes (0: none); a bad value is a user error.
passes::MemoryBudget memory_budget(const std::string& text) {
  if (text.empty()) return {};
  std::string error;
  std::optional<int64_t> bytes = passes::parse_memory_budget(text, error);
  if (!bytes) {
    std::cerr << fmt::format("error: --memory-budget: {}\n    hint: e.g. --memory-budget 64MiB or 1.5GB\n", error);
    throw CLI::RuntimeError(kUserError);
  }
  return {*bytes};
}

// --ranks (at least 2) and --interconnect: both or neither, with a device;
// --inter-node and --ranks-per-node: both or neither, with them, nodes that
// divide the ranks (one node: one level); an unknown name is a user error.
struct TopologyArgs {
  int ranks = 1;
  std::string interconnect, inter_node;
  int ranks_per_node = 0;
};
analysis::Topology topology_or_error(const TopologyArgs& a, const analysis::Device* device) {
  if (a.interconnect.empty() && a.ranks == 1 && a.inter_node.empty() && a.ranks_per_node == 0) return {};
  std::string error;
  const analysis::Interconnect* link = analysis::find_interconnect(a.interconnect);
  const analysis::Interconnect* across = analysis::find_interconnect(a.inter_node);
  if (a.ranks < 2) error = fmt::format("--ranks {}: a distributed step runs on at least 2 ranks", a.ranks);
  else if (a.interconnect.empty()) error = "--ranks needs --interconnect, the link between the ranks";
  else if (!device) error = "--interconnect needs --device: the distributed step starts from one rank's predicted step";
  else if (!link) error = fmt::format("unknown interconnect '{}'", a.interconnect);
  else if (a.inter_node.empty() != (a.ranks_per_node == 0))
    error = "--inter-node and --ranks-per-node go together: nodes of that many ranks, joined by that link";
  else if (!a.inter_node.empty() && !across) error = fmt::format("unknown interconnect '{}'", a.inter_node);
  else if (a.ranks_per_node < 0 || (a.ranks_per_node > 0 && a.ranks % a.ranks_per_node != 0))
    error = fmt::format("--ranks-per-node {} does not divide --ranks {} into whole nodes", a.ranks_per_node, a.ranks);
  if (error.empty()) return {a.ranks, link, across, a.ranks_per_node};
  std::cerr << fmt::format("error: {}\n    hint: e.g. --device h100 --ranks 16 --interconnect nvlink4 --ranks-per-node 8 "
                           "--inter-node ib-ndr; interconnects: {} (napkin devices lists them)\n",
                           error, analysis::known_interconnect_names());
  throw CLI::RuntimeError(kUserError);
}

// --html FILE [--compare OTHER.yaml]: the report as one self-contained page.
struct HtmlArgs {
  std::string file, compare;
  std::string compare_dims;       // the same model at other dims beside it
  std::string compare_precision;  // the same model under another precision policy beside it
};

// napkin report's flags.
struct ReportArgs {
  std::string model, dims, device, budget;
  std::string memory_per_rank;  // with --ranks: each ZeRO stage against this limit
  std::string metrics;          // a trainer's metrics file: the tokens its moe() layers dropped
  bool json = false, ops = false, no_ops = false;
  int64_t accumulate = 0;  // micro-batches per step instead of the model's train.accumulate
  TopologyArgs topology;
  HtmlArgs html;
  bool inference = false;  // the inference program's report instead (cmd_report_inference)
  int64_t inference_batch = 1, inference_context = 0;
};

int cmd_report(const CommandContext& ctx, const ReportArgs& a) {
  const std::string& path = a.model;
  const std::string& dims = a.dims;
  const HtmlArgs& html = a.html;
  // The page's roofline needs a device: this host's cpu row unless --device says.
  const analysis::Device* device = device_or_error(a.device.empty() && !html.file.empty() ? "cpu" : a.device);
  const analysis::Topology topology = topology_or_error(a.topology, device);
  CommandContext timed = ctx;  // ZeRO-3's prefetch placed by the report's device and link
  if (device) timed.pipeline.shard_device = device->name;
  if (topology.link) timed.pipeline.shard_link = topology.link->name, timed.pipeline.shard_ranks = topology.ranks;
  std::optional<LoadedStep> step = timed.load_step(path, dims, memory_budget(a.budget), {}, true);
  if (!step) return kUserError;
  const ir::Graph* g = &step->graph;
  analysis::StepCost cost = analysis::analyze_step(*g, device);
  analysis::MemoryReport memory = analysis::analyze_memory(*g);
  std::optional<analysis::MemoryFit> memory_fit;
  if (!a.memory_per_rank.empty()) {
    std::string error;
    std::optional<int64_t> limit = passes::parse_memory_budget(a.memory_per_rank, error);
    if (limit && !topology.link) error = "it needs the distributed step: --ranks N --interconnect NAME";
    if (limit && !a.budget.empty()) error = "it finds the --memory-budget that fits each stage itself: leave --memory-budget out";
    if (!limit || !error.empty()) {
      std::cerr << fmt::format("error: --memory-per-rank: {}\n    hint: e.g. --device h100 --ranks 8 --interconnect nvlink4 "
                               "--memory-per-rank 80GiB\n",
                               error);
      return kUserError;
    }
    // The same model at other layers and recompute budgets, quietly: a budget that cannot be met is an answer here.
    const std::map<std::string, int64_t> user_dims = *dims_or_error(dims);
    const analysis::CompileAt compile = [&](int64_t layers, int64_t budget) -> std::optional<analysis::CompiledMemory> {
      frontend::LoadOptions load_options;
      load_options.dim_overrides = user_dims;
      if (layers > 0) load_options.dim_overrides["layers"] = layers;
      ir::Diagnostics quiet;
      std::optional<ir::Graph> m = frontend::load_model_file(path, quiet, load_options);
      if (!m || quiet.has_errors() || !passes::run_training_pipeline(*m, quiet, ctx.pipeline.apply({}), {budget}) ||
          quiet.has_errors())
        return std::nullopt;
      return analysis::CompiledMemory{analysis::analyze_memory(*m), static_cast<double>(m->param_count())};
    };
    memory_fit = analysis::fit_memory(memory, static_cast<double>(g->param_count()), topology.ranks, static_cast<double>(*limit), compile);
  }
  std::optional<report::DroppedTokens> dropped;
  if (!a.metrics.empty()) {
    if (g->moe_layers.empty()) {
      std::cerr << fmt::format("error: --metrics {}: {} has no moe() layer: the report reads only the tokens moe() layers "
                               "dropped from a metrics file\n    hint: napkin plot {} draws its loss, tokens/s and MFU\n",
                               a.metrics, path, a.metrics);
      return kUserError;
    }
    std::ifstream in(a.metrics, std::ios::binary);
    std::string error;
    if (!in) error = fmt::format("{}: cannot read it", a.metrics);
    else dropped = report::read_dropped_tokens(in, a.metrics, error);
    if (!dropped) {
      std::cerr << fmt::format("error: --metrics {}\n    hint: the JSON lines file a trainer wrote with --metrics "
                               "(docs/runtime.md)\n",
                               error);
      return kUserError;
    }
  }
  // The text lists every op and every cast only when asked (--ops); the
  // JSON keeps its `ops` unless --no-ops.
  report::ReportOptions options{.model_path = path, .show_ops = a.json ? !a.no_ops : a.ops,
                                .recompute = &step->passes.recompute,
                                .fp32_step = step->fp32_step ? &*step->fp32_step : nullptr,
                                .pipeline = &step->passes,
                                .policy_casts_step = step->policy_casts_step ? &*step->policy_casts_step : nullptr,
                                .ranks = topology.ranks, .interconnect = topology.link, .inter_node = topology.across,
                                .ranks_per_node = topology.ranks_per_node, .accumulate = a.accumulate,
                                .memory_fit = memory_fit ? &*memory_fit : nullptr,
                                .dropped = dropped ? &*dropped : nullptr};
  if (!html.file.empty()) {
    const analysis::Device& roofline_device = *device;
    options.show_ops = false;  // the page's tables replace the per-op list (the JSON's `ops`)
    std::vector<report::HtmlReportInput> inputs{
        {g, &cost, &memory, report::render_report_json(*g, cost, memory, options), path + (dims.empty() ? "" : " --dims " + dims)}};
    // --compare: the other model through the same pipeline and options.
    std::optional<LoadedStep> other;
    std::optional<analysis::StepCost> other_cost;
    std::optional<analysis::MemoryReport> other_memory;
    const int seconds = !html.compare.empty() + !html.compare_dims.empty() + !html.compare_precision.empty();
    if (seconds > 1) {
      std::cerr << "error: --compare, --compare-dims and --compare-precision: one second model at a time\n";
      return kUserError;
    }
    if (seconds == 1) {
      const std::string other_path = html.compare.empty() ? path : html.compare;
      const std::string other_dims = html.compare_dims.empty() ? dims : html.compare_dims;
      std::optional<ir::PrecisionPolicy> precision;
      if (!html.compare_precision.empty()) {
        precision = ir::parse_precision(html.compare_precision);
        if (!precision) {
          std::cerr << fmt::format("error: --compare-precision {}: unknown policy\n    hint: fp32, bf16-mixed, fp16-mixed "
                                   "or fp8-mixed\n", html.compare_precision);
          return kUserError;
        }
      }
      other = ctx.load_step(other_path, other_dims, memory_budget(a.budget), {}, false, precision);
      if (!other) return kUserError;
      other_cost = analysis::analyze_step(other->graph, device);
      other_memory = analysis::analyze_memory(other->graph);
      report::ReportOptions other_options = options;
      other_options.model_path = other_path;
      other_options.recompute = nullptr;
      other_options.fp32_step = nullptr;
      other_options.pipeline = &other->passes;
      other_options.policy_casts_step = nullptr;
      inputs.push_back({&other->graph, &*other_cost, &*other_memory,
                        report::render_report_json(other->graph, *other_cost, *other_memory, other_options),
                        other_path + (other_dims.empty() ? "" : " --dims " + other_dims) +
                            (html.compare_precision.empty() ? "" : " precision " + html.compare_precision)});
    }
    if (std::string problem = tools::output_problem("--html", html.file, {path, html.compare}); !problem.empty()) {
      std::cerr << "error: " << problem << "\n";
      return kUserError;
    }
    std::ofstream out(html.file, std::ios::binary | std::ios::trunc);
    out << report::render_report_html(inputs, roofline_device);
    out.close();
    if (!out) {
      std::cerr << fmt::format("error: --html {}: cannot write it\n", html.file);
      return kUserError;
    }
    std::cout << fmt::format("wrote {} ({} model{}, roofline on {})\n", html.file, inputs.size(),
                             inputs.size() == 1 ? "" : "s", roofline_device.name);
    return 0;
  }
  std::cout << (a.json ? report::render_report_json(*g, cost, memory, options)
                       : report::render_report_text(*g, cost, memory, options));
  return 0;
}

// napkin report --inference: the inference program's figures (analysis/inference.h).
int cmd_report_inference(const ReportArgs& a) {
  const std::string& path = a.model;
  const int64_t batch = a.inference_batch, context = a.inference_context;
  const analysis::Device* device = device_or_error(a.device.empty() ? "cpu" : a.device);
  std::optional<std::map<std::string, int64_t>> dims = dims_or_error(a.dims);
  if (!dims) return kUserError;
  ir::Diagnostics diag;
  if (context > 0) {  // the model's sequence dim, by name
    std::optional<ir::Graph> forward = frontend::load_model_file(path, diag);
    std::string why;
    std::optional<passes::LanguageModel> lm = forward ? passes::find_language_model(*forward, &why) : std::nullopt;
    if (!lm) {
      std::cerr << diag.render();
      if (forward) std::cerr << fmt::format("error: --context: {} is not a language model: {}\n", path, why);
      return kUserError;
    }
    (*dims)[lm->seq_dim] = context;
  }
  std::optional<ir::Graph> g = tools::inference_graph(path, *dims, batch, diag);
  std::optional<ir::Graph> doubled;
  if (g) doubled = tools::inference_graph(path, *dims, 2 * batch, diag);
  std::cerr << diag.render();
  if (!g || !doubled) return kUserError;
  const analysis::InferenceCost cost = analysis::analyze_inference(*g, *doubled, *device);
  const ir::TensorType& cache = g->value(g->state.at(0)).type;  // [batch, kv_heads, context, head_dim]
  if (a.json)
    std::cout << nlohmann::json{{"model", g->name}, {"inference", report::inference_json(cost)}}.dump(1) << "\n";
  else
    std::cout << report::inference_section_text(g->name, cost, cache.dims.at(1).size, cache.dims.at(3).size,
                                                ir::dtype_size(cache.dtype));
  return 0;
}

int cmd_graph(const CommandContext& ctx, const std::string& path, const std::string& dims, bool dot, const std::string& output, bool no_fuse) {
  if (!dot) {
    std::cerr << "error: napkin graph needs a format\n    hint: add --dot (Graphviz); render with dot -Tsvg\n";
    return kUserError;
  }
  if (!output.empty())
    if (std::string problem = tools::output_problem("-o", output, {path}); !problem.empty()) {
      std::cerr << "error: " << problem << "\n";
      return kUserError;
    }
  auto g = ctx.load(path, dims);
  if (!g) return kUserError;
  std::string text = report::graph_dot(*g, {!no_fuse});
  if (output.empty()) {
    std::cout << text;
    return 0;
  }
  std::ofstream f(output, std::ios::binary | std::ios::trunc);
  f << text;
  if (!f) {
    std::cerr << fmt::format("error: {}: cannot write\n", output);
    return kUserError;
  }
  return 0;
}

int cmd_ir(const CommandContext& ctx, const std::string& path, const std::string& dims, const std::vector<std::string>& print_after, bool time_passes,
           bool no_locations) {
  passes::PipelineOptions options{print_after, time_passes, &std::cout};
  auto g = ctx.load(path, dims, {}, options);
  if (!g) return kUserError;
  if (print_after.empty()) std::cout << ir::print_graph(*g, {!no_locations});
  return 0;
}

// The float64 interpreter does about 1e9 FLOP/s; a check is ~2 forward passes
// per checked element. Past this much work, ask for smaller dims instead of
// running for hours.
constexpr double kCheckFlopBudget = 2e10;

int cmd_check(const CommandContext& ctx, const std::string& path, const std::string& dims, uint64_t seed, int samples, bool force) {
  auto g = ctx.load(path, dims);
  if (!g) return kUserError;
  analysis::StepCost cost = analysis::analyze_step(*g, nullptr);
  double forward = cost.phase(ir::Phase::Forward).flops;
  int tensors = 0;
  for (const auto& [label, v] : g->outputs) tensors += label.rfind("grad.", 0) == 0;
  // Five-point stencils, plus the step itself (~3 forward passes) in float64, in the model's dtypes and in each
  // rounding-noise run, and 8 forward passes that measure float64 rounding in the loss.
  double evaluations = 4.0 * (samples + 1) * tensors + 3.0 * (2 + interp::GradCheckOptions{}.noise_runs) + 8;
  if (forward * evaluations > kCheckFlopBudget && !force) {
    std::cerr << fmt::format(
        "error: {}: checking {} gradients needs about {:.0f} forward passes of {} each in the float64 interpreter ({} in "
        "all: about {:.0f} minutes at ~1 GFLOP/s)\n    hint: check the same graph at smaller sizes with --dims, e.g. "
        "batch=2 and widths of 8 to 64 (the dims are at the top of the model file), or pass --force\n",
        path, tensors, evaluations, ir::human_flops(forward), ir::human_flops(forward * evaluations),
        forward * evaluations / 1e9 / 60);
    return kUserError;
  }
  interp::GradCheckOptions options;
  options.seed = seed;
  options.samples = samples;
  auto start = std::chrono::steady_clock::now();
  interp::GradCheckResult r;
  try {
    r = interp::check_gradients(*g, options);
  } catch (const std::runtime_error& e) {
    std::cerr << fmt::format("error: {}: {}\n", path, e.what());
    return kUserError;
  }
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << fmt::format("napkin check: {} ({}{})\n", g->name, path, dims.empty() ? "" : ", dims " + dims);
  std::cout << fmt::format("gradients vs float64 central differences: seed {}, {} elements and one random direction per tensor\n",
                           seed, samples);
  std::cout << fmt::format("  {:<28} {:<20} {:>7}  {:>9} {:>9}  {:>9} {:>9}  {}\n", "parameter", "type", "checked", "f64 err",
                           "tol", "dtype err", "tol", "");
  int failed = 0;
  for (const interp::TensorCheck& t : r.tensors) {
    failed += !t.passed;
    std::cout << fmt::format("  {:<28} {:<20} {:>7}  {:>9.2e} {:>9.2e}  {:>9.2e} {:>9.2e}  {}\n", t.name,
                             fmt::format("{}[{}]", ir::dtype_name(t.type.dtype), fmt::join(t.type.sizes(), ",")),
                             t.elements_checked, t.error_f64, t.tolerance_f64, t.error_native, t.tolerance_native,
                             t.passed ? "ok" : "FAIL");
  }
  if (r.skipped_steps > 0)
    std::cout << fmt::format("loss scale {:g}: the first {} steps overflow and are skipped, as in training\n", r.loss_scale,
                             r.skipped_steps);
  std::cout << fmt::format("loss {:.6g} at the check point (float64 rounding moves it by {:.1e}, which sets the f64 "
                           "tolerances); {} forward evaluations in {:.2f} s\n",
                           r.loss, r.loss_noise, r.forward_evaluations, seconds);
  if (r.tensors.empty()) {
    std::cout << "FAIL: no parameter has a gradient\n";
    return kUserError;
  }
  if (failed > 0) {
    std::cout << fmt::format("FAIL: {} of {} gradients disagree with finite differences\n", failed, r.tensors.size());
    return kUserError;
  }
  std::cout << (r.tensors.size() == 1 ? std::string("PASS: the gradient matches\n")
                                      : fmt::format("PASS: all {} gradients match\n", r.tensors.size()));
  return 0;
}

struct EstimateArgs {
  double params = 0;
  std::string model;
  double tokens = 0;
  int gpus = 1;
  std::string device = "h100";
  double mfu = 0.5;
  std::string dtype = "bf16";
  std::string optimizer;
  std::string precision;
  std::string interconnect;   // with --batch-tokens: the data-parallel step's communication
  double batch_tokens = 0;    // tokens per optimizer step, over every GPU
  std::string memory_per_rank;  // each ZeRO stage's share of the states on --gpus ranks of this memory
};

int cmd_estimate(const CommandContext& ctx, const EstimateArgs& a) {
  const analysis::Device* device = device_or_error(a.device);
  std::optional<int64_t> memory_per_rank;
  if (!a.memory_per_rank.empty()) {
    std::string error;
    memory_per_rank = passes::parse_memory_budget(a.memory_per_rank, error);
    if (!memory_per_rank) {
      std::cerr << fmt::format("error: --memory-per-rank: {}\n    hint: e.g. --memory-per-rank 80GiB\n", error);
      return kUserError;
    }
  }
  const analysis::Interconnect* link = nullptr;
  if (!a.interconnect.empty() || a.batch_tokens > 0) {
    link = analysis::find_interconnect(a.interconnect);
    std::string error;
    if (a.interconnect.empty() || a.batch_tokens <= 0 || a.tokens <= 0)
      error = "the data-parallel step needs --interconnect, --batch-tokens and --tokens";
    else if (!link) error = fmt::format("unknown interconnect '{}'", a.interconnect);
    if (!error.empty()) {
      std::cerr << fmt::format("error: {}\n    hint: e.g. --tokens 10e9 --gpus 8 --interconnect nvlink4 --batch-tokens "
                               "524288; interconnects: {}\n",
                               error, analysis::known_interconnect_names());
      return kUserError;
    }
  }
  double params = a.params;
  if (!a.model.empty()) {
    auto g = ctx.load(a.model, "");
    if (!g) return kUserError;
    params = static_cast<double>(g->param_count());
    std::cout << fmt::format("model {}: {} parameters\n", a.model, ir::with_commas(g->param_count()));
  }
  if (params <= 0 && a.tokens > 0) {
    std::cerr << "error: give --params N or --model FILE to estimate training time\n";
    return kUserError;
  }
  if (a.tokens <= 0 && a.optimizer.empty() && a.precision.empty() && a.memory_per_rank.empty()) {
    std::cerr << "error: nothing to estimate\n    hint: --tokens N for compute and time; --optimizer and --precision "
                 "for the largest model that fits\n";
    return kUserError;
  }
  if (a.tokens > 0) {
    auto dtype = ir::parse_dtype(a.dtype);
    if (!dtype) {
      std::cerr << fmt::format("error: unknown dtype '{}' (known: {})\n", a.dtype, ir::dtype_names_list());
      return kUserError;
    }
    double peak = analysis::matmul_peak(*device, *dtype);
    auto t = analysis::training_time(params, a.tokens, a.gpus, peak, a.mfu);
    if (!t) {
      std::cerr << "error: " << t.error << "\n";
      return kUserError;
    }
    std::cout << fmt::format(
        "training compute: 6 * {:.4g} params * {:.4g} tokens = {:.4g} FLOPs\n"
        "time on {} x {} at {} dense peak {:.4g} FLOP/s and MFU {}: {:.4g} s = {:.4g} hours = {:.1f} days\n",
        params, a.tokens, t.value->flops, a.gpus, device->name, ir::dtype_name(*dtype), peak, a.mfu,
        t.value->seconds, t.value->seconds / 3600, t.value->days);
    if (link) {
      // The gradients' bytes: the precision's (the lecture's convention: fp32 unless --precision says otherwise).
      auto b = analysis::bytes_per_param(a.optimizer.empty() ? "adamw" : a.optimizer,
                                         a.precision.empty() ? "fp32" : a.precision);
      if (!b) {
        std::cerr << "error: " << b.error << "\n";
        return kUserError;
      }
      const analysis::DataParallelEstimate e =
          analysis::estimate_data_parallel(params, a.batch_tokens, a.gpus, peak, a.mfu, b.value->grads, *link);
      const double steps = a.tokens / a.batch_tokens;
      std::cout << fmt::format(
          "data parallel on {} ({:.4g} GB/s each way): {:.4g} steps of {:.4g} tokens; each step computes {} and "
          "all-reduces {:.4g} bytes of gradients ({} bytes each), {:.4g} bytes sent per GPU in {}, {} of it hidden "
          "behind the backward (4/6 of the compute), {} exposed\n"
          "time with the exposed communication: {:.4g} s = {:.4g} hours = {:.1f} days, MFU {:.3g}\n",
          link->name, link->bytes_per_s / 1e9, steps, a.batch_tokens, ir::human_seconds(e.compute_seconds),
          params * b.value->grads, b.value->grads, e.bytes_sent, ir::human_seconds(e.comm_seconds),
          ir::human_seconds(e.hidden_seconds), ir::human_seconds(e.exposed_seconds), steps * e.step_seconds,
          steps * e.step_seconds / 3600, steps * e.step_seconds / analysis::kSecondsPerDay, e.mfu);
    }
  }
  if (!a.optimizer.empty() || !a.precision.empty() || !a.memory_per_rank.empty()) {
    // Either flag alone takes the other's default.
    const std::string optimizer = a.optimizer.empty() ? "adamw" : a.optimizer;
    const std::string precision = a.precision.empty() ? "fp32" : a.precision;
    auto b = analysis::bytes_per_param(optimizer, precision);
    if (!b) {
      std::cerr << "error: " << b.error << "\n";
      return kUserError;
    }
    const auto& bytes = *b.value;
    double largest = analysis::max_trainable_params(a.gpus, device->memory_bytes, bytes);
    std::cout << fmt::format(
        "bytes per parameter ({}, {}): params {} + grads {} + optimizer state {} = {}\n"
        "largest model on {} x {} ({:.4g} bytes each), activations ignored: {:.4g} parameters\n",
        optimizer, precision, bytes.params, bytes.grads, bytes.optimizer_state, bytes.total, a.gpus, device->name,
        device->memory_bytes, largest);
    if (params > 0) {
      double need = params * bytes.total;
      std::cout << fmt::format("this model needs {:.4g} bytes = {}: {} on {} x {}\n", need, ir::human_bytes(need),
                               need <= a.gpus * device->memory_bytes ? "fits" : "does NOT fit", a.gpus, device->name);
    }
    if (memory_per_rank) {
      const double m = static_cast<double>(*memory_per_rank);
      const auto shares = analysis::state_shares(bytes.params, bytes.grads, bytes.optimizer_state, a.gpus, m);
      std::cout << fmt::format("per rank of {} ({} bytes) on {} ranks, activations ignored (napkin report "
                               "--memory-per-rank counts them):\n",
                               ir::human_bytes(m), ir::with_commas(m), a.gpus);
      for (int stage = 0; stage < 4; ++stage) {
        const analysis::StateShare& s = shares[stage];
        std::cout << fmt::format("  {:<14} {:.4g} bytes a parameter on a rank: largest model {:.4g} parameters{}\n",
                                 analysis::zero_stage_name(stage), s.bytes_per_param, s.largest_params,
                                 params > 0 ? fmt::format("; this one {}", params * s.bytes_per_param <= m
                                                                               ? "fits" : "does NOT fit")
                                            : "");
      }
    }
  }
  return 0;
}

int cmd_ops() {
  std::cout << fmt::format("{:<20} {:>5}  {:<14} {:<13} {}\n", "op", "arity", "class", "FLOPs/element", "gradient");
  for (int i = 0; i < ir::kNumOps; ++i) {
    const ir::OpInfo& info = ir::op_info(static_cast<ir::Op>(i));
    std::cout << fmt::format("{:<20} {:>5}  {:<14} {:<13} {}\n", info.name,
                             info.arity < 0 ? "n" : std::to_string(info.arity), ir::op_class_name(info.op_class),
                             info.flops_per_element, info.vjp ? "vjp" : "none (backward-only)");
  }
  return 0;
}


struct BuildArgs {
  std::string model, dims, output, target = "cpu", device, emit_llvm, emit_program, memory_budget;
  std::string arch, emit_cuda, classifier_chunk;  // --target cuda
  bool tf32 = false, no_cache = false, line_info = false;
  bool time_passes = false, quiet = false;
  bool sampler = false;  // --sampler: the inference program (napkin sample's executable) instead of the trainer
  int64_t batch = 1;     // --sampler --batch
};

// What `napkin build` compiles: the training step, or with --sampler the
// model's inference program, with the hash its checkpoints must carry.
struct BuildGraph {
  ir::Graph graph;
  std::string model_hash;
};
// The hash a training step's checkpoints carry. A step built for ZeRO-3
// computes the unsharded step's values (bit for bit in one process), so its
// checkpoints carry the unsharded step's hash: a plain trainer, --init and
// napkin sample read them, and it reads theirs.
std::optional<std::string> checkpoint_hash(const CommandContext& ctx, const ir::Graph& step, const std::string& model,
                                           const std::string& dims, const std::string& budget) {
  if (ctx.pipeline.zero != 3) return tools::model_hash(step);
  CommandContext unsharded = ctx;
  unsharded.pipeline.zero = 0;
  unsharded.pipeline.keep_gathered = false;
  std::optional<ir::Graph> g = unsharded.load(model, dims, memory_budget(budget));
  if (!g) return std::nullopt;
  return tools::model_hash(*g);
}

// The context of a build for `target` on `device`: ZeRO-3's prefetch is
// placed by that device's time model and the target's link between ranks
// (the CPU trainers' ranks share a host; GPUs an NVLink). The CUDA trainer
// runs each collective in the stream's order, so a gather issued ahead would
// only hold its copy longer: no prefetch there yet.
CommandContext for_target(const CommandContext& ctx, const std::string& target, const std::string& device) {
  CommandContext c = ctx;
  if (target == "cuda") c.pipeline.no_prefetch = true;
  c.pipeline.shard_device = device;
  c.pipeline.shard_link = target == "cuda" ? "nvlink4" : "shm";
  return c;
}

std::optional<BuildGraph> graph_to_build(const CommandContext& ctx, const BuildArgs& a) {
  if (!a.sampler) {
    auto g = ctx.load(a.model, a.dims, memory_budget(a.memory_budget));
    if (!g) return std::nullopt;
    std::optional<std::string> hash = checkpoint_hash(ctx, *g, a.model, a.dims, a.memory_budget);
    if (!hash) return std::nullopt;
    return BuildGraph{std::move(*g), *hash};
  }
  std::optional<std::map<std::string, int64_t>> dims = dims_or_error(a.dims);
  if (!dims) return std::nullopt;
  ir::Diagnostics diag;
  std::optional<tools::InferenceProgram> p =
      tools::inference_program(a.model, *dims, a.batch, diag, memory_budget(a.memory_budget));
  std::cerr << diag.render();
  if (!p) return std::nullopt;
  return BuildGraph{std::move(p->graph), p->model_hash};
}

void print_build_steps(const std::vector<std::pair<std::string, double>>& seconds) {
  for (const auto& [what, s] : seconds) std::cout << fmt::format("  {:>8.3f} s  {}\n", s, what);
}

int cmd_build_cuda(const CommandContext& ctx, const BuildArgs& a) {
#ifdef NAPKIN_HAVE_CUDA
  std::optional<BuildGraph> built_graph = graph_to_build(for_target(ctx, "cuda", a.device), a);
  if (!built_graph) return kUserError;
  const ir::Graph* g = &built_graph->graph;
  codegen::cuda::CudaBuildOptions options{.output = a.output, .model_hash = built_graph->model_hash, .device = a.device,
                                          .arch = a.arch, .tf32 = a.tf32, .line_info = a.line_info,
                                          .no_cache = a.no_cache, .emit_cuda = a.emit_cuda, .emit_program = a.emit_program};
  if (!a.classifier_chunk.empty()) {
    std::string error;
    std::optional<int64_t> bytes = passes::parse_memory_budget(a.classifier_chunk, error);
    if (!bytes || *bytes < 1) {
      std::cerr << fmt::format("error: --classifier-chunk: {}\n    hint: a size such as 32MiB or 64MB\n",
                               bytes ? fmt::format("'{}' is not positive", a.classifier_chunk) : error);
      return kUserError;
    }
    options.classifier_chunk_bytes = *bytes;
  }
  auto t0 = std::chrono::steady_clock::now();
  auto built = tools::build_or_report(codegen::cuda::build_cuda_trainer, *g, options);
  if (!built) return kUserError;
  const codegen::cuda::CudaBuildResult& r = *built;
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!a.quiet)
    std::cout << fmt::format(
        "built {} ({}: cuda {}, {} kernels, {} on cuBLASLt, {} launches of {} functions; cubin {} bytes, PTX {} bytes; "
        "NVRTC {}; arena {} bytes) in {:.2f} s\n",
        a.output, g->name, r.arch, r.kernels, r.matmul_kernels, r.launches, r.functions, r.cubin_bytes, r.ptx_bytes,
        r.cache_hit ? std::string("cache hit") : fmt::format("{} {:.2f} s", r.nvrtc_version, r.nvrtc_seconds),
        r.arena_bytes, seconds);
  if (a.time_passes) print_build_steps(r.seconds);
  return 0;
#else
  (void)ctx, (void)a;
  std::cerr << "error: --target cuda: this napkin was built without the CUDA toolkit, so it builds CPU trainers only\n"
               "    hint: install the CUDA toolkit (with NVRTC) and reconfigure napkin with CMake\n";
  return kUserError;
#endif
}

int cmd_build(const CommandContext& ctx, BuildArgs a) {  // by value: the defaults depend on the target
  if (a.target != "cpu" && a.target != "cuda") {
    std::cerr << fmt::format("error: --target {}: unknown target\n    hint: cpu or cuda\n", a.target);
    return kUserError;
  }
  bool cuda = a.target == "cuda";
  // A flag of the other target is a mistake worth saying, not ignoring.
  if (!cuda && (!a.arch.empty() || a.tf32 || a.no_cache || a.line_info || !a.emit_cuda.empty() ||
                !a.classifier_chunk.empty())) {
    std::cerr << "error: --arch, --tf32, --no-cache, --lineinfo, --emit-cuda and --classifier-chunk are for --target cuda\n";
    return kUserError;
  }
  if (cuda && !a.emit_llvm.empty()) {
    std::cerr << "error: --emit-llvm is for --target cpu\n    hint: --emit-cuda FILE writes the CUDA C source\n";
    return kUserError;
  }
  for (const auto& [flag, path] : {std::pair{"-o", a.output}, {"--emit-llvm", a.emit_llvm}, {"--emit-program", a.emit_program},
                                    {"--emit-cuda", a.emit_cuda}}) {
    if (flag != std::string("-o") && path.empty()) continue;
    if (std::string problem = tools::output_problem(flag, path, {a.model}); !problem.empty()) {
      std::cerr << "error: " << problem << "\n";
      return kUserError;
    }
  }
  if (a.device.empty()) a.device = cuda ? "h100" : "cpu";
  if (a.arch.empty()) a.arch = "sm_90";
  if (!analysis::find_device(a.device)) {
    std::cerr << fmt::format("error: unknown device '{}'\n    hint: known devices: {}\n", a.device, analysis::known_device_names());
    return kUserError;
  }
  if (cuda) return cmd_build_cuda(ctx, a);
  std::optional<BuildGraph> built_graph = graph_to_build(for_target(ctx, "cpu", a.device), a);
  if (!built_graph) return kUserError;
  const ir::Graph* g = &built_graph->graph;
  std::optional<ir::Graph> sampler;  // a language model's trainer: its --sample-every program
  if (!a.sampler)
    if (std::optional<std::map<std::string, int64_t>> overrides = dims_or_error(a.dims))
      sampler = tools::trainer_sampler(a.model, *overrides);
  codegen::cpu::BuildOptions options{a.output,       built_graph->model_hash, a.device, a.emit_llvm,
                                     a.emit_program, sampler ? &*sampler : nullptr};
  auto t0 = std::chrono::steady_clock::now();
  std::optional<codegen::cpu::BuildResult> built = tools::build_or_report(codegen::cpu::build_cpu_trainer, *g, options);
  if (!built) return kUserError;
  const codegen::cpu::BuildResult& r = *built;
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!a.quiet)
    std::cout << fmt::format("built {} ({}: {} kernels, {} on the GEMM library, loops in {} functions; arena {} bytes) in {:.2f} s\n",
                             a.output, g->name, r.kernels, r.matmul_kernels, r.functions, r.arena_bytes, seconds);
  if (a.time_passes) print_build_steps(r.seconds);
  return 0;
}

// napkin train's and napkin sample's --target: cpu, or cuda where this napkin
// has the CUDA toolkit; otherwise the message and false.
bool target_usable(const std::string& target) {
  if (target != "cpu" && target != "cuda") {
    std::cerr << fmt::format("error: --target {}: unknown target\n    hint: cpu or cuda\n", target);
    return false;
  }
#ifndef NAPKIN_HAVE_CUDA
  if (target == "cuda") {
    std::cerr << "error: --target cuda: this napkin was built without the CUDA toolkit, so it builds CPU programs only\n";
    return false;
  }
#endif
  return true;
}

// Runs `program` with `args` in place of this process; returns only when it
// cannot (the message printed).
int exec_program(const std::filesystem::path& program, const std::vector<std::string>& args) {
  std::vector<std::string> all{program.string()};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& s : all) argv.push_back(s.data());
  argv.push_back(nullptr);
  std::cout.flush();
  execv(argv[0], argv.data());
  std::cerr << fmt::format("error: cannot run {}: {}\n", program.string(), std::strerror(errno));
  return kUserError;
}

int cmd_train(const CommandContext& any_target, const std::string& model, const std::string& dims, const std::string& budget,
              const std::string& target, const std::vector<std::string>& trainer_args) {
  if (!target_usable(target)) return kUserError;
  const CommandContext ctx = for_target(any_target, target, target == "cuda" ? "h100" : "cpu");
  auto g = ctx.load(model, dims, memory_budget(budget));
  if (!g) return kUserError;
  std::optional<ir::Graph> sampler;  // --sample-every's program, for a language model
  if (target == "cpu")
    if (std::optional<std::map<std::string, int64_t>> overrides = dims_or_error(dims))
      sampler = tools::trainer_sampler(model, *overrides);
  std::optional<std::string> hash = checkpoint_hash(ctx, *g, model, dims, budget);
  if (!hash) return kUserError;
  std::optional<std::filesystem::path> trainer =
      tools::cached_trainer(*g, target, *hash, std::cout, sampler ? &*sampler : nullptr);
  if (!trainer) return kUserError;
  return exec_program(*trainer, trainer_args);
}

// napkin sample's flags, passed on to the sampler (runtime/sampler.h) when set.
struct SampleArgs {
  std::string model, dims, target = "cpu", memory_budget;
  int64_t batch = 1;
  std::vector<std::pair<std::string, std::string>> flags;  // (--name, value) for the sampler
};

int cmd_sample(const SampleArgs& a) {
  if (!target_usable(a.target)) return kUserError;
  std::optional<std::map<std::string, int64_t>> dims = dims_or_error(a.dims);
  if (!dims) return kUserError;
  ir::Diagnostics diag;
  std::optional<tools::InferenceProgram> p =
      tools::inference_program(a.model, *dims, a.batch, diag, memory_budget(a.memory_budget));
  std::cerr << diag.render();
  if (!p) return kUserError;
  // stdout is the text the model writes: the build's progress goes to stderr.
  std::optional<std::filesystem::path> sampler = tools::cached_trainer(p->graph, a.target, p->model_hash, std::cerr);
  if (!sampler) return kUserError;
  std::vector<std::string> args;
  for (const auto& [flag, value] : a.flags) {
    args.push_back(flag);
    args.push_back(value);
  }
  return exec_program(*sampler, args);
}

int cmd_data_encode(const tools::EncodeOptions& options) {
  std::string error;
  std::optional<tools::EncodeSummary> summary = tools::encode_text_files(options, error);
  if (!summary) {
    std::cerr << "error: " << error << "\n";
    return kUserError;
  }
  std::cout << tools::summary_line(options, *summary) << "\n";
  return 0;
}

int cmd_data_decode(const tools::DecodeOptions& options) {
  std::string error;
  if (!tools::decode_token_file(options, std::cout, error)) {
    std::cout.flush();
    std::cerr << "\nerror: " << error << "\n";
    return kUserError;
  }
  return 0;
}

// napkin data bpe's arguments.
struct BpeArgs {
  std::vector<std::string> corpus;
  std::string output;
  int64_t vocab = 0;
  std::vector<std::string> specials;
  int threads = 0;
  bool quiet = false;
};

int cmd_data_bpe(const BpeArgs& a) {
  std::string error = tools::output_problem("-o", a.output, a.corpus);
  for (size_t i = 0; error.empty() && i < a.corpus.size(); ++i) error = tools::input_problem(a.corpus[i]);
  if (!error.empty()) {
    std::cerr << "error: " << error << "\n";
    return kUserError;
  }
  tools::BpeResult r;
  try {
    tools::BpeOptions options;
    options.vocab_size = a.vocab;
    options.specials = a.specials;
    options.threads = a.threads;
    r = tools::train_bpe(a.corpus, options, {a.quiet ? nullptr : &std::cerr, ::isatty(STDERR_FILENO) == 1});
    error = tools::write_atomically(a.output, tokenizer::Tokenizer::from_merges(r.merges, a.specials).to_json());
  } catch (const runtime::Error& e) {
    error = e.what();
  }
  if (!error.empty()) {
    std::cerr << "error: " << error << "\n";
    return kUserError;
  }
  auto count = [](size_t n, const char* what) { return fmt::format("{} {}{}", n, what, n == 1 ? "" : "s"); };
  std::cout << fmt::format("wrote {}: vocab {} (256 bytes, {}, {}), {} distinct pre-tokens of {}, {:.2f} s\n",
                           a.output, r.vocab_size, count(r.merges.size(), "merge"),
                           count(a.specials.size(), "special token"), r.unique_pretokens, r.pretokens, r.seconds);
  if (r.ran_out)
    std::cout << fmt::format("stopped at vocab {} of the {} asked for: every pre-token of the corpus is one token\n",
                             r.vocab_size, a.vocab);
  return 0;
}

// napkin hf import / export's arguments.
struct HfArgs {
  std::string model, dims, input, output, dtype = "f32";
};

// The model napkin hf converts for: its forward graph (no training step is
// built) and its huggingface: section.
std::optional<frontend::HuggingFaceModel> huggingface_model(const HfArgs& a) {
  std::optional<std::map<std::string, int64_t>> overrides = dims_or_error(a.dims);
  if (!overrides) return std::nullopt;
  ir::Diagnostics diag;
  std::optional<frontend::HuggingFaceModel> model = frontend::load_huggingface_model(a.model, diag, {*overrides});
  std::cerr << diag.render();
  return model;
}

int cmd_hf_import(const HfArgs& a) {
  std::optional<frontend::HuggingFaceModel> model = huggingface_model(a);
  if (!model) return kUserError;
  try {
    std::cout << tools::import_huggingface(*model, a.input, a.output);
  } catch (const runtime::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return kUserError;
  }
  return 0;
}

int cmd_hf_export(const HfArgs& a) {
  std::optional<ir::DType> dtype = ir::parse_dtype(a.dtype);
  if (!dtype || (*dtype != ir::DType::F32 && *dtype != ir::DType::BF16 && *dtype != ir::DType::F16)) {
    std::cerr << fmt::format("error: --dtype {}: napkin hf export writes f32, bf16 or f16\n", a.dtype);
    return kUserError;
  }
  std::optional<frontend::HuggingFaceModel> model = huggingface_model(a);
  if (!model) return kUserError;
  try {
    std::cout << tools::export_huggingface(*model, a.input, a.output, *dtype);
  } catch (const runtime::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return kUserError;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"napkin: a static graph compiler for training, with exact resource accounting"};
  app.require_subcommand(1);
  int status = 0;
  CommandContext ctx;

  std::string model, dims, budget;
  const char* budget_help = "recompute activations so the planned arena fits, e.g. 64MiB or 1.5GB";
  const char* dims_help = "override dims of the model, e.g. d=32,layers=2";
  ReportArgs report_args;
  auto* report = app.add_subcommand("report", "print the static resource report of a training step");
  report->add_option("model", report_args.model, "model YAML file")->required();
  report->add_option("--dims", report_args.dims, dims_help);
  report->add_option("--device", report_args.device, "add roofline times for a device (see napkin devices)");
  report->add_flag("--json", report_args.json, "print one JSON object");
  report->add_flag("--ops", report_args.ops, "list every op and every cast in the text report");
  report->add_flag("--no-ops", report_args.no_ops, "omit the per-op list from the JSON (the text omits it unless --ops)");
  report->add_option("--memory-budget", report_args.budget, budget_help);
  report->add_option("--metrics", report_args.metrics,
                     "a trainer's metrics file (JSON lines): the tokens each moe() layer dropped, in the mixture-of-experts "
                     "section");
  add_pipeline_flags(report, ctx.pipeline);
  TopologyArgs& topology = report_args.topology;
  report->add_option("--ranks", topology.ranks, "data-parallel ranks: the distributed step per ZeRO stage (with --interconnect)");
  report->add_option("--interconnect", topology.interconnect,
                     "the link between the ranks (of a node, with --inter-node): nvlink4, ib-ndr, pcie5, 100gbe, shm");
  report->add_option("--memory-per-rank", report_args.memory_per_rank,
                     "with --ranks: each ZeRO stage's fit in this much memory a rank (e.g. 80GiB), the --memory-budget "
                     "that makes it fit, the largest model by layers");
  report->add_option("--ranks-per-node", topology.ranks_per_node, "ranks in one node (with --inter-node)");
  report->add_option("--inter-node", topology.inter_node, "the link between nodes (with --ranks-per-node)");
  report->add_option("--accumulate", report_args.accumulate,
                     "micro-batches per step (gradient accumulation) instead of the model's train.accumulate")
      ->check(CLI::Range(int64_t{1}, int64_t{1'000'000}));
  auto* inference_flag = report->add_flag(
      "--inference", report_args.inference,
      "the inference program's report instead (napkin sample's prefill and KV-cache decode; device default cpu)");
  report->add_option("--batch", report_args.inference_batch, "--inference: sequences decoded at once")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20))->needs(inference_flag)->capture_default_str();
  report->add_option("--context", report_args.inference_context, "--inference: the context (the model's seq dim) instead of the model's")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24))->needs(inference_flag);
  HtmlArgs& html = report_args.html;
  report->add_option("--html", html.file,
                     "write the report as one self-contained HTML page: summary, memory timeline, roofline, fusion and "
                     "AMP tables (roofline device: --device, else cpu)");
  report->add_option("--compare", html.compare, "--html: another model beside this one (same --dims, --device)");
  report->add_option("--compare-dims", html.compare_dims, "--html: this model at these dims beside it, e.g. d=512,layers=8");
  report->add_option("--compare-precision", html.compare_precision,
                     "--html: this model under another precision policy beside it (fp32, bf16-mixed, ...)");
  report->callback(
      [&] { status = report_args.inference ? cmd_report_inference(report_args) : cmd_report(ctx, report_args); });

  std::vector<std::string> print_after;
  bool time_passes = false, no_locations = false;
  auto* ir_cmd = app.add_subcommand("ir", "print the IR of a model");
  ir_cmd->add_option("model", model, "model YAML file")->required();
  ir_cmd->add_option("--dims", dims, dims_help);
  ir_cmd->add_option("--print-after", print_after, "print the IR after these passes ('all' for every pass)");
  ir_cmd->add_flag("--time-passes", time_passes, "time each pass");
  ir_cmd->add_flag("--no-locations", no_locations, "omit the YAML locations");
  add_pipeline_flags(ir_cmd, ctx.pipeline);
  ir_cmd->callback([&] { status = cmd_ir(ctx, model, dims, print_after, time_passes, no_locations); });

  bool dot = false, no_fuse = false;
  std::string graph_output;
  auto* graph = app.add_subcommand("graph", "draw the training step (forward, backward, update) with its fusion groups");
  graph->add_option("model", model, "model YAML file")->required();
  graph->add_option("--dims", dims, dims_help);
  graph->add_flag("--dot", dot, "Graphviz DOT (render with dot -Tsvg)");
  graph->add_option("-o,--output", graph_output, "write to this file instead of stdout");
  graph->add_flag("--no-fuse", no_fuse, "draw every node on its own, without fusion groups");
  add_pipeline_flags(graph, ctx.pipeline);
  graph->callback([&] { status = cmd_graph(ctx, model, dims, dot, graph_output, no_fuse); });

  uint64_t seed = 0;
  int samples = 4;
  bool force = false;
  auto* check = app.add_subcommand("check", "check every parameter gradient against float64 finite differences");
  check->add_option("model", model, "model YAML file")->required();
  check->add_option("--dims", dims, dims_help);
  check->add_option("--seed", seed, "seed of the random inputs and parameters")->capture_default_str();
  check->add_option("--samples", samples, "elements per tensor checked one by one")->capture_default_str()->check(CLI::Range(0, 1000000));
  check->add_flag("--force", force, "run even when the check would take hours");
  add_pipeline_flags(check, ctx.pipeline);
  check->callback([&] { status = cmd_check(ctx, model, dims, seed, samples, force); });

  EstimateArgs est;
  auto* estimate = app.add_subcommand("estimate", "napkin math: training compute, time and memory");
  estimate->add_option("--params", est.params, "parameter count, e.g. 70e9");
  estimate->add_option("--model", est.model, "a model YAML file instead of --params");
  estimate->add_option("--tokens", est.tokens, "training tokens, e.g. 15e12");
  estimate->add_option("--gpus", est.gpus, "number of devices")->capture_default_str();
  estimate->add_option("--device", est.device, "device (see napkin devices)")->capture_default_str();
  estimate->add_option("--mfu", est.mfu, "model FLOPs utilization in (0, 1]")->capture_default_str();
  estimate->add_option("--dtype", est.dtype, "compute dtype for the peak")->capture_default_str();
  estimate->add_option("--optimizer", est.optimizer, analysis::known_optimizer_names());
  estimate->add_option("--precision", est.precision, analysis::known_precision_names());
  estimate->add_option("--interconnect", est.interconnect,
                       "data parallel over --gpus on this link (with --batch-tokens): nvlink4, ib-ndr, pcie5, 100gbe, shm");
  estimate->add_option("--memory-per-rank", est.memory_per_rank,
                       "memory of each of --gpus ranks (e.g. 80GiB): the largest model under each ZeRO stage");
  estimate->add_option("--batch-tokens", est.batch_tokens, "tokens per optimizer step over every GPU (with --interconnect)");
  estimate->callback([&] { status = cmd_estimate(ctx, est); });

  BuildArgs build_args;
  auto* build = app.add_subcommand("build", "compile a model into a standalone trainer executable");
  build->add_option("model", build_args.model, "model YAML file")->required();
  build->add_option("-o,--output", build_args.output, "the trainer executable to write")->required();
  build->add_option("--dims", build_args.dims, dims_help);
  build->add_option("--target", build_args.target, "cpu (LLVM) or cuda (NVRTC + cuBLASLt)")->capture_default_str();
  build->add_option("--device", build_args.device,
                    "the device whose peak the trainer's MFU uses (default: cpu; h100 for --target cuda)");
  build->add_option("--emit-llvm", build_args.emit_llvm, "also write the optimized LLVM IR to this file (cpu)");
  build->add_option("--arch", build_args.arch,
                    "the GPU architecture of the cubin (cuda; default sm_90): sm_80, sm_89, sm_90, sm_90a, sm_100, sm_120, ...");
  build->add_flag("--tf32", build_args.tf32, "let fp32 matmuls use TF32 tensor cores (cuda)");
  build->add_option("--emit-cuda", build_args.emit_cuda, "also write the kernels' CUDA C source to this file (cuda)");
  build->add_flag("--no-cache", build_args.no_cache, "compile with NVRTC even if the kernel cache has the result (cuda)");
  build->add_flag("--lineinfo", build_args.line_info, "keep source lines in the cubin for profilers (cuda)");
  build->add_option("--classifier-chunk", build_args.classifier_chunk,
                    "the most bytes one vocabulary chunk of the fused classifier's logits may take (cuda; default 32MiB, "
                    "about half an H100's L2)");
  build->add_option("--emit-program", build_args.emit_program, "also write the program description (JSON) to this file");
  build->add_flag("--time-passes", build_args.time_passes, "time each step of the build");
  build->add_flag("--quiet", build_args.quiet, "print nothing on success");
  build->add_option("--memory-budget", build_args.memory_budget, budget_help);
  add_pipeline_flags(build, ctx.pipeline);
  auto* sampler_flag = build->add_flag("--sampler", build_args.sampler,
                                       "build the model's sampler (napkin sample's inference program) instead of its trainer");
  build->add_option("--batch", build_args.batch, "--sampler: sequences sampled at once")
      ->check(CLI::Range(int64_t{1}, int64_t{4096}))->needs(sampler_flag)->capture_default_str();
  build->callback([&] { status = cmd_build(ctx, build_args); });

  std::vector<std::string> trainer_args;
  auto* train = app.add_subcommand("train", "build the trainer (cached) and run it; flags after -- go to the trainer");
  train->add_option("model", model, "model YAML file")->required();
  train->add_option("--dims", dims, dims_help);
  train->add_option("--memory-budget", budget, budget_help);
  std::string train_target = "cpu";
  train->add_option("--target", train_target, "cpu or cuda (sm_90, the h100's peak for MFU)")->capture_default_str();
  train->add_option("trainer_args", trainer_args, "flags for the trainer (see TRAINER --help)");
  train->prefix_command(false);
  add_pipeline_flags(train, ctx.pipeline);
  train->callback([&] { status = cmd_train(ctx, model, dims, budget, train_target, trainer_args); });

  SampleArgs sample_args;
  std::map<std::string, std::string> sample_flags;
  auto* sample = app.add_subcommand("sample", "generate text from a trained language model: a compiled prefill and "
                                              "KV-cache decoder (built and cached like trainers)");
  sample->add_option("model", sample_args.model, "model YAML file")->required();
  sample->add_option("--dims", sample_args.dims, dims_help);
  sample->add_option("--memory-budget", sample_args.memory_budget,
                     "the budget the model was trained under (its checkpoints carry that step's hash)");
  sample->add_option("--target", sample_args.target, "cpu or cuda")->capture_default_str();
  sample->add_option("--batch", sample_args.batch, "sequences sampled at once (the compiled batch)")
      ->check(CLI::Range(int64_t{1}, int64_t{4096}))->capture_default_str();
  for (const auto& [flag, help] : std::vector<std::pair<std::string, std::string>>{
           {"--checkpoint", "a checkpoint file, or a directory: its newest (default: the model's train.checkpoint.dir)"},
           {"--prompt", "text to continue (default: a newline, or the tokenizer's <|endoftext|>)"},
           {"--tokenizer", "the tokenizer.json that encodes --prompt and decodes the output (default: the model's "
                           "train.data.tokenizer)"},
           {"--prompt-ids", "a file of whitespace-separated token ids to continue"},
           {"--tokens", "tokens to generate (default 256)"},
           {"--temperature", "softmax temperature, 0: greedy (default 1)"},
           {"--top-k", "sample from the k most likely tokens only (default 0: all)"},
           {"--seed", "seed of the sampling draws (default 0)"},
           {"--prompt-path", "how the prompt enters the KV cache: prefill, steps or auto (default: the faster as napkin "
                             "predicts it)"},
           {"--threads", "worker threads (default 0: the CPUs this process may use)"},
           {"--logits", "write the logits at every prompt position to this .npy file (f32 [prompt tokens, vocab]; "
                        "the prompt goes in by the prefill)"}})
    sample->add_option(flag, sample_flags[flag], help);
  sample->callback([&] {
    for (const auto& [flag, value] : sample_flags)
      if (sample->count(flag) > 0) sample_args.flags.emplace_back(flag, value);
    status = cmd_sample(sample_args);
  });

  std::vector<std::string> plot_inputs;
  std::string plot_output;
  auto* plot = app.add_subcommand("plot", "charts of training runs' metrics files: loss (train, eval), tokens/s, MFU");
  plot->add_option("metrics", plot_inputs, "metrics files (.jsonl, a trainer's --metrics)")->required();
  plot->add_option("-o,--output", plot_output, "FILE.svg or FILE.html (default: the first file's name with .html)");
  plot->callback([&] { status = tools::plot_command(plot_inputs, plot_output); });

  std::string checkpoint_input, checkpoint_output;
  auto* checkpoint = app.add_subcommand("checkpoint", "training checkpoints: make a sharded one one file, verify one");
  checkpoint->require_subcommand(1);
  auto* consolidate = checkpoint->add_subcommand(
      "consolidate", "write a sharded checkpoint (DIR/step-N.sharded, one file per rank) as the one file a single-"
                     "format save writes, which --init, --resume, napkin sample and napkin hf export read");
  consolidate->add_option("checkpoint", checkpoint_input, "the sharded checkpoint's directory")->required();
  consolidate->add_option("-o,--output", checkpoint_output, "FILE.safetensors to write")->required();
  consolidate->callback([&] { status = tools::checkpoint_consolidate(checkpoint_input, checkpoint_output); });
  auto* verify = checkpoint->add_subcommand(
      "verify", "check that a checkpoint (a step-N.safetensors file or a step-N.sharded directory) is whole: every "
                "file's size and checksum");
  verify->add_option("checkpoint", checkpoint_input, "the checkpoint")->required();
  verify->callback([&] { status = tools::checkpoint_verify(checkpoint_input); });

  tools::EncodeOptions encode_options;
  auto* data = app.add_subcommand("data", "make data files");
  data->require_subcommand(1);
  auto* encode = data->add_subcommand(
      "encode", "a token file from text files: byte-level BPE with --tokenizer, else one token per byte (vocab 256)");
  encode->add_option("inputs", encode_options.inputs,
                     "text files, one document each (any bytes: byte-level BPE needs no UTF-8)")
      ->required();
  encode->add_option("-o,--output", encode_options.output, "token file to write")->required();
  encode->add_option("--tokenizer", encode_options.tokenizer,
                     "a byte-level BPE tokenizer.json (napkin data bpe's, GPT-2's, ...); without it, byte-level tokens");
  encode->add_option("--dtype", encode_options.dtype,
                     "u16 or u32 little-endian ids (default: u16 when the vocabulary fits, else u32)")
      ->check(CLI::IsMember({"u16", "u32"}));
  encode->add_flag("--llmc", encode_options.llmc,
                   "llm.c's 1,024-byte header first (magic, version, token count), as its dev/data scripts write");
  encode->add_flag("--eot", encode_options.eot,
                   "the tokenizer's <|endoftext|> (or its one special token) before each document (input file)");
  encode->add_option("--threads", encode_options.threads, "worker threads (default 0: the CPUs this process may use)");
  // Testing: tiny blocks exercise the cuts between blocks.
  encode->add_option("--block-bytes", encode_options.block_bytes, "bytes read at a time")->group("");
  encode->callback([&] { status = cmd_data_encode(encode_options); });

  tools::DecodeOptions decode_options;
  auto* decode = data->add_subcommand(
      "decode", "a token file's text on stdout (napkin data encode's, or llm.c's): by --tokenizer, else bytes");
  decode->add_option("input", decode_options.input, "token file")->required();
  decode->add_option("--tokenizer", decode_options.tokenizer, "the tokenizer.json the file was encoded with");
  decode->add_option("--dtype", decode_options.dtype,
                     "a raw file's ids: u16, u32 or i32 (default: u16 when the vocabulary fits, else u32; llm.c's "
                     "header says for itself)")
      ->check(CLI::IsMember({"u16", "u32", "i32"}));
  decode->add_option("--first", decode_options.first, "the first id decoded (default 0)")->check(CLI::NonNegativeNumber);
  decode->add_option("--count", decode_options.count, "ids decoded (default: to the end)")->check(CLI::NonNegativeNumber);
  decode->callback([&] { status = cmd_data_decode(decode_options); });

  BpeArgs bpe_args;
  auto* bpe = data->add_subcommand(
      "bpe", "train a byte-level BPE tokenizer (GPT-2's pre-tokenization) and write its tokenizer.json; the corpus "
             "may hold any bytes, UTF-8 or not");
  bpe->add_option("corpus", bpe_args.corpus, "text files, each a document")->required();
  bpe->add_option("--vocab", bpe_args.vocab, "the vocabulary size: 256 bytes + merges + special tokens")
      ->required()->check(CLI::PositiveNumber);
  bpe->add_option("-o,--output", bpe_args.output, "the tokenizer.json to write")->required();
  bpe->add_option("--special", bpe_args.specials,
                  "a special token, e.g. \"<|endoftext|>\" (repeat the flag for more): it cuts the text, is never "
                  "merged, and takes the ids after the merges")
      ->allow_extra_args(false);
  bpe->add_option("--threads", bpe_args.threads, "counting threads (default 0: the CPUs this process may use)")
      ->check(CLI::NonNegativeNumber);
  bpe->add_flag("--quiet", bpe_args.quiet, "no progress on stderr");
  bpe->callback([&] { status = cmd_data_bpe(bpe_args); });

  HfArgs hf_args;
  auto* hf = app.add_subcommand("hf", "Hugging Face transformers checkpoints in and out, by the model's huggingface: section");
  hf->require_subcommand(1);
  auto* hf_import = hf->add_subcommand(
      "import", "a transformers checkpoint's weights into a file a trainer's --init and napkin sample load");
  hf_import->add_option("model", hf_args.model, "model YAML file with a huggingface: section")->required();
  hf_import->add_option("checkpoint", hf_args.input,
                        "a directory with model.safetensors or model.safetensors.index.json and its shards, or one "
                        ".safetensors file")
      ->required();
  hf_import->add_option("-o,--output", hf_args.output, "the weights file to write (.safetensors)")->required();
  hf_import->add_option("--dims", hf_args.dims, dims_help);
  hf_import->callback([&] { status = cmd_hf_import(hf_args); });
  auto* hf_export = hf->add_subcommand(
      "export", "a napkin checkpoint's parameters into a directory transformers' from_pretrained loads");
  hf_export->add_option("model", hf_args.model, "model YAML file with a huggingface: section")->required();
  hf_export->add_option("checkpoint", hf_args.input, "a napkin checkpoint (step-N.safetensors), a directory of them (its newest), or a weights file")->required();
  hf_export->add_option("-o,--output", hf_args.output, "the directory to write config.json and model.safetensors into")
      ->required();
  hf_export->add_option("--dtype", hf_args.dtype, "the dtype of the exported weights: f32, bf16 or f16")->capture_default_str();
  hf_export->add_option("--dims", hf_args.dims, dims_help);
  hf_export->callback([&] { status = cmd_hf_export(hf_args); });

  tools::DevicesArgs devices_args;
  auto* devices = app.add_subcommand("devices", "list the device table; --measure measures this host for it");
  devices->add_flag("--sources", devices_args.sources, "every figure with its value and where it comes from");
  auto* measure = devices->add_flag("--measure", devices_args.measure,
                                    "measure this host (napkin's own GEMM, triad, loop and thread pool; 20 s to a minute) "
                                    "and write its cpu row to the local device file");
  devices->add_option("--out", devices_args.out, "with --measure: the device file to write (default: " +
                                                     (analysis::local_device_file().empty() ? std::string("none")
                                                                                          : analysis::local_device_file()) +
                                                     ")")
      ->needs(measure);
  devices->add_option("--threads", devices_args.threads, "with --measure: threads (default: what a trainer uses, the CPUs this "
                                                                "process may use or $NAPKIN_NUM_THREADS)")
      ->check(CLI::Range(1, 4096))
      ->needs(measure);
  devices->add_flag("--quick", devices_args.quick, "with --measure: small problems, a few seconds, rough figures")
      ->needs(measure);
  devices->callback([&] { status = tools::cmd_devices(devices_args); });
  app.add_subcommand("ops", "list the op table")->callback([&] { status = cmd_ops(); });

  // The local device file's rows replace the built-in ones for every command
  // (a report, a trainer's MFU), before any command runs. `devices --measure`
  // skips it: measuring again is how a broken file gets replaced.
  app.parse_complete_callback([&] {
    if (devices->parsed() && devices_args.measure) return;
    if (std::string error = analysis::use_local_devices(analysis::local_device_file()); !error.empty()) {
      std::cerr << "error: " << error << "\n";
      throw CLI::RuntimeError(kUserError);
    }
  });

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);
    return code == 0 ? 0 : kUserError;
  } catch (const ir::InternalError& e) {
    std::cerr << e.what() << "\nthis is a bug in napkin, not in your model; please report it with the model file\n";
    return kInternalError;
  } catch (const std::exception& e) {
    std::cerr << "internal error: unexpected exception: " << e.what()
              << "\nthis is a bug in napkin, not in your model; please report it with the model file\n";
    return kInternalError;
  }
  return status;
}
