// The HTML report (report/html_report.h) and `napkin plot`'s charts
// (report/plot.h): the numbers drawn are the report's own, read back from
// the page's data-* attributes, and the page needs nothing from outside.
#include <doctest/doctest.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "analysis/cost.h"
#include "analysis/devices.h"
#include "analysis/memory.h"
#include "analysis/step_time.h"
#include "report/html_report.h"
#include "report/plot.h"
#include "report/report.h"
#include "support/test_models.h"

namespace {

using namespace napkin;

// Every value of attribute `name` on elements whose tag is `tag`, in order.
std::vector<double> attribute_values(const std::string& html, const std::string& tag, const std::string& name) {
  std::vector<double> out;
  const std::regex element("<" + tag + "\\b[^>]*>");
  const std::regex attribute(name + "=\"([^\"]*)\"");
  for (auto it = std::sregex_iterator(html.begin(), html.end(), element); it != std::sregex_iterator(); ++it) {
    const std::string e = it->str();
    std::smatch m;
    if (std::regex_search(e, m, attribute)) out.push_back(std::stod(m[1].str()));
  }
  return out;
}

struct Page {
  ir::Graph g;
  analysis::StepCost cost;
  analysis::MemoryReport memory;
  std::string json, html;
};

std::optional<std::vector<report::MetricsRun>> parse_text(const std::string& text, const std::string& path,
                                                         std::string& error) {
  std::istringstream in(text);
  return report::parse_metrics(in, path, error);
}

Page page(const char* model, const char* device_name) {
  Page p{testing::compile_small_model(testing::source_path(model)), {}, {}, {}, {}};
  const analysis::Device* device = analysis::find_device(device_name);
  REQUIRE(device != nullptr);
  p.cost = analysis::analyze_step(p.g, device);
  p.memory = analysis::analyze_memory(p.g);
  report::ReportOptions options;
  options.show_ops = false;
  p.json = report::render_report_json(p.g, p.cost, p.memory, options);
  p.html = report::render_report_html({{&p.g, &p.cost, &p.memory, p.json, model}}, *device);
  return p;
}

}  // namespace

TEST_CASE("html report: the timeline's peak, each roofline point and the embedded JSON are the report's numbers") {
  for (const char* model : {"models/gpt.yaml", "models/gpt2-124m.yaml"}) {
    CAPTURE(model);
    Page p = page(model, "h100");
    const nlohmann::json report = nlohmann::json::parse(p.json);
    // The memory timeline's peak is memory.peak, at the report's position.
    const std::vector<double> peak = attribute_values(p.html, "div", "data-peak");
    REQUIRE(peak.size() == 1);
    CHECK(peak[0] == report.at("memory").at("peak").get<double>());
    CHECK(peak[0] == static_cast<double>(p.memory.peak.bytes));
    CHECK(attribute_values(p.html, "div", "data-peak-position").at(0) == p.memory.peak.position);
    // One point per kernel of the time model, each at flops / bytes; their
    // FLOPs add up to the step's and their seconds to the predicted step's.
    const std::vector<double> flops = attribute_values(p.html, "circle", "data-flops");
    const std::vector<double> bytes = attribute_values(p.html, "circle", "data-bytes");
    const std::vector<double> intensity = attribute_values(p.html, "circle", "data-intensity");
    const std::vector<double> seconds = attribute_values(p.html, "circle", "data-seconds");
    const analysis::StepTime time = analysis::predict_step_time(p.g, p.cost, *analysis::find_device("h100"));
    size_t drawn = 0;
    double flops_sum = 0, seconds_sum = 0;
    for (const analysis::KernelTime& k : time.kernels) drawn += !k.no_peak && k.flops > 0 && k.bytes > 0 && k.seconds > 0;
    REQUIRE(flops.size() == drawn);
    REQUIRE(bytes.size() == drawn);
    REQUIRE(intensity.size() == drawn);
    for (size_t i = 0; i < drawn; ++i) {
      CHECK(intensity[i] == flops[i] / bytes[i]);
      flops_sum += flops[i];
      seconds_sum += seconds[i];
    }
    double counted = 0;  // kernels with no FLOPs (copies) are not drawn on log axes
    for (const analysis::KernelTime& k : time.kernels) counted += k.flops;
    CHECK(flops_sum == doctest::Approx(counted).epsilon(1e-12));
    CHECK(seconds_sum <= report.at("time").at("step_s").get<double>() * (1 + 1e-12));
    // The JSON report is on the page as it is.
    CHECK(p.html.find(p.json.substr(0, 200)) != std::string::npos);
    // Nothing from outside: no scripts, links or images by URL.
    for (const char* external : {"src=", "href=", "<link", "@import", "url("}) {
      CAPTURE(external);
      CHECK(p.html.find(external) == std::string::npos);
    }
    CHECK(p.html.size() < 2'000'000);
  }
}

