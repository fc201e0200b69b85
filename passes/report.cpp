#include "passes/report.h"

#include <fmt/format.h>

#include <cmath>
#include <nlohmann/json.hpp>

namespace napkin::passes {

std::string with_commas(double v) {
  // Formats the double itself: FLOP totals pass 2^63, where an int64 cast is undefined.
  std::string digits = fmt::format("{:.0f}", std::fabs(v)), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return (v < 0 && digits != "0" ? "-" : "") + out;
}

namespace {
std::string scaled(double v, const char* const* units, int count, double step, const char* fmt_spec) {
  int i = 0;
  double a = std::fabs(v);
  while (i + 1 < count && a >= step) {
    a /= step;
    v /= step;
    ++i;
  }
  return fmt::format(fmt::runtime(fmt_spec), v, units[i]);
}
}  // namespace

std::string human_flops(double flops) {
  static const char* const units[] = {"FLOP", "KFLOP", "MFLOP", "GFLOP", "TFLOP", "PFLOP", "EFLOP"};
  return scaled(flops, units, 7, 1000, "{:.3g} {}");
}

std::string human_bytes(double bytes) {
  static const char* const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  return scaled(bytes, units, 5, 1024, "{:.3g} {}");
}

std::string human_seconds(double s) {
  if (s == 0) return "0";
  if (s < 1e-6) return fmt::format("{:.3g} ns", s * 1e9);
  if (s < 1e-3) return fmt::format("{:.3g} us", s * 1e6);
  if (s < 1) return fmt::format("{:.3g} ms", s * 1e3);
  return fmt::format("{:.3g} s", s);
}

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

std::string op_label(const ir::Graph& g, const OpRow& row) {
  const ir::Node& n = g.node(row.node);
  std::string label(ir::op_name(n.op));
  if (row.copies) label += " (rearrange copy)";
  return label;
}

// "compute" or "memory" (the larger roofline term), "-" for free ops, "no-peak".
const char* bound_word(const OpRow& row) {
  if (row.no_peak) return "no-peak";
  if (row.seconds == 0) return "-";
  return row.compute_bound ? "compute" : "memory";
}

// The gap between counted forward FLOPs and 2·tokens·params, term by term.
struct Gap {
  double two_tp, no_matmul_params, param_matmul_excess, activation, other;
};
Gap gap_terms(const ForwardCost& c) {
  double t = c.tokens;
  return {2 * t * c.params, -2 * t * static_cast<double>(c.params - c.params_in_matmuls),
          c.param_matmul_flops - 2 * t * c.params_in_matmuls, c.activation_matmul_flops, c.other_flops};
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

std::string render_report_text(const ir::Graph& g, const ForwardCost& c, const ReportOptions& options) {
  std::string out;
  out += fmt::format("napkin report: {} ({})\n", g.name, options.model_path);
  out += fmt::format("precision {}, optimizer {}\n", ir::precision_name(g.config.precision.policy),
                     ir::optimizer_name(g.config.optimizer.kind));
  if (c.device)
    out += fmt::format("device {}: {} (device table v{})\n", c.device->name, c.device->description, kDeviceTableVersion);

  if (options.show_ops) {
    out += "\nforward ops (schedule order; FLOPs: 2 per multiply-add; views are free)\n";
    out += fmt::format("{:>4}  {:<26} {:>5}  {:<10} {:<22} {:>11} {:>11} {:>11} {:>8}", "#", "op", "line", "scope",
                       "output", "FLOPs", "read", "written", "FLOP/B");
    if (c.device) out += fmt::format(" {:>10}  {}", "roofline", "bound");
    out += "\n";
    int index = 0;
    for (const OpRow& row : c.rows) {
      const ir::Node& n = g.node(row.node);
      out += fmt::format("{:>4}  {:<26} {:>5}  {:<10} {:<22} {:>11} {:>11} {:>11} {:>8.3g}", ++index,
                         op_label(g, row), n.loc.line, n.scope.empty() ? "-" : n.scope,
                         shape_text(g.value(n.out()).type), human_flops(row.cost.flops),
                         human_bytes(row.cost.bytes_read), human_bytes(row.cost.bytes_written), intensity(row.cost));
      if (c.device) {
        if (row.no_peak)
          out += fmt::format(" {:>10}  no {} peak on {}", "n/a", ir::dtype_name(row.compute_dtype), c.device->name);
        else
          out += fmt::format(" {:>10}  {}", human_seconds(row.seconds), bound_word(row));
      }
      out += "\n";
    }
  }

  out += "\ntotals (forward)\n";
  out += fmt::format("  FLOPs                {:>22}  ({})\n", with_commas(c.flops), human_flops(c.flops));
  out += fmt::format("  bytes read           {:>22}  ({})\n", with_commas(c.bytes_read), human_bytes(c.bytes_read));
  out += fmt::format("  bytes written        {:>22}  ({})\n", with_commas(c.bytes_written), human_bytes(c.bytes_written));
  out += fmt::format("  ops                  {:>22}\n", c.rows.size());
  if (c.device) {
    out += fmt::format("  roofline time        {:>22}  (sum over ops of max(FLOPs/peak, bytes/bandwidth) on {})\n",
                       human_seconds(c.seconds), c.device->name);
    if (c.ops_without_peak > 0)
      out += fmt::format("  INCOMPLETE: {} {} in a dtype {} has no peak for; not counted in the time\n",
                         c.ops_without_peak, c.ops_without_peak == 1 ? "op computes" : "ops compute", c.device->name);
  }

  out += "\nparameters\n";
  out += fmt::format("  count                {:>22}\n", with_commas(c.params));
  for (const auto& [dtype, bytes] : c.param_bytes)
    out += fmt::format("  memory, {:<13}{:>22}  ({})\n", ir::dtype_name(dtype), with_commas(bytes), human_bytes(static_cast<double>(bytes)));

  Gap gap = gap_terms(c);
  out += "\nforward FLOPs vs 2·tokens·params\n";
  out += fmt::format("  tokens per step      {:>22}  ({})\n", with_commas(c.tokens), c.tokens_source);
  out += fmt::format("  2·tokens·params      {:>22}  ({})\n", with_commas(gap.two_tp), human_flops(gap.two_tp));
  out += fmt::format("  counted forward      {:>22}  ({}; {:.4f}x the rule)\n", with_commas(c.flops),
                     human_flops(c.flops), gap.two_tp > 0 ? c.flops / gap.two_tp : 0.0);
  out += "  the difference, term by term:\n";
  out += fmt::format("    {:>22}  params that do no matmul work ({} of them{})\n",
                     signed_commas(gap.no_matmul_params),
                     with_commas(c.params - c.params_in_matmuls), c.params_without_matmul.empty() ? "" : ": " + list_names(c.params_without_matmul, 6));
  out += fmt::format("    {:>22}  matmuls between activations (attention scores and mixing)\n",
                     signed_commas(gap.activation));
  out += fmt::format("    {:>22}  elementwise, normalization, softmax and loss ops\n",
                     signed_commas(gap.other));
  out += fmt::format("    {:>22}  weight matmuls beyond 2 FLOPs per weight per token\n",
                     signed_commas(gap.param_matmul_excess));
  return out;
}

std::string render_report_json(const ir::Graph& g, const ForwardCost& c, const ReportOptions& options) {
  using nlohmann::json;
  json j;
  j["model"] = g.name;
  j["file"] = options.model_path;
  j["device_table_version"] = kDeviceTableVersion;
  j["precision"] = std::string(ir::precision_name(g.config.precision.policy));
  j["optimizer"] = std::string(ir::optimizer_name(g.config.optimizer.kind));
  j["params"] = c.params;
  j["params_in_matmuls"] = c.params_in_matmuls;
  j["params_without_matmul"] = c.params_without_matmul;
  j["tokens"] = c.tokens;
  j["tokens_source"] = c.tokens_source;
  Gap gap = gap_terms(c);
  j["flops"] = {{"forward", c.flops},
                {"param_matmul", c.param_matmul_flops},
                {"activation_matmul", c.activation_matmul_flops},
                {"other", c.other_flops},
                {"two_tokens_params", gap.two_tp}};
  j["bytes"] = {{"forward", c.bytes_read + c.bytes_written}, {"read", c.bytes_read}, {"written", c.bytes_written}};
  json by_dtype = json::object();
  int64_t param_bytes = 0;
  for (const auto& [dtype, bytes] : c.param_bytes) {
    by_dtype[std::string(ir::dtype_name(dtype))] = bytes;
    param_bytes += bytes;
  }
  j["memory"] = {{"params", param_bytes}, {"params_by_dtype", by_dtype}};
  if (c.device) {
    j["device"] = {{"name", c.device->name}, {"description", c.device->description}};
    j["time"] = {{"forward_roofline_s", c.seconds}, {"ops_without_peak", c.ops_without_peak}};
  } else {
    j["device"] = nullptr;
  }
  json ops = json::array();
  for (const OpRow& row : c.rows) {
    const ir::Node& n = g.node(row.node);
    const ir::TensorType& t = g.value(n.out()).type;
    json op = {{"op", std::string(ir::op_name(n.op))},
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
  // Paths come from the command line and may not be UTF-8: replace, never throw.
  return j.dump(2, ' ', false, json::error_handler_t::replace) + "\n";
}

}  // namespace napkin::passes
