// The AMP audit: see report/amp_audit.h for the terms.
#include "report/amp_audit.h"

#include <fmt/format.h>

#include <map>
#include <nlohmann/json.hpp>
#include <tuple>

#include "ir/quantities.h"
#include "passes/fp8_scaling.h"
#include "passes/mixed_precision.h"

namespace napkin::report {

namespace {

using ir::DType;

std::string value_label(const ir::Graph& g, ir::ValueId v) {
  const std::string& name = g.value(v).name;
  return name.empty() ? fmt::format("%{}", v) : name;
}

DType compute_dtype(const ir::Graph& g, const ir::Node& n) {
  for (ir::ValueId v : n.inputs)
    if (ir::is_floating(g.value(v).type.dtype)) return g.value(v).type.dtype;
  return g.value(n.out()).type.dtype;
}

struct CastRow {
  ir::ValueId value;
  std::string source;  // the value cast
  DType from, to;
  int line;
  std::string scope, why;
};

// What the step's bytes come to, for the comparison with fp32.
struct Footprint {
  int64_t saved_activations = 0, peak = 0;
  double bytes_moved = 0;
};

Footprint footprint(const analysis::StepCost& c, const analysis::MemoryReport& m) {
  return {m.category_bytes(analysis::MemoryCategory::SavedActivations), m.peak.bytes, c.total.bytes_read + c.total.bytes_written};
}

struct Audit {
  std::vector<CastRow> casts;  // inserted forward casts, schedule order
  int backward_casts = 0, fp8_ops = 0;
  // (rule, op, compute dtype) -> forward nodes
  std::map<std::tuple<std::string, std::string, DType>, int> forward_rules;
  std::map<DType, int> backward_dtypes;
  // (phase, operand dtype, accumulator dtype) -> contractions
  std::map<std::tuple<ir::Phase, DType, DType>, int> contractions;
  struct OpLine {
    ir::NodeId node;
    std::string op, value, rule;
    DType dtype;
    int line;
  };
  std::vector<OpLine> ops;  // forward, schedule order (for show_ops)
};

Audit audit(const ir::Graph& g) {
  Audit a;
  const std::vector<bool> selected = passes::select_fp32_overrides(g, nullptr);
  for (ir::NodeId id : g.schedule()) {
    const ir::Node& n = g.node(id);
    DType dtype = compute_dtype(g, n);
    if (n.attrs.has(passes::kAmpCastAttr) && n.attrs.get_string(passes::kAmpCastAttr) == passes::kFp8CastReason) {
      ++a.fp8_ops;
      continue;
    }
    if (n.op == ir::Op::Cast) {
      DType to = g.value(n.out()).type.dtype;
      if (n.attrs.has(passes::kAmpCastAttr)) {
        // A policy cast in the backward is a forward one recomputed there
        // (passes/rematerialize, --memory-budget): listed once, as the forward's.
        if (n.phase == ir::Phase::Forward)
          a.casts.push_back({n.out(), value_label(g, n.in(0)), dtype, to, n.loc.line, n.scope, n.attrs.get_string(passes::kAmpCastAttr)});
      } else if (n.phase == ir::Phase::Backward) {
        ++a.backward_casts;
      }
    }
    if (ir::op_info(n.op).op_class == ir::OpClass::Contraction)
      ++a.contractions[{n.phase, dtype, ir::dtype_size(dtype) < 4 ? DType::F32 : dtype}];
    if (n.phase == ir::Phase::Forward && !n.attrs.has(passes::kAmpCastAttr)) {
      std::string rule(passes::amp_rule_name(passes::amp_rule(n.op, selected[id])));
      ++a.forward_rules[{rule, std::string(ir::op_name(n.op)), dtype}];
      a.ops.push_back({id, std::string(ir::op_name(n.op)), value_label(g, n.out()), rule, dtype, n.loc.line});
    } else if (n.phase == ir::Phase::Backward) {
      ++a.backward_dtypes[dtype];
    }
  }
  return a;
}

std::string change(double now, double before) {
  return before > 0 ? fmt::format("{:+.1f}%", 100 * (now - before) / before) : "-";
}

}  // namespace

std::string render_amp_audit_text(const ir::Graph& g, const analysis::StepCost& cost, const analysis::MemoryReport& memory,
                                  const ir::Graph* fp32_step, bool show_ops) {
  const ir::PrecisionPolicy policy = g.config.precision.policy;
  if (policy == ir::PrecisionPolicy::FP32) return "\nAMP audit: precision fp32, no casts inserted\n";
  const Audit a = audit(g);
  std::string out = fmt::format("\nAMP audit ({}: contractions in {} with f32 accumulation; docs/mixed-precision.md)\n",
                                ir::precision_name(policy), ir::dtype_name(ir::low_precision_dtype(policy)));
  std::map<std::string, int> by_reason;
  for (const CastRow& c : a.casts) ++by_reason[c.why];
  std::vector<std::string> reasons;
  for (const auto& [why, n] : by_reason) reasons.push_back(fmt::format("{} {}", n, why));
  out += fmt::format("  casts inserted       {:>22}  ({})\n", a.casts.size(), fmt::join(reasons, ", "));
  out += fmt::format("  backward casts       {:>22}  (autodiff: the gradient of a cast is the cast back)\n", a.backward_casts);
  if (a.fp8_ops > 0)
    out += fmt::format("  fp8 scaling ops      {:>22}  (amax, scale, quantize, dequantize of contraction operands)\n", a.fp8_ops);
  if (show_ops) {
    for (const CastRow& c : a.casts)
      out += fmt::format("    {:>6} {:<4}->{:<5} {:<28} line {:<4} {:<10} {}\n", fmt::format("%{}", c.value),
                         ir::dtype_name(c.from), ir::dtype_name(c.to), c.source, c.line, c.scope.empty() ? "-" : c.scope,
                         c.why);
  } else if (!a.casts.empty()) {
    out += "    (each cast: napkin report --ops; as a table: --html)\n";
  }
  out += "  forward ops by rule and compute dtype\n";
  for (const auto& [key, n] : a.forward_rules) {
    const auto& [rule, op, dtype] = key;
    out += fmt::format("    {:<16} {:<16} {:<6} {:>6}\n", rule, op, ir::dtype_name(dtype), n);
  }
  std::vector<std::string> backward;
  for (const auto& [dtype, n] : a.backward_dtypes) backward.push_back(fmt::format("{} {}", n, ir::dtype_name(dtype)));
  out += fmt::format("  backward ops by compute dtype: {}\n", backward.empty() ? "none" : fmt::format("{}", fmt::join(backward, ", ")));
  out += "  contractions (operands -> accumulator)\n";
  for (const auto& [key, n] : a.contractions) {
    const auto& [phase, operands, acc] = key;
    out += fmt::format("    {:<9} {:>4} -> {:<4} {:>6}\n", ir::phase_name(phase), ir::dtype_name(operands), ir::dtype_name(acc), n);
  }
  if (fp32_step) {
    Footprint now = footprint(cost, memory);
    Footprint base = footprint(analysis::analyze_step(*fp32_step, nullptr), analysis::analyze_memory(*fp32_step));
    out += fmt::format("  vs fp32                {:>20} {:>20} {:>9}\n", ir::precision_name(policy), "fp32", "change");
    auto row = [&](const char* label, double x, double y) {
      out += fmt::format("    {:<20} {:>20} {:>20} {:>9}\n", label, ir::with_commas(x), ir::with_commas(y), change(x, y));
    };
    row("saved activations", static_cast<double>(now.saved_activations), static_cast<double>(base.saved_activations));
    row("peak", static_cast<double>(now.peak), static_cast<double>(base.peak));
    row("bytes read+written", now.bytes_moved, base.bytes_moved);
  }
  if (show_ops) {
    out += "  forward ops, one by one\n";
    for (const Audit::OpLine& o : a.ops)
      out += fmt::format("    {:<16} {:<28} {:<6} line {:<4} {}\n", o.op, o.value, ir::dtype_name(o.dtype), o.line, o.rule);
  }
  return out;
}

void add_amp_audit_json(nlohmann::json& report, const ir::Graph& g, const analysis::StepCost& cost, const analysis::MemoryReport& memory,
                        const ir::Graph* fp32_step) {
  using nlohmann::json;
  const ir::PrecisionPolicy policy = g.config.precision.policy;
  json j = {{"policy", std::string(ir::precision_name(policy))},
            {"low_dtype", std::string(ir::dtype_name(ir::low_precision_dtype(policy)))}};
  const Audit a = audit(g);
  json casts = json::array();
  for (const CastRow& c : a.casts)
    casts.push_back({{"value", c.value}, {"source", c.source}, {"from", std::string(ir::dtype_name(c.from))},
                     {"to", std::string(ir::dtype_name(c.to))}, {"line", c.line}, {"scope", c.scope}, {"why", c.why}});
  j["casts"] = casts;
  j["backward_casts"] = a.backward_casts;
  j["fp8_ops"] = a.fp8_ops;
  json rules = json::array();
  for (const auto& [key, n] : a.forward_rules) {
    const auto& [rule, op, dtype] = key;
    rules.push_back({{"rule", rule}, {"op", op}, {"dtype", std::string(ir::dtype_name(dtype))}, {"count", n}});
  }
  j["forward_rules"] = rules;
  json backward = json::object();
  for (const auto& [dtype, n] : a.backward_dtypes) backward[std::string(ir::dtype_name(dtype))] = n;
  j["backward_dtypes"] = backward;
  json contractions = json::array();
  for (const auto& [key, n] : a.contractions) {
    const auto& [phase, operands, acc] = key;
    contractions.push_back({{"phase", std::string(ir::phase_name(phase))}, {"operands", std::string(ir::dtype_name(operands))},
                            {"accumulator", std::string(ir::dtype_name(acc))}, {"count", n}});
  }
  j["contractions"] = contractions;
  if (fp32_step && policy != ir::PrecisionPolicy::FP32) {
    Footprint now = footprint(cost, memory);
    Footprint base = footprint(analysis::analyze_step(*fp32_step, nullptr), analysis::analyze_memory(*fp32_step));
    auto both = [](double x, double y) { return json{{"policy", x}, {"fp32", y}}; };
    j["vs_fp32"] = {{"saved_activations", both(static_cast<double>(now.saved_activations), static_cast<double>(base.saved_activations))},
                    {"peak", both(static_cast<double>(now.peak), static_cast<double>(base.peak))},
                    {"bytes_moved", both(now.bytes_moved, base.bytes_moved)}};
  }
  report["amp_audit"] = j;
}

}  // namespace napkin::report