TEST_CASE("html report: two models side by side, each with its own sections") {
  const analysis::Device& device = *analysis::find_device("cpu");
  Page a = page("models/gpt.yaml", "cpu"), b = page("models/mlp.yaml", "cpu");
  const std::string html = report::render_report_html(
      {{&a.g, &a.cost, &a.memory, a.json, "models/gpt.yaml"}, {&b.g, &b.cost, &b.memory, b.json, "models/mlp.yaml"}},
      device);
  CHECK(attribute_values(html, "div", "data-peak").size() == 2);
  CHECK(html.find("data-model=\"gpt-char\"") != std::string::npos);
  CHECK(html.find("data-model=\"mlp\"") != std::string::npos);
}

TEST_CASE("plot: metrics lines become one line per run and quantity, eval dashed, bad lines named") {
  const std::string text =
      "{\"step\": 10, \"loss\": 3.5, \"tokens_per_s\": 1000, \"mfu\": 0.5}\n"
      "{\"step\": 20, \"loss\": 3.0, \"tokens_per_s\": 1100, \"mfu\": 0.55}\n"
      "{\"step\": 20, \"eval_loss\": 3.2}\n"
      "{\"peak_resident_bytes\": [1], \"zero\": 0}\n"
      "{\"step\": 30, \"loss\": 2.5, \"tokens_per_s\": 1200, \"mfu\": null}\n";
  std::string error;
  std::optional<std::vector<report::MetricsRun>> runs = parse_text(text, "a.jsonl", error);
  REQUIRE(runs.has_value());
  REQUIRE(runs->size() == 1);
  const report::MetricsRun* run = &runs->front();
  CHECK(run->name == "a.jsonl");
  std::vector<double> x, y;
  run->loss.points(x, y);
  CHECK(x == std::vector<double>{10, 20, 30});
  CHECK(y == std::vector<double>{3.5, 3.0, 2.5});
  CHECK(run->eval_loss.values() == 1);
  CHECK(run->tokens_per_s.values() == 3);
  const std::string svg = report::plot_svg({*run});
  // loss (train, eval), tokens/s, MFU: four lines; MFU's null is not drawn.
  CHECK(attribute_values(svg, "path", "data-points") == std::vector<double>{3, 1, 3, 3});
  CHECK(svg.find("stroke-dasharray") != std::string::npos);
  CHECK(svg.find("a.jsonl eval") != std::string::npos);
  const std::string html = report::plot_html({*run, *run});
  CHECK(attribute_values(html, "path", "data-points").size() == 8);

  CHECK_FALSE(parse_text("{\"step\": 1, \"loss\": 2}\n[1, 2\n", "b.jsonl", error).has_value());
  CHECK(error.rfind("b.jsonl:2: not a JSON line", 0) == 0);
  CHECK_FALSE(parse_text("{\"zero\": 0}\n", "c.jsonl", error).has_value());
  CHECK(error.find("c.jsonl: no step records") == 0);
  CHECK_FALSE(parse_text("{\"step\": 1, \"loss\": 2}\n" + std::string(2 << 20, ' ') + "\n", "d.jsonl", error));
  CHECK(error.rfind("d.jsonl:2: a line longer than 1048576 bytes", 0) == 0);
}

