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

// A metrics file's runs (`path` names them in errors and the legend); nullopt
// with `error` set ("FILE:LINE: what") when a line is not a JSON object or
// no line is a step's record. A trainer appends to its file, so one file may
// hold several runs: each run's first record is {"run": ID, "start_step":
// N}, and a run record that does not continue the one before (another run
// id, or a start before that run's last step: a branch from an older
// checkpoint) starts a new line, named "FILE, run ID" (", from step N" when
// the id repeats). Lines without a step (the run's peak memory) are
// skipped; null numbers (unknown, or not finite) are points left out; a
// quantity a run never logged is left empty.
std::optional<std::vector<MetricsRun>> parse_metrics(const std::string& text, const std::string& path,
                                                     std::string& error);

// The charts as one SVG (the charts stacked) or one HTML page (the same
// SVGs, with a title). A quantity no run logged is left out.
std::string plot_svg(const std::vector<MetricsRun>& runs);
std::string plot_html(const std::vector<MetricsRun>& runs);

}  // namespace napkin::report
