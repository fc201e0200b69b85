#include "report/fusion_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <numeric>

#include "analysis/memory.h"
#include "analysis/step_kernels.h"
#include "analysis/step_time.h"
#include "ir/fusion_group.h"
#include "ir/gemm_epilogue.h"
#include "ir/quantities.h"

namespace napkin::report {

namespace {

double node_bytes(const ir::Graph& g, const ir::Node& n) {
  ir::OpCost c = ir::op_info(n.op).cost(g, n);
  return c.bytes_read + c.bytes_written;
}


int op_count(const ir::Graph& g, const ir::FusionGroup& fg) {
  int n = 0;
  for (ir::NodeId id : fg.nodes) n += g.node(id).op != ir::Op::Constant;
  return n;
}

std::string shape_text(const std::vector<int64_t>& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

}  // namespace

std::vector<std::string> group_patterns(const ir::Graph& g, const ir::FusionGroups& groups) {
  // The buffers of params' new values, found once: per group, a scan of the
  // updates made N param updates N^2.
  std::vector<bool> param_update(g.num_values(), false);
  for (const ir::Graph::Update& u : g.updates)
    if (g.value(u.target).kind == ir::ValueKind::Param) param_update[g.value(u.value).storage] = true;
  const std::string update = fmt::format("{} update", ir::optimizer_name(g.config.optimizer.kind));
  std::vector<std::string> patterns;
  patterns.reserve(groups.groups.size());
  for (const ir::FusionGroup& fg : groups.groups) {
    if (fg.phase == ir::Phase::Optimizer) {
      if (std::any_of(fg.outputs.begin(), fg.outputs.end(), [&](ir::ValueId v) { return param_update[v]; })) {
        patterns.push_back(update);
        continue;
      }
      if (fg.shape.empty()) {
        patterns.push_back("optimizer scalars");
        continue;
      }
    }
    std::vector<std::string> ops;
    for (ir::NodeId id : fg.nodes)
      if (g.node(id).op != ir::Op::Constant) ops.emplace_back(ir::op_name(g.node(id).op));
    patterns.push_back(fmt::format("{}", fmt::join(ops, " > ")));
  }
  return patterns;
}

FusionSummary summarize_fusion(const ir::Graph& g) {
  FusionSummary s;
  const ir::FusionGroups groups = ir::fusion_groups(g);
  std::map<std::string, int> composite;
  for (int p = 0; p < static_cast<int>(g.schedule().size()); ++p) {
    const ir::Node& n = g.node(g.schedule()[p]);
    ir::OpClass cls = ir::op_info(n.op).op_class;
    int gid = groups.group_at[p];
    if (cls == ir::OpClass::View || (n.op == ir::Op::Constant && gid >= 0)) continue;
    int phase = static_cast<int>(n.phase);
    double bytes = node_bytes(g, n);
    ++s.kernels_before[phase];
    s.bytes_before += bytes;
    if (cls == ir::OpClass::Normalization || cls == ir::OpClass::Loss) ++composite[std::string(ir::op_name(n.op))];
    if (gid < 0) s.bytes_after += bytes;
  }
  for (const analysis::StepKernel& k : analysis::step_kernels(g, groups)) ++s.kernels_after[static_cast<int>(k.phase)];
  std::map<std::string, FusionPattern> patterns;
  const std::vector<std::string> pattern_of = group_patterns(g, groups);
  for (const ir::FusionGroup& fg : groups.groups) {
    s.bytes_after += analysis::group_bytes(g, fg);
    int ops = op_count(g, fg);
    s.fused_ops += ops;
    s.folded_constants += static_cast<int>(fg.nodes.size()) - ops;
    FusionPattern& pat = patterns[pattern_of[fg.id]];
    pat.name = pattern_of[fg.id];
    ++pat.groups;
    pat.ops += ops;
    const int batch = groups.batch_of[fg.id];
    if (batch < 0 || groups.batches[batch].groups.back() == fg.id) ++pat.kernels;
    s.largest.push_back(fg.id);
  }
  s.groups = static_cast<int>(groups.groups.size());
  for (const ir::FusionGroup& fg : groups.groups) {
    if (fg.contraction == ir::kNoNode) continue;
    if (fg.reduction != ir::kNoNode) {
      if (const auto bias_grad = ir::match_gemm_bias_grad(g, fg.contraction, fg.reduction)) {
        ++s.epilogues.bias_grads;
        s.epilogues.bias_grad_bytes += ir::distinct_bytes(g, bias_grad->b);
      }
      continue;
    }
    const ir::Node& c = g.node(fg.contraction);
    const auto form = ir::match_gemm_epilogue(g, c.id, c.out(), {fg.nodes.begin() + 1, fg.nodes.end()});
    if (!form) continue;
    ++s.epilogues.gemms;
    s.epilogues.residual += form->residual != ir::kNoValue;
    s.epilogues.bias += form->bias != ir::kNoValue;
    s.epilogues.narrowed += form->out != ir::DType::F32;
    s.epilogues.gelu += form->activation == ir::GemmActivation::Gelu;
    s.epilogues.gelu_grad += form->activation == ir::GemmActivation::GeluGrad;
    s.epilogues.sums_bytes += static_cast<double>(g.value(c.out()).type.bytes());
  }
  for (auto& [name, pat] : patterns) s.patterns.push_back(pat);
  std::stable_sort(s.patterns.begin(), s.patterns.end(),
                   [](const FusionPattern& a, const FusionPattern& b) { return a.groups > b.groups; });
  std::stable_sort(s.largest.begin(), s.largest.end(), [&](int a, int b) {
    return op_count(g, groups.groups[a]) > op_count(g, groups.groups[b]);
  });
  if (s.largest.size() > 3) s.largest.resize(3);
  for (auto& [name, count] : composite) s.composite.emplace_back(name, count);

  s.peak_after = analysis::analyze_memory(g).peak.bytes;
  ir::Graph unfused = g;
  for (ir::NodeId id : unfused.schedule()) unfused.node(id).group = -1;
  s.peak_before = analysis::analyze_memory(unfused).peak.bytes;
  return s;
}

CastSummary summarize_casts(const FusionSummary& placed, const passes::CastPlacement& rewrites,
                            const ir::Graph& policy_casts_step) {
  const FusionSummary policy = summarize_fusion(policy_casts_step);
  auto total = [](const std::array<int, ir::kNumPhases>& k) { return std::accumulate(k.begin(), k.end(), 0); };
  return {rewrites, total(policy.kernels_after), total(placed.kernels_after), policy.bytes_after, placed.bytes_after};
}

std::string fusion_section_text(const ir::Graph& g, const FusionSummary& s, const CastSummary* casts) {
  auto change = [](double before, double after) {
    return before > 0 ? fmt::format("{:+.1f}%", 100.0 * (after - before) / before) : std::string("n/a");
  };
  auto total = [](const std::array<int, ir::kNumPhases>& k) { return std::accumulate(k.begin(), k.end(), 0); };
  std::string out = "\nfusion (elementwise chains as one kernel each; docs/fusion.md)\n";
  out += fmt::format("  kernels            {:>10} {:>10} {:>10} {:>10}\n", "forward", "backward", "optimizer", "total");
  out += fmt::format("    unfused          {:>10} {:>10} {:>10} {:>10}\n", s.kernels_before[0], s.kernels_before[1],
                     s.kernels_before[2], total(s.kernels_before));
  out += fmt::format("    fused            {:>10} {:>10} {:>10} {:>10}\n", s.kernels_after[0], s.kernels_after[1],
                     s.kernels_after[2], total(s.kernels_after));
  out += fmt::format("  bytes moved        {} -> {} ({})\n", ir::human_bytes(s.bytes_before), ir::human_bytes(s.bytes_after),
                     change(s.bytes_before, s.bytes_after));
  out += fmt::format("  memory peak        {} -> {} ({})\n", ir::human_bytes(static_cast<double>(s.peak_before)),
                     ir::human_bytes(static_cast<double>(s.peak_after)),
                     change(static_cast<double>(s.peak_before), static_cast<double>(s.peak_after)));
  int group_kernels = 0;
  for (const FusionPattern& p : s.patterns) group_kernels += p.kernels;
  out += fmt::format("  groups             {}: {} ops in {} kernels, {} constants inlined\n", s.groups, s.fused_ops, group_kernels,
                     s.folded_constants);
  for (const FusionPattern& p : s.patterns) {
    bool update = p.name.size() > 7 && p.name.compare(p.name.size() - 7, 7, " update") == 0;
    out += fmt::format("    {} x {}{}: {} ops -> {} kernel{}{}\n", p.name, p.groups, update ? " params" : "", p.ops, p.kernels,
                       p.kernels > 1 ? "s" : "", p.kernels < p.groups ? " (batched: a table of tensors each)" : "");
  }
  if (!s.largest.empty()) {
    const ir::FusionGroups groups = ir::fusion_groups(g);
    out += "  largest\n";
    for (int gid : s.largest) {
      const ir::FusionGroup& fg = groups.groups[gid];
      out += fmt::format("    #{:<4} {:<9} {:>3} ops {:<16} {}\n", gid, ir::phase_name(fg.phase), op_count(g, fg),
                         shape_text(fg.shape), analysis::yaml_lines(g, fg.nodes));
    }
  }
  if (!s.composite.empty()) {
    std::vector<std::string> parts;
    for (const auto& [name, count] : s.composite) parts.push_back(fmt::format("{} x{}", name, count));
    out += fmt::format("  one kernel each already: {}\n", fmt::join(parts, ", "));
  }
  if (casts && casts->rewrites.total() > 0) {
    const passes::CastPlacement& r = casts->rewrites;
    out += fmt::format("  casts placed       {} cast before views, {} cast after concats, {} round trips removed, {} "
                       "reductions and {} norm gradients widen as they load, {} norms store the cast (sink_casts: same "
                       "bits); {} GEMMs store f32 (matmul_epilogues)\n",
                       r.views, r.concats, r.round_trips, r.reductions, r.norm_grads, r.norms, r.epilogues);
    out += fmt::format("    vs the policy's  {} -> {} kernels, bytes moved {} -> {} ({})\n", casts->kernels_policy,
                       casts->kernels_placed, ir::human_bytes(casts->bytes_policy), ir::human_bytes(casts->bytes_placed),
                       change(casts->bytes_policy, casts->bytes_placed));
  }
  if (s.epilogues.gemms > 0)
    out += fmt::format("  GEMM epilogues     {} GEMMs store D = cast(act(sums + residual + bias)) or a gelu's gradient: {} add a "
                       "residual, {} a bias, {} a gelu, {} a gelu's gradient, {} store bf16/f16; {} of f32 sums never "
                       "stored (fuse_gemm_epilogues)\n",
                       s.epilogues.gemms, s.epilogues.residual, s.epilogues.bias, s.epilogues.gelu, s.epilogues.gelu_grad,
                       s.epilogues.narrowed, ir::human_bytes(s.epilogues.sums_bytes));
  if (s.epilogues.bias_grads > 0)
    out += fmt::format("  bias gradients     {} weight gradients' GEMMs also sum their B over k into the bias gradient: {} "
                       "read once instead of twice (cuBLASLt's BGRADA; fuse_gemm_epilogues)\n",
                       s.epilogues.bias_grads, ir::human_bytes(s.epilogues.bias_grad_bytes));
  out += "  not fused: a second reduction of a group's values (one per group), a contraction's result when what reads it "
         "is not the epilogue form (a gelu whose f32 input is kept), a bias gradient summing another value than its "
         "weight gradient's GEMM reads (docs/fusion.md)\n";
  return out;
}

nlohmann::json fusion_json(const ir::Graph& g, const FusionSummary& s, const CastSummary* casts) {
  using nlohmann::json;
  auto phases = [](const std::array<int, ir::kNumPhases>& k) {
    return json{{"forward", k[0]}, {"backward", k[1]}, {"optimizer", k[2]}, {"total", std::accumulate(k.begin(), k.end(), 0)}};
  };
  json patterns = json::array();
  for (const FusionPattern& p : s.patterns) patterns.push_back({{"pattern", p.name}, {"groups", p.groups}, {"ops", p.ops}, {"kernels", p.kernels}});
  const ir::FusionGroups groups = ir::fusion_groups(g);
  json largest = json::array();
  for (int gid : s.largest) {
    const ir::FusionGroup& fg = groups.groups[gid];
    largest.push_back({{"group", gid}, {"phase", std::string(ir::phase_name(fg.phase))}, {"ops", op_count(g, fg)},
                       {"shape", fg.shape}, {"lines", analysis::yaml_lines(g, fg.nodes)}});
  }
  json composite = json::object();
  for (const auto& [name, count] : s.composite) composite[name] = count;
  json placed = nullptr;
  if (casts) {
    const passes::CastPlacement& r = casts->rewrites;
    placed = {{"cast_before_views", r.views},      {"cast_after_concat", r.concats},
              {"round_trips_removed", r.round_trips}, {"reductions_widening", r.reductions},
              {"norms_storing_cast", r.norms},       {"norm_grads_widening", r.norm_grads},
              {"gemms_storing_f32", r.epilogues},
              {"kernels_policy", casts->kernels_policy}, {"kernels_placed", casts->kernels_placed},
              {"bytes_policy", casts->bytes_policy}, {"bytes_placed", casts->bytes_placed}};
  }
  return {{"kernels_before", phases(s.kernels_before)},
          {"casts", placed},
          {"kernels_after", phases(s.kernels_after)},
          {"bytes_before", s.bytes_before},
          {"bytes_after", s.bytes_after},
          {"peak_before", s.peak_before},
          {"peak_after", s.peak_after},
          {"groups", s.groups},
          {"fused_ops", s.fused_ops},
          {"constants_inlined", s.folded_constants},
          {"patterns", patterns},
          {"largest", largest},
          {"one_kernel_composites", composite},
          {"gemm_epilogues",
           {{"gemms", s.epilogues.gemms},
            {"residual", s.epilogues.residual},
            {"bias", s.epilogues.bias},
            {"narrowed", s.epilogues.narrowed},
            {"gelu", s.epilogues.gelu},
            {"gelu_grad", s.epilogues.gelu_grad},
            {"sums_bytes_not_stored", s.epilogues.sums_bytes},
            {"bias_grads", s.epilogues.bias_grads},
            {"bias_grad_bytes_read_once", s.epilogues.bias_grad_bytes}}}};
}

}  // namespace napkin::report
