// `napkin plot`: charts of training runs' metrics files (runtime/trainer's
// --metrics JSON lines): the loss (train and eval), tokens/s and MFU over
// steps, one chart per quantity, every run a line, as one SVG or HTML file.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace napkin::report {

// One run's metrics (NaN-free; empty vectors where the run logged none).
struct MetricsRun {
  std::string name;  // the file, for the legend
  std::vector<double> step, loss, tokens_per_s, mfu;  // the progress lines
  std::vector<double> eval_step, eval_loss;           // the eval lines
};

// A metrics file's text (`path` names it in errors and the legend); nullopt
// with `error` set ("FILE:LINE: what") when a line is not a JSON object or
// no line is a step's record. Lines without a step (the run's peak memory)
// are skipped; a quantity the run never logged is left empty.
std::optional<MetricsRun> parse_metrics(const std::string& text, const std::string& path, std::string& error);

// The charts as one SVG (the charts stacked) or one HTML page (the same
// SVGs, with a title). A quantity no run logged is left out.
std::string plot_svg(const std::vector<MetricsRun>& runs);
std::string plot_html(const std::vector<MetricsRun>& runs);

}  // namespace napkin::report
