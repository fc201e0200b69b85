#include "report/svg_chart.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "ir/quantities.h"

namespace napkin::report {

namespace {

constexpr int kLeft = 70, kRight = 20, kTop = 30, kBottom = 45;

constexpr double kMax = std::numeric_limits<double>::max();

// A linear or log10 scale from [lo, hi] (finite, lo < hi) to pixels [a, b].
// Halves, not differences, of the values: hi - lo overflows for ±1.7e308.
struct Scale {
  double lo = 0, hi = 1;
  bool log = false;
  double a = 0, b = 1;
  double operator()(double v) const {
    const double t = log ? (std::log10(v) - std::log10(lo)) / (std::log10(hi) - std::log10(lo))
                         : (v / 2 - lo / 2) / (hi / 2 - lo / 2);
    return a + t * (b - a);
  }
  // Tick values: powers of ten on a log scale, round steps on a linear one
  // (a dozen at most, however the step rounds).
  std::vector<double> ticks() const {
    std::vector<double> out;
    if (log) {
      for (double p = std::floor(std::log10(lo)); p <= std::ceil(std::log10(hi)); ++p)
        if (double v = std::pow(10.0, p); v >= lo * 0.999 && v <= hi * 1.001) out.push_back(v);
      return out;
    }
    const double raw = (hi / 2 - lo / 2) / 2.5, mag = std::pow(10.0, std::floor(std::log10(raw > 0 ? raw : 1)));
    double step = mag;
    for (double m : {1.0, 2.0, 5.0, 10.0})
      if (raw <= m * mag) {
        step = m * mag;
        break;
      }
    const double first = std::ceil(lo / step) * step;
    for (int k = 0; k < 12; ++k) {
      const double v = first + k * step;
      if (!std::isfinite(v) || v > hi + step * 1e-9 || (!out.empty() && v == out.back())) break;
      out.push_back(v);
    }
    return out;
  }
};

// A range that covers the values (padded, never empty, and finite).
std::pair<double, double> range_of(const std::vector<double>& v, bool log, bool from_zero) {
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (double x : v)
    if (std::isfinite(x) && (!log || x > 0)) lo = std::min(lo, x), hi = std::max(hi, x);
  if (!std::isfinite(lo)) return {log ? 1.0 : 0.0, log ? 10.0 : 1.0};
  if (log)
    return {std::pow(10.0, std::floor(std::log10(lo))), std::min(kMax, std::pow(10.0, std::ceil(std::log10(hi) + 1e-12)))};
  if (from_zero) lo = std::min(lo, 0.0);
  if (hi == lo) {  // a width the values can resolve: 1, or a millionth of their size
    const double width = std::max(1.0, std::abs(lo) * 1e-6);
    if (lo + width <= kMax) hi = lo + width;
    else lo = hi - width;
  }
  const double pad = 0.05 * hi - 0.05 * lo;
  return {from_zero && lo == 0 ? 0 : std::max(-kMax, lo - pad), std::min(kMax, hi + pad)};
}

std::string tick_label(double v) {
  const double a = std::abs(v);
  if (a < 1e-12) return "0";  // and never "-0"
  if (a >= 1e7 || a < 1e-3) {
    const int e = static_cast<int>(std::floor(std::log10(a)));
    const double m = v / std::pow(10.0, e);
    return std::abs(m - 1) < 1e-9 ? fmt::format("1e{}", e) : fmt::format("{:.3g}e{}", m, e);
  }
  return fmt::format("{:.6g}", v);
}

std::string frame(const Axes& a, const Scale& x, const Scale& y) {
  std::string s = fmt::format("<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart\" width=\"{0}\" height=\"{1}\" "
                              "viewBox=\"0 0 {0} {1}\" font-family=\"sans-serif\" font-size=\"11\">\n",
                              a.width, a.height);
  s += fmt::format("<text x=\"{}\" y=\"18\" font-size=\"13\" font-weight=\"bold\">{}</text>\n", kLeft,
                   escape_xml(a.title));
  for (double t : x.ticks()) {
    const double px = x(t);
    s += fmt::format("<line x1=\"{0:.1f}\" x2=\"{0:.1f}\" y1=\"{1}\" y2=\"{2}\" stroke=\"#e4e4e4\"/>"
                     "<text x=\"{0:.1f}\" y=\"{3}\" text-anchor=\"middle\">{4}</text>\n",
                     px, kTop, a.height - kBottom, a.height - kBottom + 14, tick_label(t));
  }
  for (double t : y.ticks()) {
    const double py = y(t);
    s += fmt::format("<line x1=\"{0}\" x2=\"{1}\" y1=\"{2:.1f}\" y2=\"{2:.1f}\" stroke=\"#e4e4e4\"/>"
                     "<text x=\"{3}\" y=\"{4:.1f}\" text-anchor=\"end\">{5}</text>\n",
                     kLeft, a.width - kRight, py, kLeft - 4, py + 4, tick_label(t));
  }
  s += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#888\"/>\n", kLeft, kTop,
                   a.width - kLeft - kRight, a.height - kTop - kBottom);
  s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", (kLeft + a.width - kRight) / 2,
                   a.height - 8, escape_xml(a.x_label));
  s += fmt::format("<text transform=\"translate(14,{}) rotate(-90)\" text-anchor=\"middle\">{}</text>\n",
                   (kTop + a.height - kBottom) / 2, escape_xml(a.y_label));
  return s;
}

