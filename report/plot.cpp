#include "report/plot.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <sstream>

#include "report/svg_chart.h"

namespace napkin::report {

namespace {

constexpr int kWidth = 720, kHeight = 280;

// The charts, each a standalone <svg>.
std::vector<std::string> charts(const std::vector<MetricsRun>& runs) {
  std::vector<Series> loss, speed, mfu;
  for (size_t i = 0; i < runs.size(); ++i) {
    const MetricsRun& r = runs[i];
    const std::string color = palette(i);
    if (!r.loss.empty()) loss.push_back({r.name + " train", r.step, r.loss, color, false});
    if (!r.eval_loss.empty()) loss.push_back({r.name + " eval", r.eval_step, r.eval_loss, color, true});
    if (!r.tokens_per_s.empty()) speed.push_back({r.name, r.step, r.tokens_per_s, color, false});
    if (!r.mfu.empty()) {
      std::vector<double> percent;
      for (double m : r.mfu) percent.push_back(100 * m);
      mfu.push_back({r.name, r.step, percent, color, false});
    }
  }
  std::vector<std::string> out;
  if (!loss.empty()) out.push_back(line_chart({"Loss (train solid, eval dashed)", "step", "loss", false, false, kWidth, kHeight}, loss));
  if (!speed.empty()) out.push_back(line_chart({"Tokens per second", "step", "tokens/s", false, false, kWidth, kHeight}, speed));
  if (!mfu.empty()) out.push_back(line_chart({"MFU", "step", "% of the device's peak", false, false, kWidth, kHeight}, mfu));
  return out;
}

}  // namespace

std::optional<std::vector<MetricsRun>> parse_metrics(const std::string& text, const std::string& path,
                                                     std::string& error) {
  // One part per run in the file; `id` is "" for records before any run
  // record (a file written before trainers wrote them).
  struct Part {
    MetricsRun run;
    std::string id;
    double start_step = 0;
  };
  std::vector<Part> parts(1);
  double last_step = -1;  // the current part's
  int line_number = 0;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    ++line_number;
    if (line.empty()) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      error = fmt::format("{}:{}: not a JSON line ({})", path, line_number, e.what());
      return std::nullopt;
    }
    if (!j.is_object()) {
      error = fmt::format("{}:{}: not a metrics record (a JSON object)", path, line_number);
      return std::nullopt;
    }
    // A number, or NaN for a field the record does not have (or has as null).
    auto number = [&](const char* key) {
      return j.contains(key) && j[key].is_number() ? j[key].get<double>() : std::nan("");
    };
    if (j.contains("run") && j["run"].is_string()) {
      const std::string id = j["run"].get<std::string>();
      const double start = std::isnan(number("start_step")) ? 0 : number("start_step");
      const MetricsRun& current = parts.back().run;
      const bool empty = current.step.empty() && current.eval_step.empty();
      // A resumed run carries on the line of the run it resumed.
      if (!empty && id == parts.back().id && start >= last_step) continue;
      if (!empty) parts.emplace_back(), last_step = -1;
      parts.back().id = id;
      parts.back().start_step = start;
      continue;
    }
    const double step = number("step");
    if (std::isnan(step)) continue;  // the run's other records (peak memory, ...)
    last_step = std::max(last_step, step);
    MetricsRun& run = parts.back().run;
    if (double loss = number("loss"); !std::isnan(loss)) {
      run.step.push_back(step);
      run.loss.push_back(loss);
      run.tokens_per_s.push_back(number("tokens_per_s"));
      run.mfu.push_back(number("mfu"));
    }
    if (double eval = number("eval_loss"); !std::isnan(eval)) {
      run.eval_step.push_back(step);
      run.eval_loss.push_back(eval);
    }
  }
  std::erase_if(parts, [](const Part& p) { return p.run.step.empty() && p.run.eval_step.empty(); });
  if (parts.empty()) {
    error = fmt::format("{}: no step records (a trainer's --metrics file has a line per logged step)", path);
    return std::nullopt;
  }
  // A quantity the run never logged (an MFU without a device peak) is left out.
  auto all_nan = [](const std::vector<double>& v) {
    for (double x : v)
      if (!std::isnan(x)) return false;
    return true;
  };
  std::vector<MetricsRun> runs;
  for (size_t i = 0; i < parts.size(); ++i) {
    MetricsRun& run = parts[i].run;
    run.name = path;
    if (parts.size() > 1 && !parts[i].id.empty()) {
      run.name += ", run " + parts[i].id;
      for (size_t k = 0; k < i; ++k)
        if (parts[k].id == parts[i].id) {
          run.name += fmt::format(", from step {}", parts[i].start_step);
          break;
        }
    }
    if (all_nan(run.tokens_per_s)) run.tokens_per_s.clear();
    if (all_nan(run.mfu)) run.mfu.clear();
    runs.push_back(std::move(run));
  }
  return runs;
}

std::string plot_svg(const std::vector<MetricsRun>& runs) {
  const std::vector<std::string> parts = charts(runs);
  std::string out = fmt::format("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\">\n",
                                kWidth, kHeight * std::max<size_t>(1, parts.size()));
  for (size_t i = 0; i < parts.size(); ++i) {
    // Each chart nested at its offset (a nested <svg> is placed by x and y).
    std::string chart = parts[i];
    chart.insert(4, fmt::format(" x=\"0\" y=\"{}\"", i * kHeight));
    out += chart;
  }
  return out + "</svg>\n";
}

std::string plot_html(const std::vector<MetricsRun>& runs) {
  std::string names;
  for (const MetricsRun& r : runs) names += (names.empty() ? "" : ", ") + r.name;
  std::string out = fmt::format("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>napkin plot: {0}</title>"
                                "<style>body {{ font-family: sans-serif; margin: 16px; }}</style></head>\n<body>\n"
                                "<h1>napkin plot</h1>\n<p>{0}</p>\n",
                                escape_xml(names));
  for (const std::string& chart : charts(runs)) out += "<div>" + chart + "</div>\n";
  return out + "</body></html>\n";
}

}  // namespace napkin::report
