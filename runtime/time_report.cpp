#include "runtime/time_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>

namespace napkin::runtime {

Mfu mfu_of(double flops_per_second, double peak_flops) {
  Mfu m;
  if (!(peak_flops > 0) || !std::isfinite(flops_per_second)) return m;
  m.fraction = flops_per_second / peak_flops;
  m.exceeded = m.fraction > 1;
  m.known = !m.exceeded;
  return m;
}

std::string mfu_text(const Mfu& m) {
  if (m.exceeded) return "> peak";
  if (!m.known) return "  n/a";
  return fmt::format("{:4.1f}%", 100 * m.fraction);
}

namespace {

std::string ms(double seconds) {
  double v = seconds * 1e3;
  if (v >= 100) return fmt::format("{:.0f} ms", v);
  if (v >= 10) return fmt::format("{:.1f} ms", v);
  if (v >= 0.1) return fmt::format("{:.2f} ms", v);
  return fmt::format("{:.1f} us", v * 1e3);
}

std::string percent_or_na(const Mfu& m) { return m.known ? fmt::format("{:.1f}%", 100 * m.fraction) : "n/a"; }

std::string peak_origin(const Program& p) {
  std::string origin = p.peak_source.empty() ? "napkin's device table" : p.peak_source;
  if (!p.device_file.empty()) origin += fmt::format(" (device file {})", p.device_file);
  return origin;
}

}  // namespace

Program per_step_view(const Program& p, int64_t micro_batches) {
  Program v = p;
  if (micro_batches == 1) return v;
  const double k = static_cast<double>(micro_batches);
  v.flops_per_step = k * (p.flops_per_step - p.flops_optimizer) + p.flops_optimizer;
  v.tokens_per_step = micro_batches * p.tokens_per_step;
  if (p.predicted.known) {
    double optimizer = 0, launches = 0;
    for (size_t i = static_cast<size_t>(p.num_gradient_kernels); i < p.kernels.size(); ++i)
      optimizer += std::max(0.0, p.kernels[i].predicted_seconds);
    const double share = p.kernels.empty() ? 0 : static_cast<double>(p.kernels.size() - p.num_gradient_kernels) /
                                                     static_cast<double>(p.kernels.size());
    launches = p.predicted.launch_seconds;
    const double kernels = p.predicted.step_seconds - launches;
    v.predicted.step_seconds = k * (kernels - optimizer) + optimizer + launches * (k * (1 - share) + share);
    v.predicted.launch_seconds = launches * (k * (1 - share) + share);
    v.predicted.mfu = v.predicted.step_seconds > 0 && p.peak_flops > 0
                          ? v.flops_per_step / v.predicted.step_seconds / p.peak_flops
                          : 0;
  }
  return v;
}

std::string predicted_banner(const Program& p) {
  if (!p.predicted.known) return "";
  std::string line = fmt::format("  predicted  {}/step on {} (time model: docs/report.md", ms(p.predicted.step_seconds), p.device);
  if (p.predicted.mfu > 0) line += fmt::format("; MFU {:.1f}%", 100 * p.predicted.mfu);
  if (p.predicted.kernels_without_peak > 0)
    line += fmt::format("; {} kernels in a dtype {} has no peak for are left out", p.predicted.kernels_without_peak, p.device);
  line += ")\n";
  if (p.peak_flops > 0) line += fmt::format("  peak       {:.4g} GFLOP/s: {}\n", p.peak_flops / 1e9, peak_origin(p));
  return line;
}

std::string peak_exceeded_warning(const Program& p, double flops_per_second) {
  return fmt::format(
      "warning: this run reaches {:.1f} GFLOP/s, above the {} peak of {:.1f} GFLOP/s it was built with ({}): that peak is "
      "wrong for this machine, so no MFU is printed. Measure this machine with `napkin devices --measure` and rebuild "
      "(napkin train does) to get figures from it\n",
      flops_per_second / 1e9, p.device, p.peak_flops / 1e9, peak_origin(p));
}

double StepTimes::median() const {
  if (seconds_.empty()) return 0;
  std::vector<double> s = seconds_;
  size_t mid = s.size() / 2;
  std::nth_element(s.begin(), s.begin() + static_cast<std::ptrdiff_t>(mid), s.end());
  double upper = s[mid];
  if (s.size() % 2 == 1) return upper;
  double lower = *std::max_element(s.begin(), s.begin() + static_cast<std::ptrdiff_t>(mid));
  return (lower + upper) / 2;
}

std::string end_of_run_summary(const Program& p, const StepTimes& steps) {
  if (steps.count() == 0) return "";
  double measured = steps.median();
  Mfu m = mfu_of(p.flops_per_step / measured, p.peak_flops);
  std::string out = fmt::format("time: measured {}/step (median of {} step{})", ms(measured), steps.count(),
                                steps.count() == 1 ? "" : "s");
  if (!p.predicted.known) return out + fmt::format("; no prediction: napkin's device table has no '{}'\n", p.device);
  double predicted = p.predicted.step_seconds;
  out += fmt::format(", predicted {}/step: measured/predicted {:.2f}", ms(predicted), predicted > 0 ? measured / predicted : 0.0);
  if (p.peak_flops > 0)
    out += fmt::format("; MFU measured {}, predicted {:.1f}%", m.exceeded ? "n/a (above the peak)" : percent_or_na(m),
                       100 * p.predicted.mfu);
  return out + "\n";
}

MetricsRecord end_of_run_metrics(const Program& p, const StepTimes& steps) {
  double measured = steps.median();
  Mfu m = mfu_of(measured > 0 ? p.flops_per_step / measured : 0, p.peak_flops);
  return MetricsRecord()
      .boolean("summary", true)
      .integer("steps", static_cast<long long>(steps.count()))
      .fixed("measured_step_ms", measured * 1e3, 4)
      .general("predicted_step_ms", p.predicted.known ? p.predicted.step_seconds * 1e3 : kUnknown, 6)
      .general("measured_mfu", m.known ? m.fraction : kUnknown, 6)
      .general("predicted_mfu", p.predicted.known && p.peak_flops > 0 ? p.predicted.mfu : kUnknown, 6)
      .boolean("peak_exceeded", m.exceeded);
}

MetricsRecord profile_metrics(const std::vector<double>& kernel_seconds, int64_t steps) {
  const double per_step_ms = 1e3 / static_cast<double>(std::max<int64_t>(1, steps));
  std::vector<double> ms;
  for (double s : kernel_seconds) ms.push_back(s * per_step_ms);
  return MetricsRecord().boolean("profile", true).integer("steps", steps).fixed_list("kernel_ms", ms, 6);
}

std::string profile_report(const Program& p, const std::vector<double>& kernel_seconds, int64_t steps) {
  double per_step = 1.0 / static_cast<double>(std::max<int64_t>(1, steps));
  struct Row {
    std::string name;
    int kernels = 0;
    double measured = 0, predicted = 0, flops = 0, bytes = 0;
  };
  std::map<std::string, Row> classes;
  double total = 0, total_predicted = 0;
  for (size_t i = 0; i < p.kernels.size(); ++i) {
    const KernelSpec& k = p.kernels[i];
    Row& r = classes[k.kernel_class.empty() ? "unclassified" : k.kernel_class];
    r.name = k.kernel_class.empty() ? "unclassified" : k.kernel_class;
    ++r.kernels;
    r.measured += kernel_seconds[i] * per_step;
    r.flops += k.flops;
    r.bytes += k.bytes;
    if (k.predicted_seconds >= 0) r.predicted += k.predicted_seconds;
    total += kernel_seconds[i] * per_step;
    total_predicted += std::max(0.0, k.predicted_seconds);
  }
  std::vector<Row> rows;
  for (auto& [name, row] : classes) rows.push_back(row);
  std::sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) {
    return std::fabs(a.measured - a.predicted) > std::fabs(b.measured - b.predicted);
  });
  std::string out = fmt::format("profile: {} in kernels per step", ms(total));
  if (p.predicted.known) out += fmt::format(" (predicted {}; measured/predicted {:.2f})", ms(total_predicted),
                                            total_predicted > 0 ? total / total_predicted : 0.0);
  out += "; by kernel class, the largest gap first:\n";
  out += fmt::format("  {:<14} {:>7} {:>10} {:>10} {:>6} {:>10} {:>10} {:>10}\n", "class", "kernels", "measured", "predicted",
                     "ratio", "gap", "GFLOP", "MiB");
  for (const Row& r : rows)
    out += fmt::format("  {:<14} {:>7} {:>10} {:>10} {:>6} {:>10} {:>10.3f} {:>10.1f}\n", r.name, r.kernels, ms(r.measured),
                       p.predicted.known ? ms(r.predicted) : "-",
                       r.predicted > 0 ? fmt::format("{:.2f}", r.measured / r.predicted) : "-",
                       p.predicted.known ? (r.measured >= r.predicted ? "+" : "-") + ms(std::fabs(r.measured - r.predicted)) : "-",
                       r.flops / 1e9, r.bytes / (1 << 20));

  std::vector<size_t> order(p.kernels.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  auto gap = [&](size_t i) {
    double predicted = std::max(0.0, p.kernels[i].predicted_seconds);
    return std::fabs(kernel_seconds[i] * per_step - predicted);
  };
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return gap(a) > gap(b); });
  out += p.predicted.known ? "the kernels furthest from their prediction:\n" : "the slowest kernels:\n";
  out += fmt::format("  {:>10} {:>10} {:>6}  {:<14} {:<24} {:<9} {}\n", "measured", "predicted", "ratio", "class", "kernel",
                     "phase", "where");
  for (size_t r = 0; r < std::min<size_t>(order.size(), 15); ++r) {
    const KernelSpec& k = p.kernels[order[r]];
    double measured = kernel_seconds[order[r]] * per_step;
    out += fmt::format("  {:>10} {:>10} {:>6}  {:<14} {:<24} {:<9} {}\n", ms(measured),
                       k.predicted_seconds >= 0 ? ms(k.predicted_seconds) : "-",
                       k.predicted_seconds > 0 ? fmt::format("{:.2f}", measured / k.predicted_seconds) : "-",
                       k.kernel_class.empty() ? "-" : k.kernel_class, k.name, phase_name(k.phase), k.where);
  }
  return out;
}

}  // namespace napkin::runtime