// The legend in the plot's top right corner, or its bottom right (`bottom`).
std::string legend(const Axes& a, const std::vector<std::pair<std::string, std::string>>& entries, bool bottom = false) {
  std::string s;
  double y = bottom ? a.height - kBottom - 6 - 14.0 * static_cast<double>(entries.size()) + 12 : kTop + 12;
  for (const auto& [name, color] : entries) {
    s += fmt::format("<rect x=\"{}\" y=\"{:.0f}\" width=\"10\" height=\"10\" fill=\"{}\"/>"
                     "<text x=\"{}\" y=\"{:.0f}\">{}</text>\n",
                     a.width - kRight - 170, y - 9, color, a.width - kRight - 155, y, escape_xml(name));
    y += 14;
  }
  return s;
}

Scale x_scale(const Axes& a, std::pair<double, double> r) { return {r.first, r.second, a.log_x, double(kLeft), double(a.width - kRight)}; }
Scale y_scale(const Axes& a, std::pair<double, double> r) {
  return {r.first, r.second, a.log_y, double(a.height - kBottom), double(kTop)};
}

}  // namespace

std::string palette(size_t i) {
  static const char* colors[] = {"#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2",
                                 "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"};
  return colors[i % (sizeof(colors) / sizeof(colors[0]))];
}

