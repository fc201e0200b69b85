#include "report/html_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "analysis/step_time.h"
#include "ir/internal_check.h"
#include "ir/quantities.h"
#include "report/svg_chart.h"

namespace napkin::report {

namespace {

using nlohmann::json;
using Rows = nlohmann::ordered_json;  // the tables this page builds: columns in the order written

// Columns of the memory timeline at most: a wider schedule is drawn by the
// largest value of each bucket of positions, so the peak stays on the chart
// (gpt2-124m's ~5,000 positions would make a page of several MiB).
constexpr size_t kTimelineColumns = 1200;

const char* category_color(analysis::MemoryCategory c) {
  switch (c) {
    case analysis::MemoryCategory::Parameters: return "#4e79a7";
    case analysis::MemoryCategory::Gradients: return "#e15759";
    case analysis::MemoryCategory::OptimizerState: return "#76b7b2";
    case analysis::MemoryCategory::Inputs: return "#bab0ac";
    case analysis::MemoryCategory::SavedActivations: return "#f28e2b";
    case analysis::MemoryCategory::Temporaries: return "#edc948";
  }
  return "#999";
}

std::string num(double v) { return ir::with_commas(v); }

// JSON text as a <script> element's content: every '<', '>' and '&' (which
// JSON has only inside strings) as its \u escape, so that no string in it
// ends the script ("</script>") or opens a comment ("<!--<script>", which
// makes the parser swallow the rest of the page), and U+2028 and U+2029 too
// (line terminators to a JavaScript parser that reads the text as code). The
// text parses to the same JSON.
std::string script_safe_json(const std::string& json) {
  std::string out;
  out.reserve(json.size());
  for (size_t i = 0; i < json.size(); ++i) {
    const char c = json[i];
    if (c == '<') out += "\\u003c";
    else if (c == '>') out += "\\u003e";
    else if (c == '&') out += "\\u0026";
    else if (json.compare(i, 3, "\xE2\x80\xA8") == 0) out += "\\u2028", i += 2;
    else if (json.compare(i, 3, "\xE2\x80\xA9") == 0) out += "\\u2029", i += 2;
    else out += c;
  }
  return out;
}

// A table of a JSON array of objects: one column per key of the first.
template <typename Json>
std::string json_table(const Json& rows, size_t limit = 200) {
  if (!rows.is_array() || rows.empty() || !rows[0].is_object()) return "<p>none</p>\n";
  std::string out = "<table><tr>";
  std::vector<std::string> keys;
  for (const auto& [k, v] : rows[0].items()) keys.push_back(k), out += "<th>" + escape_xml(k) + "</th>";
  out += "</tr>\n";
  for (size_t i = 0; i < rows.size() && i < limit; ++i) {
    out += "<tr>";
    for (const std::string& k : keys) {
      const Json& v = rows[i].contains(k) ? rows[i][k] : Json();
      out += "<td>" + escape_xml(v.is_string() ? v.template get<std::string>() : v.dump()) + "</td>";
    }
    out += "</tr>\n";
  }
  if (rows.size() > limit) out += fmt::format("<tr><td colspan=\"{}\">... {} more</td></tr>\n", keys.size(), rows.size() - limit);
  return out + "</table>\n";
}

std::string summary(const json& r, const analysis::MemoryReport& memory, const analysis::Device& device) {
  const json& f = r.at("flops");
  const json& t = r.at("time");
  const double params = r.at("params").get<double>(), tokens = r.at("tokens").get<double>();
  std::string out = "<table class=\"summary\">\n";
  auto row = [&](const std::string& k, const std::string& v, const std::string& id = "") {
    out += fmt::format("<tr><th>{}</th><td{}>{}</td></tr>\n", k, id.empty() ? "" : fmt::format(" id=\"{}\"", id), v);
  };
  row("parameters", fmt::format("{} ({} as stored)", num(params), ir::human_bytes(memory.category_bytes(
                                                                       analysis::MemoryCategory::Parameters))),
      "params");
  row("precision, optimizer", escape_xml(r.at("precision").get<std::string>() + ", " + r.value("optimizer", std::string())));
  row("tokens per step", num(tokens));
  row("FLOPs per step",
      fmt::format("{} = forward {} + backward {} + optimizer {}", ir::human_flops(f.at("total").get<double>()),
                  ir::human_flops(f.at("forward").get<double>()), ir::human_flops(f.at("backward").get<double>()),
                  ir::human_flops(f.at("optimizer").get<double>())),
      "flops");
  row("napkin math", fmt::format("6·N·D = 6 × {} params × {} tokens = {}: the step is {:.3f}× that (docs/report.md)",
                                 num(params), num(tokens), ir::human_flops(f.at("six_tokens_params").get<double>()),
                                 f.at("total").get<double>() / f.at("six_tokens_params").get<double>()));
  row("predicted step", fmt::format("{} on {}, MFU {:.1f}% (time model: docs/report.md)",
                                    ir::human_seconds(t.at("step_s").get<double>()), escape_xml(device.name),
                                    100 * t.at("mfu").get<double>()),
      "step");
  row("peak memory", fmt::format("{} by liveness; arena {} (planned); {:.1f} bytes per parameter at the peak",
                                 ir::human_bytes(static_cast<double>(memory.peak.bytes)),
                                 ir::human_bytes(r.at("memory").at("arena").get<double>()),
                                 static_cast<double>(memory.peak.bytes) / std::max(1.0, params)),
      "peak");
  return out + "</table>\n";
}

// Live bytes per position and category (resident buffers everywhere), by
// difference arrays over the buffers' ranges.
std::vector<std::vector<double>> live_by_category(const analysis::MemoryReport& m, size_t n) {
  std::vector<std::vector<double>> delta(analysis::kNumMemoryCategories, std::vector<double>(n + 1, 0.0));
  for (const analysis::MemoryBuffer& b : m.buffers) {
    auto& d = delta[static_cast<size_t>(b.category)];
    d[static_cast<size_t>(b.first)] += static_cast<double>(b.bytes);
    d[static_cast<size_t>(b.last) + 1] -= static_cast<double>(b.bytes);
  }
  for (auto& d : delta)
    for (size_t i = 1; i <= n; ++i) d[i] += d[i - 1];
  for (size_t i = 0; i < n; ++i) {
    double total = 0;
    for (const auto& d : delta) total += d[i];
    NAPKIN_INTERNAL_CHECK(total == static_cast<double>(m.live_bytes[i]),
                          "html report: position {} has {} bytes by category, {} live", i, total, m.live_bytes[i]);
  }
  return delta;
}

std::string timeline(const ir::Graph& g, const analysis::MemoryReport& m) {
  const std::vector<ir::NodeId>& schedule = g.schedule();
  const size_t n = schedule.size();
  if (n == 0) return "<p>no nodes</p>\n";
  const std::vector<std::vector<double>> live = live_by_category(m, n);
  const size_t bucket = (n + kTimelineColumns - 1) / kTimelineColumns;
  // The axis in MiB or GiB (the page's numbers stay exact in data-peak and the tables).
  const bool gib = m.peak.bytes >= (int64_t{2} << 30);
  const double unit = gib ? 1024.0 * 1024 * 1024 : 1024.0 * 1024;
  std::vector<Layer> layers;
  for (analysis::MemoryCategory c : analysis::kMemoryCategories)
    layers.push_back({std::string(analysis::memory_category_name(c)), category_color(c), {}});
  std::vector<std::string> hover;
  for (size_t start = 0; start < n; start += bucket) {
    // The bucket's position with the most live bytes stands for it.
    size_t best = start;
    for (size_t p = start; p < std::min(n, start + bucket); ++p)
      if (m.live_bytes[p] > m.live_bytes[best]) best = p;
    std::string text = fmt::format("position {}: {} live", best, ir::human_bytes(static_cast<double>(m.live_bytes[best])));
    const ir::Node& node = g.node(schedule[best]);
    text += fmt::format(" at {} ({}, line {})", ir::op_name(node.op), ir::phase_name(node.phase), node.loc.line);
    for (size_t c = 0; c < layers.size(); ++c) {
      layers[c].values.push_back(live[c][best] / unit);
      if (live[c][best] > 0) text += fmt::format("\n  {} {}", layers[c].name, ir::human_bytes(live[c][best]));
    }
    // The largest buffers made by the step live there, with their YAML lines
    // (parameters, state and inputs are live everywhere: the peak table has them).
    std::vector<const analysis::MemoryBuffer*> here;
    for (const analysis::MemoryBuffer& b : m.buffers)
      if (!b.resident && b.first <= static_cast<int>(best) && static_cast<int>(best) <= b.last) here.push_back(&b);
    const size_t shown = std::min<size_t>(here.size(), 3);
    std::partial_sort(here.begin(), here.begin() + static_cast<std::ptrdiff_t>(shown), here.end(),
                      [](auto* a, auto* b) { return a->bytes > b->bytes || (a->bytes == b->bytes && a->value < b->value); });
    for (size_t i = 0; i < shown; ++i)
      text += fmt::format("\n  {} {} ({}, line {})", here[i]->name, ir::human_bytes(static_cast<double>(here[i]->bytes)),
                          analysis::memory_category_name(here[i]->category), here[i]->line);
    hover.push_back(text);
  }
  std::vector<Mark> marks;
  for (size_t p = 1; p < n; ++p)
    if (g.node(schedule[p]).phase != g.node(schedule[p - 1]).phase)
      marks.push_back({static_cast<double>(p / bucket), std::string(ir::phase_name(g.node(schedule[p]).phase)), false});
  const int peak = m.peak.position;
  if (peak >= 0)
    marks.push_back({static_cast<double>(static_cast<size_t>(peak) / bucket),
                     fmt::format("peak {}", ir::human_bytes(static_cast<double>(m.peak.bytes))), true});
  Axes axes{"Memory over the schedule (live bytes by category)",
            bucket > 1 ? fmt::format("schedule position / {} (each column the largest of its {})", bucket, bucket)
                       : std::string("schedule position"),
            gib ? "GiB" : "MiB", false, false, 900, 320};
  std::string out = fmt::format("<div class=\"timeline\" data-peak=\"{}\" data-peak-position=\"{}\" data-positions=\"{}\">\n",
                                m.peak.bytes, peak, n);
  out += stacked_area_chart(axes, layers, marks, hover);
  out += "</div>\n";
  // What is live at the peak.
  Rows live_rows = Rows::array();
  for (size_t i = 0; i < m.peak.live.size() && i < 12; ++i) {
    const analysis::MemoryBuffer& b = m.peak.live[i];
    live_rows.push_back({{"buffer", b.name},
                         {"bytes", ir::with_commas(static_cast<double>(b.bytes))},
                         {"category", std::string(analysis::memory_category_name(b.category))},
                         {"dtype", std::string(ir::dtype_name(b.dtype))},
                         {"line", b.line}});
  }
  out += fmt::format("<details open><summary>Live at the peak (position {}, {} buffers; the largest)</summary>\n", peak,
                     m.peak.live.size());
  return out + json_table(live_rows) + "</details>\n";
}

std::string roofline(const ir::Graph& g, const analysis::StepCost& cost, const analysis::Device& device) {
  const analysis::StepTime time = analysis::predict_step_time(g, cost, device);
  std::vector<RooflinePoint> points;
  for (const analysis::KernelTime& k : time.kernels) {
    if (k.no_peak) continue;
    points.push_back({k.flops, k.bytes, k.seconds, std::string(analysis::kernel_class_name(k.kind)),
                      fmt::format("{} {} ({}): {} FLOPs, {} moved, {:.2f} FLOP/byte, {} predicted",
                                  analysis::kernel_class_name(k.kind), k.lines, ir::phase_name(k.phase),
                                  ir::human_flops(k.flops), ir::human_bytes(k.bytes),
                                  k.bytes > 0 ? k.flops / k.bytes : 0.0, ir::human_seconds(k.seconds))});
  }
  std::vector<Roof> roofs;
  for (ir::DType t : {cost.matmul_dtype, ir::DType::F32}) {
    const double peak = analysis::matmul_peak(device, t);
    if (peak > 0 && (roofs.empty() || roofs.back().peak_flops != peak))
      roofs.push_back({fmt::format("{} {}", device.name, ir::dtype_name(t)), peak, device.bandwidth_bytes_per_s});
  }
  Axes axes{fmt::format("Roofline on {} (each kernel after fusion)", device.name), "FLOPs per byte",
            "predicted FLOP/s", true, true, 900, 420};
  std::string out = "<div class=\"roofline\">\n" + roofline_chart(axes, points, roofs) + "</div>\n";
  // The kernels with the most predicted time.
  std::vector<const analysis::KernelTime*> order;
  for (const analysis::KernelTime& k : time.kernels) order.push_back(&k);
  std::stable_sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->seconds > b->seconds; });
  Rows rows = Rows::array();
  for (size_t i = 0; i < order.size() && i < 20; ++i) {
    const analysis::KernelTime& k = *order[i];
    rows.push_back({{"class", std::string(analysis::kernel_class_name(k.kind))},
                    {"phase", std::string(ir::phase_name(k.phase))},
                    {"lines", k.lines},
                    {"predicted", ir::human_seconds(k.seconds)},
                    {"share", fmt::format("{:.1f}%", time.seconds > 0 ? 100 * k.seconds / time.seconds : 0.0)},
                    {"FLOPs", ir::human_flops(k.flops)},
                    {"bytes", ir::human_bytes(k.bytes)},
                    {"FLOP/byte", fmt::format("{:.2f}", k.bytes > 0 ? k.flops / k.bytes : 0.0)}});
  }
  out += fmt::format("<details open><summary>The {} kernels with the most predicted time (of {})</summary>\n",
                     rows.size(), time.kernels.size());
  return out + json_table(rows) + "</details>\n";
}

