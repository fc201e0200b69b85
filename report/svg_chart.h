// Charts as inline SVG text, for the HTML report (report/html_report.h) and
// `napkin plot` (report/plot.h): no script, no external fonts; hover text is
// each mark's SVG <title>, which browsers show as a tooltip. Every mark
// carries its numbers as data-* attributes, so a test can read back from the
// page exactly what was drawn.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace napkin::report {

// A line of a line chart: points (x, y), drawn in order; a point with a
// non-finite coordinate breaks the line there.
struct Series {
  std::string name;
  std::vector<double> x, y;
  std::string color;  // "" picks one by index
  bool dashed = false;
  int64_t values = 0;  // how many values the points stand for (data-points): more when they were bucketed
};

struct Axes {
  std::string title, x_label, y_label;
  bool log_x = false, log_y = false;
  int width = 640, height = 300;
};

// Lines over shared axes, with a legend when there are several. Any finite
// values, ±1.7e308 included, give finite coordinates.
std::string line_chart(const Axes& axes, const std::vector<Series>& series);

// A stacked area chart over positions 0 .. n-1: layers[k][i] is layer k's
// value at position i (bytes), stacked bottom up. `marks` are x positions to
// draw as labelled vertical lines (phase boundaries, the peak); a mark with
// `emphasis` is drawn bold. `hover[i]` (may be empty) is the tooltip of
// position i's column.
struct Layer {
  std::string name, color;
  std::vector<double> values;
};
struct Mark {
  double x = 0;
  std::string label;
  bool emphasis = false;
};
std::string stacked_area_chart(const Axes& axes, const std::vector<Layer>& layers, const std::vector<Mark>& marks,
                               const std::vector<std::string>& hover);

// A roofline: points at (intensity, FLOP/s) on log-log axes under the roofs
// min(peak, bandwidth · intensity). Each point's radius grows with its
// `weight` (seconds), its color is its group's.
struct RooflinePoint {
  double flops = 0, bytes = 0, seconds = 0;
  std::string group, title;
};
struct Roof {
  std::string name;
  double peak_flops = 0, bandwidth = 0;  // FLOP/s, bytes/s
};
std::string roofline_chart(const Axes& axes, const std::vector<RooflinePoint>& points, const std::vector<Roof>& roofs);

// The color of the i-th series or group (a fixed palette, cycled).
std::string palette(size_t i);
// Text escaped for HTML and SVG (& < > " ').
std::string escape_xml(const std::string& text);

}  // namespace napkin::report
