#include "report/plot.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <nlohmann/json.hpp>

#include "report/svg_chart.h"

namespace napkin::report {

namespace {

constexpr int kWidth = 720, kHeight = 280;

// A metrics record longer than this is not one (the trainer's are ~200 bytes).
constexpr size_t kMaxLineBytes = size_t{1} << 20;

// A run's quantity as a line of a chart; `scale` multiplies the values.
Series series_of(const BucketedSeries& b, const std::string& name, const std::string& color, bool dashed,
                 double scale = 1) {
  Series s{name, {}, {}, color, dashed, b.values()};
  b.points(s.x, s.y);
  for (double& y : s.y) y *= scale;
  return s;
}

// The charts, each a standalone <svg>.
std::vector<std::string> charts(const std::vector<MetricsRun>& runs) {
  std::vector<Series> loss, speed, mfu;
  for (size_t i = 0; i < runs.size(); ++i) {
    const MetricsRun& r = runs[i];
    const std::string color = palette(i);
    if (r.loss.drawable()) loss.push_back(series_of(r.loss, r.name + " train", color, false));
    if (r.eval_loss.drawable()) loss.push_back(series_of(r.eval_loss, r.name + " eval", color, true));
    if (r.tokens_per_s.drawable()) speed.push_back(series_of(r.tokens_per_s, r.name, color, false));
    if (r.mfu.drawable()) mfu.push_back(series_of(r.mfu, r.name, color, false, 100));
  }
  std::vector<std::string> out;
  if (!loss.empty()) out.push_back(line_chart({"Loss (train solid, eval dashed)", "step", "loss", false, false, kWidth, kHeight}, loss));
  if (!speed.empty()) out.push_back(line_chart({"Tokens per second", "step", "tokens/s", false, false, kWidth, kHeight}, speed));
  if (!mfu.empty()) out.push_back(line_chart({"MFU", "step", "% of the device's peak", false, false, kWidth, kHeight}, mfu));
  return out;
}

}  // namespace

void BucketedSeries::add(double x, double y) {
  ++values_;
  if (!std::isfinite(x) || !std::isfinite(y)) {
    if (!buckets_.empty()) buckets_.back().gap_after = true;
    return;
  }
  const Point p{values_, x, y};
  if (buckets_.empty() || buckets_.back().gap_after || buckets_.back().values == width_) {
    if (buckets_.size() == kMaxBuckets) merge_pairs();
    buckets_.push_back({p, p, p, p, 1, false});
    return;
  }
  Bucket& b = buckets_.back();
  ++b.values;
  if (y < b.low.y) b.low = p;
  if (y > b.high.y) b.high = p;
  b.last = p;
}

void BucketedSeries::merge_pairs() {
  std::vector<Bucket> merged;
  merged.reserve(buckets_.size() / 2 + 1);
  for (size_t i = 0; i < buckets_.size(); i += 2) {
    if (i + 1 == buckets_.size()) {
      merged.push_back(buckets_[i]);
      break;
    }
    const Bucket& a = buckets_[i];
    const Bucket& b = buckets_[i + 1];
    merged.push_back({a.first, b.low.y < a.low.y ? b.low : a.low, b.high.y > a.high.y ? b.high : a.high, b.last,
                      a.values + b.values, a.gap_after || b.gap_after});
  }
  buckets_ = std::move(merged);
  width_ *= 2;
}

void BucketedSeries::points(std::vector<double>& x, std::vector<double>& y) const {
  for (const Bucket& b : buckets_) {
    std::array<Point, 4> p{b.first, b.low, b.high, b.last};
    std::sort(p.begin(), p.end(), [](const Point& l, const Point& r) { return l.index < r.index; });
    for (size_t i = 0; i < p.size(); ++i)
      if (i == 0 || p[i].index != p[i - 1].index) x.push_back(p[i].x), y.push_back(p[i].y);
    if (b.gap_after) x.push_back(std::nan("")), y.push_back(std::nan(""));
  }
}

std::optional<std::vector<MetricsRun>> parse_metrics(std::istream& in, const std::string& path, std::string& error) {
  // One part per run in the file; `id` is "" for records before any run
  // record (a file written before trainers wrote them).
  struct Part {
    MetricsRun run;
    std::string id;
    double start_step = 0;
    int64_t records = 0;
  };
  std::vector<Part> parts(1);
  double last_step = -1;  // the current part's
  int64_t line_number = 0;
  // One line into the runs; false with `error` set when it is not a record.
  auto take = [&](const std::string& line) {
    ++line_number;
    if (line.empty()) return true;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      error = fmt::format("{}:{}: not a JSON line ({})", path, line_number, e.what());
      return false;
    }
    if (!j.is_object()) {
      error = fmt::format("{}:{}: not a metrics record (a JSON object)", path, line_number);
      return false;
    }
    if (auto run = j.find("run"); run != j.end() && run->is_string()) {
      const std::string id = run->get<std::string>();
      auto start_field = j.find("start_step");
      const double start = start_field != j.end() && start_field->is_number() ? start_field->get<double>() : 0;
      // A resumed run carries on the line of the run it resumed.
      if (parts.back().records > 0 && id == parts.back().id && start >= last_step) return true;
      if (parts.back().records > 0) parts.emplace_back(), last_step = -1;
      parts.back().id = id;
      parts.back().start_step = start;
      return true;
    }
    auto step = j.find("step");
    if (step == j.end() || !step->is_number()) return true;  // the run's other records (peak memory, ...)
    last_step = std::max(last_step, step->get<double>());
    Part& part = parts.back();
    // A field the record has: its number, or a gap for null (a value that was not finite).
    auto add = [&](const char* key, BucketedSeries& series) {
      auto v = j.find(key);
      if (v == j.end()) return false;
      series.add(step->get<double>(), v->is_number() ? v->get<double>() : std::nan(""));
      return true;
    };
    if (add("loss", part.run.loss)) {
      ++part.records;
      add("tokens_per_s", part.run.tokens_per_s);
      add("mfu", part.run.mfu);
    }
    part.records += add("eval_loss", part.run.eval_loss);
    return true;
  };
  // Read in chunks and cut at newlines, so that no line grows past kMaxLineBytes.
  std::string line;
  std::array<char, 1 << 16> chunk;
  while (in.read(chunk.data(), chunk.size()) || in.gcount() > 0) {
    const char* at = chunk.data();
    const char* end = at + in.gcount();
    while (at < end) {
      const char* newline = static_cast<const char*>(std::memchr(at, '\n', static_cast<size_t>(end - at)));
      line.append(at, newline ? newline : end);
      at = newline ? newline + 1 : end;
      if (line.size() > kMaxLineBytes) {
        error = fmt::format("{}:{}: a line longer than {} bytes is not a metrics record", path, line_number + 1,
                            kMaxLineBytes);
        return std::nullopt;
      }
      if (newline) {
        if (!take(line)) return std::nullopt;
        line.clear();
      }
    }
  }
  if (in.bad()) {
    error = fmt::format("{}: cannot read it", path);
    return std::nullopt;
  }
  if (!line.empty() && !take(line)) return std::nullopt;
  std::erase_if(parts, [](const Part& p) { return p.records == 0; });
  if (parts.empty()) {
    error = fmt::format("{}: no step records (a trainer's --metrics file has a line per logged step)", path);
    return std::nullopt;
  }
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
