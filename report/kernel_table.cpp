#include "report/kernel_table.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <tuple>

#include "ir/fusion_group.h"
#include "ir/quantities.h"
#include "report/fusion_report.h"

namespace napkin::report {

std::vector<KernelKind> kernel_kinds(const ir::Graph& g, const analysis::StepTime& t) {
  const ir::FusionGroups groups = ir::fusion_groups(g);
  const std::vector<std::string> pattern_of = group_patterns(g, groups);
  std::map<std::tuple<std::string, std::string, std::string, std::string>, KernelKind> kinds;
  for (const analysis::KernelTime& k : t.kernels) {
    if (k.no_peak) continue;  // not in the step's time either
    std::string what = k.group >= 0 ? pattern_of[k.group] : std::string(ir::op_name(g.node(k.node).op));
    std::string phase(ir::phase_name(k.phase));
    std::string kind(analysis::kernel_class_name(k.kind));
    KernelKind& row = kinds[{phase, kind, what, k.lines}];
    row.phase = phase;
    row.kind = kind;
    row.what = what;
    row.lines = k.lines;
    ++row.count;
    row.flops += k.flops;
    row.bytes += k.bytes;
    row.seconds += k.seconds;
    row.roofline_seconds += k.roofline_seconds;
    row.compute_bound += k.compute_bound();
  }
  std::vector<KernelKind> out;
  for (auto& [key, row] : kinds) out.push_back(std::move(row));
  std::stable_sort(out.begin(), out.end(), [](const KernelKind& a, const KernelKind& b) { return a.seconds > b.seconds; });
  return out;
}

namespace {

// "h100.yaml:48" reads better in a table than the path the user gave.
std::string short_lines(const std::string& lines) {
  size_t slash = lines.rfind('/', lines.find(':'));
  return slash == std::string::npos ? lines : lines.substr(slash + 1);
}

std::string bound_text(const KernelKind& k) {
  if (k.compute_bound == k.count) return "compute";
  if (k.compute_bound == 0) return "memory";
  return fmt::format("{}/{} compute", k.compute_bound, k.count);
}

}  // namespace

std::string kernel_table_text(const std::vector<KernelKind>& kinds, double step_seconds, size_t top) {
  if (kinds.empty() || step_seconds <= 0) return "";
  std::string out = fmt::format(
      "\nheaviest kernels (after fusion; kernels alike across layers summed; time model, launch included)\n"
      "  {:>5}  {:<9} {:<13} {:>10} {:>6} {:>10} {:>9}  {:<8} {}\n",
      "count", "phase", "class", "time", "share", "bytes", "roofline", "bound", "what (YAML lines)");
  double shown = 0;
  for (size_t i = 0; i < kinds.size() && i < top; ++i) {
    const KernelKind& k = kinds[i];
    shown += k.seconds;
    std::string what = k.what.size() > 60 ? k.what.substr(0, 57) + "..." : k.what;
    out += fmt::format("  {:>5}  {:<9} {:<13} {:>10} {:>5.1f}% {:>10} {:>9}  {:<8} {} ({})\n", k.count, k.phase, k.kind,
                       ir::human_seconds(k.seconds), 100 * k.seconds / step_seconds, ir::human_bytes(k.bytes),
                       ir::human_seconds(k.roofline_seconds), bound_text(k), what, short_lines(k.lines));
  }
  if (kinds.size() > top)
    out += fmt::format("  {} other kinds of kernel: {} ({:.1f}%)\n", kinds.size() - top, ir::human_seconds(step_seconds - shown),
                       100 * (step_seconds - shown) / step_seconds);
  return out;
}

nlohmann::json kernel_table_json(const std::vector<KernelKind>& kinds) {
  nlohmann::json rows = nlohmann::json::array();
  for (const KernelKind& k : kinds)
    rows.push_back({{"phase", k.phase},
                    {"class", k.kind},
                    {"what", k.what},
                    {"lines", k.lines},
                    {"count", k.count},
                    {"flops", k.flops},
                    {"bytes", k.bytes},
                    {"seconds", k.seconds},
                    {"roofline_seconds", k.roofline_seconds},
                    {"compute_bound", k.compute_bound}});
  return rows;
}

}  // namespace napkin::report