std::string escape_xml(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string line_chart(const Axes& axes, const std::vector<Series>& series) {
  std::vector<double> xs, ys;
  for (const Series& s : series) {
    xs.insert(xs.end(), s.x.begin(), s.x.end());
    ys.insert(ys.end(), s.y.begin(), s.y.end());
  }
  const Scale x = x_scale(axes, range_of(xs, axes.log_x, false)), y = y_scale(axes, range_of(ys, axes.log_y, false));
  std::string out = frame(axes, x, y);
  std::vector<std::pair<std::string, std::string>> entries;
  for (size_t i = 0; i < series.size(); ++i) {
    const Series& s = series[i];
    const std::string color = s.color.empty() ? palette(i) : s.color;
    entries.push_back({s.name, color});
    // One subpath per stretch of drawable points; a lone point is a dot (a
    // zero-length line with round caps).
    std::string d;
    size_t stretch = 0;
    for (size_t k = 0; k < s.x.size() && k < s.y.size(); ++k) {
      const double px = s.x[k], py = s.y[k];
      if (!std::isfinite(px) || !std::isfinite(py) || (axes.log_x && px <= 0) || (axes.log_y && py <= 0)) {
        if (stretch == 1) d += " h0";
        stretch = 0;
        continue;
      }
      d += fmt::format("{}{}{:.1f},{:.1f}", d.empty() ? "" : " ", stretch++ ? "L" : "M", x(px), y(py));
    }
    if (stretch == 1) d += " h0";
    out += fmt::format("<path class=\"series\" data-name=\"{}\" data-points=\"{}\" fill=\"none\" stroke=\"{}\" "
                       "stroke-width=\"1.5\" stroke-linecap=\"round\" stroke-linejoin=\"round\"{} d=\"{}\"><title>{}</title>"
                       "</path>\n",
                       escape_xml(s.name), s.values, color, s.dashed ? " stroke-dasharray=\"5,3\"" : "", d,
                       escape_xml(s.name));
  }
  if (series.size() > 1) out += legend(axes, entries);
  return out + "</svg>\n";
}

std::string stacked_area_chart(const Axes& axes, const std::vector<Layer>& layers, const std::vector<Mark>& marks,
                               const std::vector<std::string>& hover) {
  const size_t n = layers.empty() ? 0 : layers[0].values.size();
  std::vector<double> top(n, 0.0);
  for (const Layer& l : layers)
    for (size_t i = 0; i < n; ++i) top[i] += l.values[i];
  const Scale x = x_scale(axes, {0, std::max<double>(1, static_cast<double>(n) - 1)});
  const Scale y = y_scale(axes, range_of(top, false, true));
  std::string out = frame(axes, x, y);
  std::vector<double> base(n, 0.0);
  std::vector<std::pair<std::string, std::string>> entries;
  for (const Layer& l : layers) {
    std::string upper, lower;
    for (size_t i = 0; i < n; ++i)
      upper += fmt::format("{}{:.1f},{:.1f}", i ? " L" : "M", x(static_cast<double>(i)), y(base[i] + l.values[i]));
    for (size_t i = n; i-- > 0;) lower += fmt::format(" L{:.1f},{:.1f}", x(static_cast<double>(i)), y(base[i]));
    for (size_t i = 0; i < n; ++i) base[i] += l.values[i];
    out += fmt::format("<path class=\"layer\" data-name=\"{}\" fill=\"{}\" fill-opacity=\"0.85\" d=\"{}{} Z\"><title>{}</title></path>\n",
                       escape_xml(l.name), l.color, upper, lower, escape_xml(l.name));
    entries.push_back({l.name, l.color});
  }
  // Invisible columns carry each position's tooltip.
  if (!hover.empty() && n > 0) {
    const double w = std::max(1.0, (x(1.0) - x(0.0)));
    out += "<g class=\"hover\" fill=\"transparent\">";
    for (size_t i = 0; i < n && i < hover.size(); ++i)
      out += fmt::format("<rect x=\"{:.1f}\" y=\"{}\" width=\"{:.1f}\" height=\"{}\"><title>{}</title></rect>",
                         x(static_cast<double>(i)) - w / 2, kTop, w, axes.height - kTop - kBottom, escape_xml(hover[i]));
    out += "</g>\n";
  }
  for (const Mark& m : marks) {
    const double px = x(m.x);
    out += fmt::format("<line class=\"mark\" data-x=\"{}\" x1=\"{:.1f}\" x2=\"{:.1f}\" y1=\"{}\" y2=\"{}\" stroke=\"{}\" "
                       "stroke-width=\"{}\"/><text x=\"{:.1f}\" y=\"{}\" font-size=\"10\">{}</text>\n",
                       m.x, px, px, kTop, axes.height - kBottom, m.emphasis ? "#c00" : "#555", m.emphasis ? 2 : 1,
                       px + 3, kTop + (m.emphasis ? 24 : 10), escape_xml(m.label));
  }
  out += legend(axes, entries);
  return out + "</svg>\n";
}

std::string roofline_chart(const Axes& axes, const std::vector<RooflinePoint>& points, const std::vector<Roof>& roofs) {
  std::vector<double> xs, ys;
  for (const RooflinePoint& p : points)
    if (p.bytes > 0 && p.flops > 0 && p.seconds > 0) xs.push_back(p.flops / p.bytes), ys.push_back(p.flops / p.seconds);
  for (const Roof& r : roofs) ys.push_back(r.peak_flops);
  Axes a = axes;
  a.log_x = a.log_y = true;
  const Scale x = x_scale(a, range_of(xs, true, false)), y = y_scale(a, range_of(ys, true, false));
  std::string out = frame(a, x, y);
  for (size_t i = 0; i < roofs.size(); ++i) {
    const Roof& r = roofs[i];
    if (r.peak_flops <= 0 || r.bandwidth <= 0) continue;
    // The roof over the x range: bandwidth · intensity up to the ridge, then flat.
    std::string d;
    const int steps = 64;
    for (int k = 0; k <= steps; ++k) {
      const double xi = std::pow(10.0, std::log10(x.lo) + (std::log10(x.hi) - std::log10(x.lo)) * k / steps);
      const double yi = std::min(r.peak_flops, r.bandwidth * xi);
      if (yi < y.lo) continue;
      d += fmt::format("{}{:.1f},{:.1f}", d.empty() ? "M" : " L", x(xi), y(yi));
    }
    out += fmt::format("<path class=\"roof\" data-name=\"{}\" data-peak=\"{}\" data-bandwidth=\"{}\" fill=\"none\" "
                       "stroke=\"#333\" stroke-width=\"2\"{} d=\"{}\"><title>{}</title></path>\n",
                       escape_xml(r.name), r.peak_flops, r.bandwidth, i ? " stroke-dasharray=\"6,3\"" : "", d,
                       escape_xml(fmt::format("{}: {}/s peak, {}/s", r.name, ir::human_flops(r.peak_flops),
                                              ir::human_bytes(r.bandwidth))));
  }
  std::map<std::string, size_t> groups;
  for (const RooflinePoint& p : points) groups.emplace(p.group, groups.size());
  double longest = 0;
  for (const RooflinePoint& p : points) longest = std::max(longest, p.seconds);
  for (const RooflinePoint& p : points) {
    if (p.bytes <= 0 || p.flops <= 0 || p.seconds <= 0) continue;
    const double intensity = p.flops / p.bytes, rate = p.flops / p.seconds;
    const double r = 2.5 + 9.0 * std::sqrt(p.seconds / longest);
    out += fmt::format("<circle class=\"kernel\" data-flops=\"{}\" data-bytes=\"{}\" data-seconds=\"{}\" "
                       "data-intensity=\"{}\" data-group=\"{}\" cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"{:.1f}\" fill=\"{}\" "
                       "fill-opacity=\"0.6\" stroke=\"#222\" stroke-width=\"0.5\"><title>{}</title></circle>\n",
                       p.flops, p.bytes, p.seconds, intensity, escape_xml(p.group), x(intensity), y(rate), r,
                       palette(groups[p.group]), escape_xml(p.title));
  }
  std::vector<std::pair<std::string, std::string>> entries;
  for (const auto& [g, i] : groups) entries.push_back({g, palette(i)});
  out += legend(a, entries, /*bottom=*/true);  // the top right is where the fastest kernels sit
  return out + "</svg>\n";
}

}  // namespace napkin::report