std::string model_column(const HtmlReportInput& in, const analysis::Device& device) {
  const json r = json::parse(in.json);
  std::string out = fmt::format("<section class=\"model\" data-model=\"{}\">\n<h2>{}</h2>\n<p class=\"label\">{}</p>\n",
                                escape_xml(r.at("model").get<std::string>()), escape_xml(r.at("model").get<std::string>()),
                                escape_xml(in.label));
  out += summary(r, *in.memory, device);
  out += "<h3>Memory</h3>\n" + timeline(*in.graph, *in.memory);
  out += "<h3>Time</h3>\n" + roofline(*in.graph, *in.cost, device);
  out += "<h3>Fusion and precision</h3>\n";
  const json& fusion = r.at("fusion");
  out += fmt::format("<details><summary>Fusion: {} kernels before, {} after; patterns</summary>\n",
                     fusion.at("kernels_before").at("total").dump(), fusion.at("kernels_after").at("total").dump());
  out += json_table(fusion.at("patterns")) + "</details>\n";
  out += "<details><summary>Fusion: the largest groups</summary>\n" + json_table(fusion.at("largest")) + "</details>\n";
  const json& amp = r.at("amp_audit");
  out += fmt::format("<details><summary>AMP audit ({}): each op's dtype rule</summary>\n",
                     escape_xml(amp.at("policy").get<std::string>()));
  out += json_table(amp.at("forward_rules")) + "</details>\n";
  out += fmt::format("<details><summary>AMP audit: every cast ({})</summary>\n", amp.at("casts").size());
  out += json_table(amp.at("casts"), 400) + "</details>\n";
  out += fmt::format("<script type=\"application/json\" class=\"napkin-report\">{}</script>\n", script_safe_json(in.json));
  return out + "</section>\n";
}

}  // namespace