TEST_CASE("plot: a long metrics file gives a bounded page - huge finite values finite coordinates - null a gap") {
  // 300,000 steps of loss, tokens/s and MFU; a spike of 1.7e308 and one of
  // -1.7e308 in the loss; nulls (values that were not finite) in a stretch.
  std::string text;
  text.reserve(300'000 * 80);
  for (int step = 1; step <= 300'000; ++step) {
    const bool null = step > 1000 && step <= 1010;
    const std::string loss = step == 77'777 ? "1.7e308" : step == 150'000 ? "-1.7e308" : null ? "null"
                                                                                               : fmt::format("{}", 3.0 + 1.0 / step);
    text += fmt::format("{{\"step\": {}, \"loss\": {}, \"tokens_per_s\": {}, \"mfu\": 0.5}}\n", step, loss, 1000 + step % 7);
  }
  std::string error;
  std::optional<std::vector<report::MetricsRun>> runs = parse_text(text, "long.jsonl", error);
  REQUIRE(runs.has_value());
  REQUIRE(runs->size() == 1);
  const report::MetricsRun* run = &runs->front();
  CHECK(run->loss.values() == 300'000);
  std::vector<double> x, y;
  run->loss.points(x, y);
  CHECK(x.size() <= 4 * report::BucketedSeries::kMaxBuckets + 1);
  // The spikes survive the bucketing; the nulls leave a break.
  CHECK(std::count(y.begin(), y.end(), 1.7e308) == 1);
  CHECK(std::count(y.begin(), y.end(), -1.7e308) == 1);
  CHECK(std::count_if(y.begin(), y.end(), [](double v) { return std::isnan(v); }) == 1);

  const std::string svg = report::plot_svg({*run});
  CHECK(svg.size() < 200'000);
  CHECK(svg.find("nan") == std::string::npos);
  CHECK(svg.find("inf") == std::string::npos);
  // Each line (loss, tokens/s, MFU) stands for every value and has a bounded number of vertices.
  std::vector<std::string> lines;  // each line's d attribute (too long for std::regex)
  for (size_t at = svg.find("<path class=\"series\""); at != std::string::npos; at = svg.find("<path class=\"series\"", at + 1)) {
    const size_t tag_end = svg.find('>', at);
    CHECK(svg.substr(at, tag_end - at).find("data-points=\"300000\"") != std::string::npos);
    const size_t d = svg.find(" d=\"", at) + 4;
    lines.push_back(svg.substr(d, svg.find('"', d) - d));
  }
  REQUIRE(lines.size() == 3);
  for (const std::string& d : lines) {
    const auto vertices = std::count(d.begin(), d.end(), ',');
    CHECK(vertices <= 4 * static_cast<long>(report::BucketedSeries::kMaxBuckets));
    CHECK(vertices > 100);
  }
  // The loss line breaks at the nulls: two stretches.
  CHECK(std::count(lines[0].begin(), lines[0].end(), 'M') == 2);
}

TEST_CASE("html report: a name with <!--<script> or </script> in the embedded JSON cannot end the script or open a comment") {
  Page p = page("models/gpt.yaml", "cpu");
  nlohmann::json report = nlohmann::json::parse(p.json);
  const std::string hostile = "x</script><!--<script>&y\xE2\x80\xA8z\xE2\x80\xA9";
  report["model"] = hostile;
  const std::string json = report.dump();
  const std::string html = report::render_report_html({{&p.g, &p.cost, &p.memory, json, "models/gpt.yaml"}},
                                                      *analysis::find_device("cpu"));
  const std::string open = "<script type=\"application/json\" class=\"napkin-report\">";
  const size_t begin = html.find(open);
  REQUIRE(begin != std::string::npos);
  const size_t end = html.find("</script>", begin);
  REQUIRE(end != std::string::npos);
  const std::string embedded = html.substr(begin + open.size(), end - begin - open.size());
  for (const char* raw : {"<", ">", "&", "\xE2\x80\xA8", "\xE2\x80\xA9"}) {
    CAPTURE(raw);
    CHECK(embedded.find(raw) == std::string::npos);
  }
  // The same JSON, read back; the script ends where the page ends it.
  CHECK(nlohmann::json::parse(embedded) == report);
  CHECK(html.compare(end, 20, "</script>\n</section>") == 0);
}

TEST_CASE("plot: the runs a trainer appended to one metrics file are lines of their own - a resumed run continues its line - null is a gap") {
  const std::string text =
      "{\"run\": \"aaaa\", \"start_step\": 0}\n"
      "{\"step\": 1, \"loss\": 3.0}\n"
      "{\"step\": 2, \"loss\": 2.5}\n"
      "{\"step\": 2, \"eval_loss\": null}\n"
      "{\"run\": \"aaaa\", \"start_step\": 2}\n"  // resumed from step 2: the same line
      "{\"step\": 3, \"loss\": 2.0}\n"
      "{\"run\": \"bbbb\", \"start_step\": 0}\n"  // a fresh run into the same file
      "{\"step\": 1, \"loss\": 3.1}\n"
      "{\"run\": \"aaaa\", \"start_step\": 1}\n"  // a branch of the first from its step 1
      "{\"step\": 2, \"loss\": 2.4}\n"
      "{\"run\": \"cccc\", \"start_step\": 0}\n";  // a run that logged no step
  std::string error;
  std::optional<std::vector<report::MetricsRun>> runs = parse_text(text, "m.jsonl", error);
  INFO(error);
  REQUIRE(runs.has_value());
  REQUIRE(runs->size() == 3);
  auto loss_points = [](const report::MetricsRun& run) {
    std::vector<double> x, y;
    run.loss.points(x, y);
    return std::pair{x, y};
  };
  CHECK((*runs)[0].name == "m.jsonl, run aaaa");
  CHECK(loss_points((*runs)[0]).first == std::vector<double>{1, 2, 3});
  CHECK((*runs)[0].eval_loss.values() == 1);  // the null: counted, not drawn
  CHECK_FALSE((*runs)[0].eval_loss.drawable());
  CHECK((*runs)[1].name == "m.jsonl, run bbbb");
  CHECK(loss_points((*runs)[1]).second == std::vector<double>{3.1});
  CHECK((*runs)[2].name == "m.jsonl, run aaaa, from step 1");
  CHECK(loss_points((*runs)[2]).first == std::vector<double>{2});
}
