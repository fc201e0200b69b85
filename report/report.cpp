#include "report/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <nlohmann/json.hpp>

#include "analysis/memory_plan.h"
#include "analysis/step_time.h"
#include "ir/quantities.h"
#include "report/amp_audit.h"
#include "report/distributed_report.h"
#include "report/fusion_report.h"
#include "report/kernel_table.h"

namespace napkin::report {

using ir::human_bytes;
using ir::human_flops;
using ir::human_seconds;
using ir::with_commas;

namespace {

std::string shape_text(const ir::TensorType& t) {
  std::vector<std::string> sizes;
  for (const ir::Dim& d : t.dims) sizes.push_back(std::to_string(d.size));
  return fmt::format("{}[{}]", ir::dtype_name(t.dtype), fmt::join(sizes, ","));
}

double intensity(const ir::OpCost& c) {
  double bytes = c.bytes_read + c.bytes_written;
  return bytes > 0 ? c.flops / bytes : 0;
}

std::string op_label(const ir::Graph& g, const analysis::OpRow& row) {
  const ir::Node& n = g.node(row.node);
  std::string label(ir::op_name(n.op));
  if (row.copies) label += " (rearrange copy)";
  return label;
}

// "compute" or "memory" (the larger roofline term), "-" for free ops, "no-peak".
const char* bound_word(const analysis::OpRow& row) {
  if (row.no_peak) return "no-peak";
  if (row.seconds == 0) return "-";
  return row.compute_bound ? "compute" : "memory";
}

// The gap between counted forward FLOPs and 2·tokens·params, term by term.
struct Gap {
  double two_tp, no_matmul_params, param_matmul_excess, activation, other;
};
Gap gap_terms(const analysis::StepCost& c) {
  double t = c.tokens;
  const analysis::PhaseCost& f = c.phase(ir::Phase::Forward);
  return {2 * t * c.params, -2 * t * static_cast<double>(c.params - c.params_in_matmuls),
          f.param_matmul_flops - 2 * t * c.params_in_matmuls, f.activation_matmul_flops, f.other_flops};
}

// The gap between the counted step and 6·tokens·params, term by term; the
// terms add up to counted − 6TP exactly (docs/report.md).
struct StepGap {
  double six_tp, no_matmul_params, forward_weight_excess, backward_weight_excess, activation, other, optimizer;
};
StepGap step_gap_terms(const analysis::StepCost& c) {
  double t = c.tokens;
  const analysis::PhaseCost &f = c.phase(ir::Phase::Forward), &b = c.phase(ir::Phase::Backward);
  double p_mm = static_cast<double>(c.params_in_matmuls);
  return {6 * t * c.params,
          -6 * t * static_cast<double>(c.params - c.params_in_matmuls),
          f.param_matmul_flops - 2 * t * p_mm,
          b.param_matmul_flops - 4 * t * p_mm,
          f.activation_matmul_flops + b.activation_matmul_flops,
          f.other_flops + b.other_flops,
          c.phase(ir::Phase::Optimizer).flops};
}

// PaLM's model FLOPs per token (Chowdhery et al. 2022, appendix B):
// 6·N + 12·L·d·T, the second term the attention matmuls (scores and mixing,
// forward and backward). L, d and T are read off the forward attention sites
// and nothing else: a fused attention node (q [b, h, T, hd] first, k second),
// or where attention is left spelled out, the scores contraction that a
// softmax over the last axis reads through elementwise ops (scale, mask).
// Other matmuls between activations (RoPE's outer product of positions and
// frequencies, a mixer's token mixing) are not attention and say nothing of
// L, d or T. L = the sites, T = the first one's keys, d = the elements of its
// queries per token.
struct PalmTerms {
  bool found = false;
  double layers = 0, d = 0, seq = 0;
};

// The scores contraction a softmax over the last axis reads, through
// elementwise ops whose operand of the output's shape it follows; null when
// the chain reaches anything else.
const ir::Node* scores_contraction(const ir::Graph& g, const ir::Node& softmax) {
  const ir::TensorType& shape = g.value(softmax.in(0)).type;
  if (shape.rank() < 2 || softmax.attrs.get_int("axis") != shape.rank() - 1) return nullptr;
  ir::ValueId x = softmax.in(0);
  while (true) {
    const ir::Value& v = g.value(x);
    if (v.producer == ir::kNoNode) return nullptr;
    const ir::Node& n = g.node(v.producer);
    const ir::OpClass kind = ir::op_info(n.op).op_class;
    if (kind == ir::OpClass::Contraction) return &n;
    if (kind != ir::OpClass::Elementwise) return nullptr;
    auto same_shape = std::find_if(n.inputs.begin(), n.inputs.end(),
                                   [&](ir::ValueId in) { return g.value(in).type.same_shape(shape); });
    if (same_shape == n.inputs.end()) return nullptr;
    x = *same_shape;
  }
}

PalmTerms palm_terms(const ir::Graph& g, const analysis::StepCost& c) {
  PalmTerms p;
  if (c.tokens <= 0) return p;
  for (ir::NodeId id : g.schedule()) {
    const ir::Node& n = g.node(id);
    if (n.phase != ir::Phase::Forward) continue;
    const ir::Node* queries_from = nullptr;  // the node whose first operand is q
    double keys = 0;
    if (n.op == ir::Op::Attention || n.op == ir::Op::CachedAttention) {
      queries_from = &n;
      keys = static_cast<double>(g.value(n.in(1)).type.dims[2].size);
    } else if (n.op == ir::Op::Softmax) {
      queries_from = scores_contraction(g, n);
      if (queries_from) keys = static_cast<double>(g.value(queries_from->out()).type.dims.back().size);
    }
    if (!queries_from) continue;
    if (!p.found) {
      p.found = true;
      p.seq = keys;
      p.d = static_cast<double>(g.value(queries_from->in(0)).type.numel()) / c.tokens;
    }
    ++p.layers;
  }
  return p;
}

// "+1,234" / "-1,234": a term of a sum.
std::string signed_commas(double v) {
  std::string n = with_commas(v);
  return (n[0] == '-' ? "" : "+") + n;
}

std::string list_names(const std::vector<std::string>& names, size_t limit) {
  std::vector<std::string> shown(names.begin(), names.begin() + std::min(limit, names.size()));
  std::string out = fmt::format("{}", fmt::join(shown, ", "));
  if (names.size() > limit) out += fmt::format(", ... ({} in all)", names.size());
  return out;
}

}  // namespace

namespace {

std::string ops_table(const ir::Graph& g, const analysis::StepCost& c) {
  std::string out = "\nops (schedule order; FLOPs: 2 per multiply-add; views are free)\n";
  out += fmt::format("{:>4}  {:<5} {:<26} {:>5}  {:<10} {:<22} {:>11} {:>11} {:>11} {:>8}", "#", "phase", "op", "line",
                     "scope", "output", "FLOPs", "read", "written", "FLOP/B");
  if (c.device) out += fmt::format(" {:>10}  {}", "roofline", "bound");
  out += "\n";
  int index = 0;
  for (const analysis::OpRow& row : c.rows) {
    const ir::Node& n = g.node(row.node);
    static const char* const kPhase[] = {"fwd", "bwd", "opt"};
    out += fmt::format("{:>4}  {:<5} {:<26} {:>5}  {:<10} {:<22} {:>11} {:>11} {:>11} {:>8.3g}", ++index,
                       kPhase[static_cast<int>(row.phase)], op_label(g, row), n.loc.line,
                       n.scope.empty() ? "-" : n.scope, shape_text(g.value(n.out()).type), human_flops(row.cost.flops),
                       human_bytes(row.cost.bytes_read), human_bytes(row.cost.bytes_written), intensity(row.cost));
    if (c.device) {
      if (row.no_peak)
        out += fmt::format(" {:>10}  no {} peak on {}", "n/a", ir::dtype_name(row.compute_dtype), c.device->name);
      else
        out += fmt::format(" {:>10}  {}", human_seconds(row.seconds), bound_word(row));
    }
    out += "\n";
  }
  return out;
}

std::string phase_line(const char* label, const analysis::PhaseCost& p, const analysis::PhaseCost& forward, const analysis::Device* device) {
  std::string out = fmt::format("  {:<20} {:>22}  ({}", label, with_commas(p.flops), human_flops(p.flops));
  if (&p != &forward && forward.flops > 0) out += fmt::format("; {:.3f}x forward", p.flops / forward.flops);
  out += ")";
  if (device) out += fmt::format("  {:>10} roofline", human_seconds(p.seconds));
  return out + "\n";
}

std::string flops_section(const analysis::StepCost& c) {
  std::string out = "\nFLOPs per step (ops: forward " + std::to_string(c.phase(ir::Phase::Forward).ops) + ", backward " +
                    std::to_string(c.phase(ir::Phase::Backward).ops) + ", optimizer " +
                    std::to_string(c.phase(ir::Phase::Optimizer).ops) + ")\n";
  const analysis::PhaseCost& f = c.phase(ir::Phase::Forward);
  out += phase_line("forward", f, f, c.device);
  out += phase_line("backward", c.phase(ir::Phase::Backward), f, c.device);
  out += phase_line("optimizer", c.phase(ir::Phase::Optimizer), f, c.device);
  out += phase_line("total", c.total, f, c.device);
  if (c.total.recompute_flops > 0)
    out += fmt::format("  recompute            {:>22}  ({}: fused attention's backward recomputes its scores, the fused classifier's its logits; not in total or MFU)\n",
                       with_commas(c.total.recompute_flops), human_flops(c.total.recompute_flops));
  out += fmt::format("  bytes read           {:>22}  ({})\n", with_commas(c.total.bytes_read), human_bytes(c.total.bytes_read));
  out += fmt::format("  bytes written        {:>22}  ({})\n", with_commas(c.total.bytes_written),
                     human_bytes(c.total.bytes_written));
  return out;
}

// The step's predicted time on the report's device (none without one): computed once, read by each section.
std::optional<analysis::StepTime> predicted_time(const ir::Graph& g, const analysis::StepCost& c) {
  if (!c.device) return std::nullopt;
  return analysis::predict_step_time(g, c, *c.device);
}

std::string time_section(const ir::Graph& g, const analysis::StepCost& c, const std::optional<analysis::StepTime>& time,
                         const analysis::MoeFigures& moe) {
  if (!c.device || !time) return "";
  const analysis::Device& d = *c.device;
  const analysis::StepTime& t = *time;
  std::string out = fmt::format(
      "\ntime on {} (time model: per kernel after fusion, max(FLOPs/rate, bytes/bandwidth) + launch; docs/report.md)\n",
      d.name);
  out += fmt::format("  predicted step       {:>22}  ({} kernels; {} of it launch overhead)\n", human_seconds(t.seconds),
                     t.kernels.size(), human_seconds(t.launch_seconds));
  for (int k = 0; k < analysis::kNumKernelClasses; ++k)
    if (t.class_seconds[k] > 0)
      out += fmt::format("    {:<18} {:>22}  ({:.1f}%)\n", analysis::kernel_class_name(static_cast<analysis::KernelClass>(k)),
                         human_seconds(t.class_seconds[k]), 100 * t.class_seconds[k] / t.seconds);
  double peak = analysis::matmul_peak(d, c.matmul_dtype);
  if (peak > 0 && t.seconds > 0) {
    out += fmt::format("  MFU                  {:>21.1f}%  (counted FLOPs / (predicted step x {} {} matmul peak {}/s))\n",
                       100 * t.mfu, d.name, ir::dtype_name(c.matmul_dtype), human_flops(peak));
    double model = 6 * c.tokens * c.params;
    out += fmt::format("  MFU (6·N·D)          {:>21.1f}%  (6·tokens·params / (predicted step x peak){})\n",
                       100 * model / (t.seconds * peak),
                       moe.has_moe() ? ": every expert counted, though a token uses k of E" : "");
    // A mixture of experts' model FLOPs: what a token uses (the active parameters), the convention MoE papers
    // report, below the counted FLOPs' MFU, which counts the capacity's padding slots as work.
    if (moe.has_moe())
      out += fmt::format("  MFU (6·N_active·D)   {:>21.1f}%  (6·tokens·active params / (predicted step x peak))\n",
                         100 * 6 * c.tokens * static_cast<double>(moe.active_params) / (t.seconds * peak));
  }
  out += fmt::format("  per-op roofline sum  {:>22}  (each op of the table alone at peak rate, before fusion)\n",
                     human_seconds(c.total.seconds));
  if (peak > 0 && t.roofline_seconds > 0)
    out += fmt::format("  kernel roofline      {:>22}  (the kernels after fusion at peak FLOP/s or main-memory bandwidth, no "
                       "launch overhead: MFU {:.1f}%)\n",
                       human_seconds(t.roofline_seconds), 100 * t.roofline_mfu);
  if (t.kernels_without_peak > 0)
    out += fmt::format("  INCOMPLETE: {} {} in a dtype {} has no peak for; not counted in the time\n", t.kernels_without_peak,
                       t.kernels_without_peak == 1 ? "kernel computes" : "kernels compute", d.name);
  std::string figures = peak > 0 ? fmt::format("  peak: {}\n", d.source_of(analysis::peak_figure_name(d, c.matmul_dtype))) : "";
  figures += fmt::format("  bandwidth: {}\n", d.source_of("bandwidth"));
  if (std::string file = analysis::local_origin(d); !file.empty()) figures += fmt::format("  (row read from the local device file {})\n", file);
  return out + figures + kernel_table_text(kernel_kinds(g, t), t.seconds);
}

// The distributed step when the options ask for one (ranks on an interconnect, a device, a training step).
int64_t micro_batches(const ir::Graph& g, const ReportOptions& o) {
  return o.accumulate > 0 ? o.accumulate : std::max<int64_t>(1, g.config.train.accumulate);
}

std::optional<analysis::DistributedStep> distributed_step(const ir::Graph& g, const analysis::StepCost& c,
                                                          const analysis::MemoryReport& memory, const ReportOptions& o,
                                                          const std::optional<analysis::StepTime>& time) {
  if (!o.interconnect || !c.device || !time || !c.has_backward()) return std::nullopt;
  return analysis::predict_distributed(g, *time, memory, c.total.flops, analysis::matmul_peak(*c.device, c.matmul_dtype),
                                       {o.ranks, o.interconnect, o.inter_node, o.ranks_per_node}, micro_batches(g, o),
                                       c.phase(ir::Phase::Optimizer).flops);
}

// Gradient accumulation (docs/distributed.md): K forward+backward passes,
// then one update, and the trainer's f32 sum of the gradients.
struct Accumulation {
  int64_t micro_batches = 1;
  double tokens = 0, flops = 0, forward_backward_flops = 0, optimizer_flops = 0;
  double gradient_sum_bytes = 0;  // f32, one per gradient element (runtime/gradient_stage.h)
  bool predicted = false;
  double step_seconds = 0, mfu = 0;
};

Accumulation accumulation(const ir::Graph& g, const analysis::StepCost& c, const ReportOptions& o,
                          const std::optional<analysis::StepTime>& time) {
  Accumulation a;
  a.micro_batches = micro_batches(g, o);
  const double k = static_cast<double>(a.micro_batches);
  a.optimizer_flops = c.phase(ir::Phase::Optimizer).flops;
  a.forward_backward_flops = c.total.flops - a.optimizer_flops;
  a.flops = k * a.forward_backward_flops + a.optimizer_flops;
  a.tokens = k * c.tokens;
  for (const auto& [label, v] : g.outputs)
    if (label.rfind("grad.", 0) == 0) a.gradient_sum_bytes += 4.0 * static_cast<double>(g.value(v).type.numel());
  if (time && c.device) {
    double optimizer = 0;
    for (const analysis::KernelTime& kt : time->kernels)
      if (kt.phase == ir::Phase::Optimizer) optimizer += kt.seconds;
    a.predicted = true;
    a.step_seconds = k * (time->seconds - optimizer) + optimizer;
    const double peak = analysis::matmul_peak(*c.device, c.matmul_dtype);
    a.mfu = peak > 0 && a.step_seconds > 0 ? a.flops / (a.step_seconds * peak) : 0;
  }
  return a;
}

std::string accumulation_section(const ir::Graph& g, const analysis::StepCost& c, const ReportOptions& o,
                                 const std::optional<analysis::StepTime>& time) {
  const Accumulation a = accumulation(g, c, o, time);
  if (a.micro_batches <= 1) return "";
  std::string out = fmt::format("\ngradient accumulation: {} micro-batches per step ({}; docs/distributed.md)\n",
                                a.micro_batches, o.accumulate > 0 ? "--accumulate" : "train.accumulate");
  out += fmt::format("  tokens per step      {:>22}  ({} x {} a micro-batch)\n", with_commas(a.tokens), a.micro_batches,
                     with_commas(c.tokens));
  out += fmt::format("  FLOPs per step       {:>22}  ({}: {} x forward+backward {} + the optimizer {} once)\n",
                     with_commas(a.flops), human_flops(a.flops), a.micro_batches, human_flops(a.forward_backward_flops),
                     human_flops(a.optimizer_flops));
  if (a.predicted)
    out += fmt::format("  predicted step       {:>22}  (MFU {:.1f}% on {})\n", ir::human_seconds(a.step_seconds),
                       100 * a.mfu, c.device->name);
  out += fmt::format("  gradient sum         {:>22}  ({}: f32, one per gradient element; the trainer's, besides the "
                     "arena)\n",
                     with_commas(a.gradient_sum_bytes), human_bytes(a.gradient_sum_bytes));
  return out;
}

std::string step_rule_section(const ir::Graph& g, const analysis::StepCost& c, const analysis::MoeFigures& moe) {
  StepGap gap = step_gap_terms(c);
  std::string out = "\nstep FLOPs vs 6·tokens·params\n";
  out += fmt::format("  tokens per step      {:>22}  ({})\n", with_commas(c.tokens), c.tokens_source);
  out += fmt::format("  6·tokens·params      {:>22}  ({})\n", with_commas(gap.six_tp), human_flops(gap.six_tp));
  if (moe.has_moe()) {
    const double six_active = 6 * c.tokens * static_cast<double>(moe.active_params);
    out += fmt::format("  6·tokens·active      {:>22}  ({}; counted step is {:.4f}x: the experts compute E·C slots, "
                       "padding included)\n",
                       with_commas(six_active), human_flops(six_active), six_active > 0 ? c.total.flops / six_active : 0.0);
  }
  out += fmt::format("  counted step         {:>22}  ({}; {:.4f}x the rule)\n", with_commas(c.total.flops),
                     human_flops(c.total.flops), gap.six_tp > 0 ? c.total.flops / gap.six_tp : 0.0);
  out += "  the difference, term by term:\n";
  out += fmt::format("    {:>22}  params that do no matmul work (6 FLOPs per token each)\n", signed_commas(gap.no_matmul_params));
  out += fmt::format("    {:>22}  forward weight matmuls beyond 2 FLOPs per weight per token\n",
                     signed_commas(gap.forward_weight_excess));
  out += fmt::format("    {:>22}  backward weight matmuls vs 4 FLOPs per weight per token (less where an input needs no gradient)\n",
                     signed_commas(gap.backward_weight_excess));
  out += fmt::format("    {:>22}  matmuls between activations, forward and backward (attention)\n", signed_commas(gap.activation));
  out += fmt::format("    {:>22}  elementwise, normalization, softmax and loss ops, forward and backward\n",
                     signed_commas(gap.other));
  out += fmt::format("    {:>22}  the optimizer update ({} elementwise FLOPs per parameter)\n", signed_commas(gap.optimizer),
                     c.params > 0 ? fmt::format("{:.3g}", gap.optimizer / c.params) : "0");
  PalmTerms palm = palm_terms(g, c);
  if (!palm.found) {
    out += "  PaLM: no attention in the forward (no attention op, no softmax over scores), so no 12·L·d·T term\n";
  } else {
    double n = static_cast<double>(c.params_in_matmuls);
    double per_token = 6 * n + 12 * palm.layers * palm.d * palm.seq;
    out += fmt::format("  PaLM: (6·N + 12·L·d·T)·tokens, N = {} params in matmuls, L = {}, d = {}, T = {}\n", with_commas(n),
                       with_commas(palm.layers), with_commas(palm.d), with_commas(palm.seq));
    out += fmt::format("                       {:>22}  ({}; counted is {:.4f}x)\n", with_commas(per_token * c.tokens),
                       human_flops(per_token * c.tokens), c.total.flops / (per_token * c.tokens));
  }
  return out;
}

std::string forward_rule_section(const analysis::StepCost& c) {
  Gap gap = gap_terms(c);
  const analysis::PhaseCost& f = c.phase(ir::Phase::Forward);
  std::string out = "\nforward FLOPs vs 2·tokens·params\n";
  out += fmt::format("  2·tokens·params      {:>22}  ({})\n", with_commas(gap.two_tp), human_flops(gap.two_tp));
  out += fmt::format("  counted forward      {:>22}  ({}; {:.4f}x the rule)\n", with_commas(f.flops), human_flops(f.flops),
                     gap.two_tp > 0 ? f.flops / gap.two_tp : 0.0);
  out += "  the difference, term by term:\n";
  out += fmt::format("    {:>22}  params that do no matmul work ({} of them{})\n", signed_commas(gap.no_matmul_params),
                     with_commas(c.params - c.params_in_matmuls),
                     c.params_without_matmul.empty() ? "" : ": " + list_names(c.params_without_matmul, 6));
  out += fmt::format("    {:>22}  matmuls between activations (attention scores and mixing)\n", signed_commas(gap.activation));
  out += fmt::format("    {:>22}  elementwise, normalization, softmax and loss ops\n", signed_commas(gap.other));
  out += fmt::format("    {:>22}  weight matmuls beyond 2 FLOPs per weight per token\n", signed_commas(gap.param_matmul_excess));
  return out;
}

std::string peak_where(const ir::Graph& g, const analysis::MemoryPeak& peak) {
  if (!peak.found) return "no ops";
  const ir::Node& n = g.node(peak.node);
  return fmt::format("at op #{} {} ({}, line {}{})", peak.position + 1, ir::op_name(n.op), ir::phase_name(peak.phase),
                     n.loc.line, n.scope.empty() ? "" : ", " + n.scope);
}

double percent_over(int64_t value, int64_t bound) {
  return bound > 0 ? 100.0 * static_cast<double>(value - bound) / static_cast<double>(bound) : 0.0;
}

// The memory plan's numbers (docs/memory-planning.md), for text and JSON.
struct PlanNumbers {
  int64_t naive = 0, peak = 0, arena = 0;
  int in_place_buffers = 0;
  int64_t in_place_bytes = 0, arena_without_reuse = 0, peak_without_reuse = 0;
};
PlanNumbers plan_numbers(const ir::Graph& g, const analysis::MemoryReport& m) {
  analysis::MemoryPlan plan = analysis::plan_memory(m);
  analysis::MemoryReport separate = analysis::analyze_memory(g, {.in_place_reuse = false});
  return {analysis::naive_bytes(m),         m.peak.bytes,       plan.arena_bytes, plan.in_place_buffers, plan.in_place_bytes,
          analysis::plan_memory(separate).arena_bytes, separate.peak.bytes};
}

std::string plan_lines(const ir::Graph& g, const analysis::MemoryReport& m) {
  PlanNumbers p = plan_numbers(g, m);
  auto line = [](std::string_view label, int64_t bytes, const std::string& what) {
    return fmt::format("  {:<20} {:>22}  ({}: {})\n", label, with_commas(static_cast<double>(bytes)),
                       human_bytes(static_cast<double>(bytes)), what);
  };
  std::string out;
  out += line("naive sum", p.naive, "every buffer its own memory");
  out += line("liveness bound", p.peak, "the peak above: no placement needs less");
  out += line("arena", p.arena,
              fmt::format("the planned offsets a trainer allocates, {:+.2f}% over the bound", percent_over(p.arena, p.peak)));
  out += fmt::format("  in-place reuse saves {:>22}  (arena bytes: {} buffers, {}, overwrite an input they read last; without reuse: peak {}, arena {})\n",
                     with_commas(static_cast<double>(p.arena_without_reuse - p.arena)), p.in_place_buffers,
                     human_bytes(static_cast<double>(p.in_place_bytes)), with_commas(static_cast<double>(p.peak_without_reuse)),
                     with_commas(static_cast<double>(p.arena_without_reuse)));
  return out;
}

// The step's fused attention kernels (forward ones: attention nodes).
int attention_kernels(const ir::Graph& g) {
  int n = 0;
  for (ir::NodeId id : g.schedule()) n += g.node(id).op == ir::Op::Attention;
  return n;
}

// Each attention site: fused into one kernel, or why not (passes/fuse_attention.h).
std::string attention_section(const ir::Graph& g, const std::vector<passes::AttentionSite>& sites) {
  const int called = attention_kernels(g);
  int fused = 0;
  for (const passes::AttentionSite& s : sites) fused += s.fused;
  if (sites.empty() && called == 0) return "";
  std::string out = fmt::format("\nattention ({} fused kernel{}: no [batch, heads, queries, keys] value is stored)\n", called,
                                called == 1 ? "" : "s");
  if (called > fused) out += fmt::format("  written as attention(q, k, v)  {:>4}\n", called - fused);
  // Sites in repeated blocks differ only by scope: say each line once.
  std::map<std::pair<int, std::string>, int> seen;
  for (const passes::AttentionSite& s : sites) ++seen[{s.loc.line, s.fused ? "" : s.reason}];
  for (const auto& [key, count] : seen)
    out += fmt::format("  line {:<5} {:>3} site{}  {}\n", key.first, count, count == 1 ? " " : "s",
                       key.second.empty() ? "fused" : "not fused: " + key.second);
  return out;
}

// Each cross_entropy: fused with its matmul into the classifier, or why not
// (passes/fuse_classifier.h), and the logits the fused ones never store.
std::string classifier_section(const ir::Graph& g, const std::vector<passes::ClassifierSite>& sites) {
  if (sites.empty()) return "";
  std::string out = "\nclassifier (matmul + cross_entropy as one kernel each way: no [rows, classes] logits are stored)\n";
  for (const passes::ClassifierSite& s : sites)
    out += fmt::format("  line {:<5} {}\n", s.loc.line, s.fused ? "fused" : "not fused: " + s.reason);
  for (ir::NodeId id : g.schedule()) {
    const ir::Node& n = g.node(id);
    if (n.op != ir::Op::LinearCrossEntropy) continue;
    const ir::ClassifierDims c = ir::classifier_dims(g, n);
    const ir::DType dt = g.value(n.in(0)).type.dtype;
    const double logits = c.rows * c.vocab;
    out += fmt::format("  logits never stored  {:>22}  ({} rows x {} classes; {} in {} as the matmul wrote them, as much "
                       "again for their gradient)\n",
                       with_commas(logits), with_commas(c.rows), with_commas(c.vocab),
                       human_bytes(logits * ir::dtype_size(dt)), ir::dtype_name(dt));
  }
  return out;
}

// ZeRO-3's collectives in the step (napkin build --zero 3): its units, where
// the prefetch issued their gathers, and the pass's time model of them
// (passes/shard_parameters.h).
std::string shard_section(const passes::ShardSchedule& s) {
  int forward = 0, backward = 0, gathers = 0;
  double bytes = 0;
  for (const passes::ShardUnit& u : s.units) {
    (u.phase == ir::Phase::Forward ? forward : backward) += 1;
    gathers += u.gathers, bytes += u.bytes;
  }
  std::string out = fmt::format(
      "\nzero-3 collectives in the step (--zero 3; time model: {} compute, {} link at {} ranks; docs/distributed.md)\n",
      s.device, s.link, s.ranks);
  out += fmt::format("  units                {:>22}  ({} forward, {} backward: a block of a repeat, or a run of top-level parameters)\n",
                     s.units.size(), forward, backward);
  out += fmt::format("  all-gathers          {:>22}  ({} gathered, {:.3f} ms)\n", gathers, human_bytes(bytes), s.gather_seconds * 1e3);
  out += fmt::format("  reduces              {:>22}  ({:.3f} ms with the all-reduces, each waited for at once)\n", s.reduces,
                     s.reduce_seconds * 1e3);
  out += fmt::format("  prefetch             {:>22}  ({})\n", s.prefetch ? "on" : "off",
                     s.prefetch ? "each unit's gathers issued where they arrive before its first use, at most one unit ahead"
                                : "each gather right before its first use");
  out += fmt::format("  compute              {:>19.3f} ms  (the step's nodes at the roofline, unfused)\n", s.compute_seconds * 1e3);
  out += fmt::format("  exposed              {:>19.3f} ms  (what the collectives add to it: {:.0f}% of their time hidden)\n",
                     s.exposed_seconds * 1e3,
                     s.gather_seconds + s.reduce_seconds > 0
                         ? 100 * (1 - s.exposed_seconds / (s.gather_seconds + s.reduce_seconds))
                         : 0.0);
  return out;
}

std::string recompute_section(const passes::RecomputeReport& r) {
  std::string out = fmt::format("\nrecompute (--memory-budget {}: {})\n", with_commas(static_cast<double>(r.budget)),
                                human_bytes(static_cast<double>(r.budget)));
  if (r.values.empty()) {
    out += fmt::format("  nothing: the arena ({}) already fits\n", with_commas(static_cast<double>(r.arena_before)));
    return out;
  }
  out += fmt::format("  {:>12}  {:>12}  {:<16} {:<32} {}\n", "bytes", "FLOPs", "op", "value", "line");
  for (const passes::RecomputedValue& v : r.values)
    out += fmt::format("  {:>12}  {:>12}  {:<16} {:<32} {}\n", human_bytes(static_cast<double>(v.bytes)),
                       human_flops(v.flops), v.op, v.name, v.line);
  out += fmt::format("  values recomputed    {:>22}\n", r.values.size());
  out += fmt::format("  saved at the peak    {:>22}  (liveness peak {} -> {})\n",
                     with_commas(static_cast<double>(r.peak_before - r.peak_after)),
                     with_commas(static_cast<double>(r.peak_before)), with_commas(static_cast<double>(r.peak_after)));
  out += fmt::format("  arena                {:>22}  (was {}; budget {})\n", with_commas(static_cast<double>(r.arena_after)),
                     with_commas(static_cast<double>(r.arena_before)), with_commas(static_cast<double>(r.budget)));
  out += fmt::format("  FLOPs added          {:>22}  ({}, {:.2f}% of the step)\n", with_commas(r.flops_added),
                     human_flops(r.flops_added), r.step_flops > 0 ? 100 * r.flops_added / r.step_flops : 0.0);
  return out;
}

std::string memory_section(const ir::Graph& g, const analysis::MemoryReport& m) {
  std::string out = "\nmemory (each buffer once; views are free; updates are written in place)\n";
  for (analysis::MemoryCategory cat : analysis::kMemoryCategories) {
    int64_t bytes = m.category_bytes(cat);
    std::vector<std::string> dtypes;
    for (const auto& [dtype, b] : m.category_bytes_by_dtype(cat))
      if (b > 0) dtypes.push_back(fmt::format("{} {}", ir::dtype_name(dtype), human_bytes(static_cast<double>(b))));
    out += fmt::format("  {:<20} {:>22}  ({}{})\n", analysis::memory_category_name(cat), with_commas(static_cast<double>(bytes)),
                       human_bytes(static_cast<double>(bytes)), dtypes.size() > 1 ? "; " + fmt::format("{}", fmt::join(dtypes, ", ")) : "");
  }
  out += fmt::format("  peak                 {:>22}  ({}, {})\n", with_commas(static_cast<double>(m.peak.bytes)),
                     human_bytes(static_cast<double>(m.peak.bytes)), peak_where(g, m.peak));
  std::vector<std::string> parts;
  for (analysis::MemoryCategory cat : analysis::kMemoryCategories)
    if (m.peak.category_bytes(cat) > 0)
      parts.push_back(fmt::format("{} {}", analysis::memory_category_name(cat), human_bytes(static_cast<double>(m.peak.category_bytes(cat)))));
  out += fmt::format("    alive at the peak: {}\n", fmt::join(parts, ", "));
  int shown = 0;
  for (const analysis::MemoryBuffer& b : m.peak.live) {
    if (b.resident) continue;  // params, state and inputs are always there; list what the schedule makes
    if (++shown > 8) break;
    out += fmt::format("      {:>12}  {:<18} {:<32} line {}\n", human_bytes(static_cast<double>(b.bytes)),
                       analysis::memory_category_name(b.category), b.name, b.line);
  }
  out += plan_lines(g, m);
  static const ir::Phase kPhases[] = {ir::Phase::Forward, ir::Phase::Backward, ir::Phase::Optimizer};
  for (ir::Phase phase : kPhases) {
    const analysis::MemoryPeak& p = m.phase_peak(phase);
    if (!p.found) continue;
    out += fmt::format("  peak in {:<12} {:>22}  ({}, {})\n", ir::phase_name(phase), with_commas(static_cast<double>(p.bytes)),
                       human_bytes(static_cast<double>(p.bytes)), peak_where(g, p));
  }
  return out;
}

}  // namespace

std::string render_report_text(const ir::Graph& g, const analysis::StepCost& c, const analysis::MemoryReport& memory,
                               const ReportOptions& options) {
  std::string out;
  out += fmt::format("napkin report: {} ({})\n", g.name, options.model_path);
  out += fmt::format("precision {}, optimizer {}\n", ir::precision_name(g.config.precision.policy),
                     ir::optimizer_name(g.config.optimizer.kind));
  if (c.device)
    out += fmt::format("device {}: {} (device table v{})\n", c.device->name, c.device->description, analysis::kDeviceTableVersion);
  if (options.show_ops) out += ops_table(g, c);
  out += flops_section(c);
  const std::optional<analysis::StepTime> time = predicted_time(g, c);
  const analysis::MoeFigures moe = analysis::analyze_moe(g);
  out += time_section(g, c, time, moe);
  out += "\nparameters\n";
  out += fmt::format("  count                {:>22}\n", with_commas(c.params));
  if (moe.has_moe())
    out += fmt::format("  active per token     {:>22}  (less (E-k)/E of each expert parameter: the router and k experts' "
                       "slices count{}; mixture of experts below)\n",
                       with_commas(static_cast<double>(moe.active_params)),
                       moe.active_exact ? "" : "; rounded down: an expert parameter's numel·(E-k) is not a multiple of E");
  for (const auto& [dtype, bytes] : c.param_bytes)
    out += fmt::format("  memory, {:<13}{:>22}  ({})\n", ir::dtype_name(dtype), with_commas(bytes),
                       human_bytes(static_cast<double>(bytes)));
  out += memory_section(g, memory);
  if (const passes::Rematerialized* r = options.pipeline ? &options.pipeline->rematerialized : nullptr; r && r->values > 0) {
    const std::string stored =
        r->stored_by_epilogues > 0
            ? fmt::format(" ({} of them not recomputed after all: a gelu's input its GEMM epilogue stores in bf16, "
                          "docs/fusion.md)",
                          r->stored_by_epilogues)
            : "";
    out += fmt::format("  rematerialized       {:>22}  ({} less kept: {} saved values ({}) the backward recomputes from {} it keeps "
                       "instead{}, +{}; docs/memory-planning.md)\n",
                       with_commas(static_cast<double>(r->bytes_before - r->bytes_after)),
                       human_bytes(static_cast<double>(r->bytes_before - r->bytes_after)), r->values,
                       human_bytes(static_cast<double>(r->bytes_before)), human_bytes(static_cast<double>(r->bytes_after)),
                       stored, ir::human_flops(r->flops_added));
  }
  if (options.recompute && options.recompute->ran) out += recompute_section(*options.recompute);
  if (options.pipeline && options.pipeline->shard_schedule.ran) out += shard_section(options.pipeline->shard_schedule);
  if (options.pipeline) out += attention_section(g, options.pipeline->attention_sites);
  if (options.pipeline) out += classifier_section(g, options.pipeline->classifier_sites);
  out += moe_section_text(g, moe, options.dropped, micro_batches(g, options) * options.ranks);
  out += render_amp_audit_text(g, c, memory, options.fp32_step, options.show_ops);
  if (c.has_backward()) {
    const FusionSummary fusion = summarize_fusion(g);
    std::optional<CastSummary> casts;
    if (options.pipeline && options.policy_casts_step)
      casts = summarize_casts(fusion, options.pipeline->cast_placement, *options.policy_casts_step);
    out += fusion_section_text(g, fusion, casts ? &*casts : nullptr);
  }
  if (c.has_backward()) out += step_rule_section(g, c, moe);
  else out += fmt::format("\ntokens per step        {:>22}  ({})\n", with_commas(c.tokens), c.tokens_source);
  out += forward_rule_section(c);
  if (c.has_backward()) out += accumulation_section(g, c, options, time);
  if (std::optional<analysis::DistributedStep> d = distributed_step(g, c, memory, options, time))
    out += distributed_section_text(*d, c.tokens) + (options.memory_fit ? memory_fit_text(*options.memory_fit) : "");
  return out;
}

std::string render_report_json(const ir::Graph& g, const analysis::StepCost& c, const analysis::MemoryReport& memory,
                               const ReportOptions& options) {
  using nlohmann::json;
  const std::optional<analysis::StepTime> time = predicted_time(g, c);
  json j;
  j["model"] = g.name;
  j["file"] = options.model_path;
  j["device_table_version"] = analysis::kDeviceTableVersion;
  j["precision"] = std::string(ir::precision_name(g.config.precision.policy));
  j["optimizer"] = std::string(ir::optimizer_name(g.config.optimizer.kind));
  j["params"] = c.params;
  j["params_in_matmuls"] = c.params_in_matmuls;
  j["params_without_matmul"] = c.params_without_matmul;
  const analysis::MoeFigures moe = analysis::analyze_moe(g);
  if (moe.has_moe()) {
    j["params_active"] = moe.active_params;
    j["moe"] = moe_json(g, moe, options.dropped, micro_batches(g, options) * options.ranks);
  }
  j["tokens"] = c.tokens;
  j["tokens_source"] = c.tokens_source;
  Gap gap = gap_terms(c);
  StepGap step = step_gap_terms(c);
  const analysis::PhaseCost &f = c.phase(ir::Phase::Forward), &b = c.phase(ir::Phase::Backward), &o = c.phase(ir::Phase::Optimizer);
  j["flops"] = {{"forward", f.flops},
                {"backward", b.flops},
                {"optimizer", o.flops},
                {"total", c.total.flops},
                {"param_matmul", {{"forward", f.param_matmul_flops}, {"backward", b.param_matmul_flops}}},
                {"activation_matmul", {{"forward", f.activation_matmul_flops}, {"backward", b.activation_matmul_flops}}},
                {"other", {{"forward", f.other_flops}, {"backward", b.other_flops}}},
                {"recompute", c.total.recompute_flops},
                {"two_tokens_params", gap.two_tp},
                {"six_tokens_params", step.six_tp}};
  if (moe.has_moe()) j["flops"]["six_tokens_active_params"] = 6 * c.tokens * static_cast<double>(moe.active_params);
  PalmTerms palm = palm_terms(g, c);
  if (palm.found)
    j["flops"]["palm"] = {{"layers", palm.layers}, {"d", palm.d}, {"seq", palm.seq},
                          {"total", (6 * static_cast<double>(c.params_in_matmuls) + 12 * palm.layers * palm.d * palm.seq) * c.tokens}};
  j["bytes"] = {{"forward", f.bytes_read + f.bytes_written},
                {"backward", b.bytes_read + b.bytes_written},
                {"optimizer", o.bytes_read + o.bytes_written},
                {"total", c.total.bytes_read + c.total.bytes_written},
                {"read", c.total.bytes_read},
                {"written", c.total.bytes_written}};
  json by_dtype = json::object();
  int64_t param_bytes = 0;
  for (const auto& [dtype, bytes] : c.param_bytes) {
    by_dtype[std::string(ir::dtype_name(dtype))] = bytes;
    param_bytes += bytes;
  }
  auto cat = [&](analysis::MemoryCategory k) { return memory.category_bytes(k); };
  auto peak_json = [&](const analysis::MemoryPeak& p) {
    json by_category = json::object();
    for (analysis::MemoryCategory k : analysis::kMemoryCategories) by_category[std::string(analysis::memory_category_name(k))] = p.category_bytes(k);
    json live = json::array();
    for (const analysis::MemoryBuffer& b : p.live)
      if (!b.resident)
        live.push_back({{"name", b.name}, {"bytes", b.bytes}, {"category", std::string(analysis::memory_category_name(b.category))}, {"line", b.line}});
    return json{{"bytes", p.bytes},
                {"position", p.found ? json(p.position + 1) : json(nullptr)},
                {"phase", p.found ? json(std::string(ir::phase_name(p.phase))) : json(nullptr)},
                {"by_category", by_category},
                {"live", live}};
  };
  PlanNumbers plan = plan_numbers(g, memory);
  const passes::Rematerialized remat = options.pipeline ? options.pipeline->rematerialized : passes::Rematerialized{};
  j["memory"] = {{"params", param_bytes},
                 {"params_by_dtype", by_dtype},
                 {"grads", cat(analysis::MemoryCategory::Gradients)},
                 {"optimizer", cat(analysis::MemoryCategory::OptimizerState)},
                 {"inputs", cat(analysis::MemoryCategory::Inputs)},
                 {"activations", cat(analysis::MemoryCategory::SavedActivations)},
                 {"temporaries", cat(analysis::MemoryCategory::Temporaries)},
                 {"peak", memory.peak.bytes},
                 {"arena", plan.arena},
                 {"naive", plan.naive},
                 {"arena_over_peak_percent", percent_over(plan.arena, plan.peak)},
                 {"in_place", {{"buffers", plan.in_place_buffers},
                               {"bytes", plan.in_place_bytes},
                               {"arena_saved", plan.arena_without_reuse - plan.arena},
                               {"arena_without_reuse", plan.arena_without_reuse},
                               {"peak_without_reuse", plan.peak_without_reuse}}},
                 {"peak_detail", peak_json(memory.peak)},
                 {"rematerialized", options.pipeline ? json{{"values", remat.values},
                                                             {"bytes_before", remat.bytes_before},
                                                             {"bytes_after", remat.bytes_after},
                                                             {"flops_added", remat.flops_added},
                                                             {"stored_by_epilogues", remat.stored_by_epilogues}}
                                                       : json(nullptr)},
                 {"peak_forward", memory.phase_peak(ir::Phase::Forward).bytes},
                 {"peak_backward", memory.phase_peak(ir::Phase::Backward).bytes},
                 {"peak_optimizer", memory.phase_peak(ir::Phase::Optimizer).bytes}};
  if (options.pipeline) {
    json sites = json::array();
    for (const passes::AttentionSite& s : options.pipeline->attention_sites)
      sites.push_back({{"line", s.loc.line}, {"scope", s.scope}, {"fused", s.fused}, {"reason", s.reason}});
    j["attention"] = {{"fused_kernels", attention_kernels(g)}, {"sites", sites}};
  }
  if (options.pipeline) {
    json sites = json::array();
    for (const passes::ClassifierSite& s : options.pipeline->classifier_sites)
      sites.push_back({{"line", s.loc.line}, {"scope", s.scope}, {"fused", s.fused}, {"reason", s.reason}});
    double logits = 0;
    for (ir::NodeId id : g.schedule())
      if (g.node(id).op == ir::Op::LinearCrossEntropy) {
        const ir::ClassifierDims c = ir::classifier_dims(g, g.node(id));
        logits += c.rows * c.vocab;
      }
    j["classifier"] = {{"sites", sites}, {"logits_not_stored", logits}};
  }
  if (options.pipeline && options.pipeline->shard_schedule.ran) {
    const passes::ShardSchedule& s = options.pipeline->shard_schedule;
    json units = json::array();
    for (const passes::ShardUnit& u : s.units)
      units.push_back({{"scope", u.scope}, {"phase", ir::phase_name(u.phase)}, {"gathers", u.gathers}, {"bytes", u.bytes},
                       {"seconds", u.seconds}, {"ahead_seconds", u.ahead_seconds}, {"exposed_seconds", u.exposed_seconds}});
    j["zero3"] = {{"device", s.device}, {"link", s.link}, {"ranks", s.ranks}, {"prefetch", s.prefetch},
                  {"units", units}, {"reduces", s.reduces}, {"gather_seconds", s.gather_seconds},
                  {"reduce_seconds", s.reduce_seconds}, {"compute_seconds", s.compute_seconds},
                  {"exposed_seconds", s.exposed_seconds}};
  }
  if (options.recompute && options.recompute->ran) {
    const passes::RecomputeReport& r = *options.recompute;
    json values = json::array();
    for (const passes::RecomputedValue& v : r.values)
      values.push_back({{"name", v.name}, {"op", v.op}, {"line", v.line}, {"bytes", v.bytes}, {"flops", v.flops}});
    j["recompute"] = {{"budget", r.budget},
                      {"values", values},
                      {"peak_before", r.peak_before},
                      {"peak_after", r.peak_after},
                      {"saved_at_peak", r.peak_before - r.peak_after},
                      {"arena_before", r.arena_before},
                      {"arena_after", r.arena_after},
                      {"flops_added", r.flops_added},
                      {"flops_added_percent", r.step_flops > 0 ? 100 * r.flops_added / r.step_flops : 0.0}};
  }
  if (c.device) {
    j["device"] = {{"name", c.device->name}, {"description", c.device->description}};
    double peak = analysis::matmul_peak(*c.device, c.matmul_dtype);
    const analysis::StepTime& t = *time;
    json classes = json::object();
    for (int k = 0; k < analysis::kNumKernelClasses; ++k) classes[std::string(analysis::kernel_class_name(static_cast<analysis::KernelClass>(k)))] = t.class_seconds[k];
    j["time"] = {{"step_s", t.seconds},
                 {"kernels", t.kernels.size()},
                 {"launch_s", t.launch_seconds},
                 {"class_s", classes},
                 {"kernels_without_peak", t.kernels_without_peak},
                 {"roofline_ops_s", c.total.seconds},
                 {"roofline_kernels_s", t.roofline_seconds},
                 {"roofline_mfu", peak > 0 && t.roofline_seconds > 0 ? json(t.roofline_mfu) : json(nullptr)},
                 {"forward_s", f.seconds},
                 {"backward_s", b.seconds},
                 {"optimizer_s", o.seconds},
                 {"ops_without_peak", c.ops_without_peak},
                 {"mfu", peak > 0 && t.seconds > 0 ? json(t.mfu) : json(nullptr)},
                 {"peak_source", c.device->source_of(analysis::peak_figure_name(*c.device, c.matmul_dtype))},
                 {"matmul_dtype", std::string(ir::dtype_name(c.matmul_dtype))},
                 {"kernel_kinds", kernel_table_json(kernel_kinds(g, t))}};
  } else {
    j["device"] = nullptr;
  }
  json ops = json::array();
  for (const analysis::OpRow& row : c.rows) {
    const ir::Node& n = g.node(row.node);
    const ir::TensorType& t = g.value(n.out()).type;
    json op = {{"op", std::string(ir::op_name(n.op))},
               {"phase", std::string(ir::phase_name(row.phase))},
               {"category", row.category},
               {"line", n.loc.line},
               {"col", n.loc.col},
               {"scope", n.scope},
               {"shape", t.sizes()},
               {"dtype", std::string(ir::dtype_name(t.dtype))},
               {"flops", row.cost.flops},
               {"bytes_read", row.cost.bytes_read},
               {"bytes_written", row.cost.bytes_written},
               {"intensity", intensity(row.cost)},
               {"copy", row.copies}};
    if (c.device) {
      op["seconds"] = row.no_peak ? json(nullptr) : json(row.seconds);
      op["bound"] = bound_word(row);
    }
    ops.push_back(op);
  }
  if (options.show_ops) j["ops"] = ops;
  add_amp_audit_json(j, g, c, memory, options.fp32_step);
  if (c.has_backward()) {
    const FusionSummary fusion = summarize_fusion(g);
    std::optional<CastSummary> casts;
    if (options.pipeline && options.policy_casts_step)
      casts = summarize_casts(fusion, options.pipeline->cast_placement, *options.policy_casts_step);
    j["fusion"] = fusion_json(g, fusion, casts ? &*casts : nullptr);
  }
  if (c.has_backward()) {
    const Accumulation a = accumulation(g, c, options, time);
    j["accumulation"] = {{"micro_batches", a.micro_batches},
                         {"tokens", a.tokens},
                         {"flops", a.flops},
                         {"forward_backward_flops", a.forward_backward_flops},
                         {"optimizer_flops", a.optimizer_flops},
                         {"gradient_sum_bytes", a.micro_batches > 1 ? a.gradient_sum_bytes : 0.0},
                         {"predicted_step_s", a.predicted ? json(a.step_seconds) : json(nullptr)},
                         {"predicted_mfu", a.predicted ? json(a.mfu) : json(nullptr)}};
  }
  if (std::optional<analysis::DistributedStep> d = distributed_step(g, c, memory, options, time))
  {
    j["distributed"] = distributed_json(*d, c.tokens);
    if (options.memory_fit) j["distributed"]["memory_per_rank"] = memory_fit_json(*options.memory_fit);
  }
  // Paths come from the command line and may not be UTF-8: replace, never throw.
  return j.dump(2, ' ', false, json::error_handler_t::replace) + "\n";
}

}  // namespace napkin::report