std::string render_report_html(const std::vector<HtmlReportInput>& models, const analysis::Device& device) {
  NAPKIN_INTERNAL_CHECK(!models.empty(), "render_report_html without a model");
  std::string title;
  for (const HtmlReportInput& m : models) title += (title.empty() ? "" : " vs ") + m.graph->name;
  std::string out = fmt::format(R"(<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>napkin report: {}</title>
<style>
body {{ font-family: sans-serif; margin: 16px; color: #222; }}
.models {{ display: flex; gap: 24px; align-items: flex-start; }}
.model {{ flex: 1; min-width: 0; }}
table {{ border-collapse: collapse; font-size: 12px; margin: 6px 0; }}
th, td {{ border: 1px solid #ddd; padding: 2px 6px; text-align: left; vertical-align: top; }}
table.summary th {{ background: #f4f4f4; white-space: nowrap; }}
summary {{ cursor: pointer; font-weight: bold; margin: 6px 0; }}
svg.chart {{ max-width: 100%; height: auto; }}
.label {{ color: #666; font-size: 12px; }}
</style></head>
<body>
<h1>napkin report: {}</h1>
<p class="label">Every figure is napkin's static count or prediction for one training step, before anything runs; the
conventions are in napkin's docs/report.md. Hover a chart for its numbers.</p>
<div class="models">
)",
                                escape_xml(title), escape_xml(title));
  for (const HtmlReportInput& m : models) out += model_column(m, device);
  return out + "</div>\n</body></html>\n";
}

}  // namespace napkin::report
