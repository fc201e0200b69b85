// What a trainer says about time: the prediction napkin's time model made
// when it built the trainer (analysis/step_time.h, carried in the program)
// against what the run measures. The banner line, the MFU of each progress
// line, the end-of-run comparison and `--profile`'s table by kernel class
// (docs/runtime.md, "time").
//
// MFU = achieved FLOP/s / the device's peak. A measurement above the peak
// means the peak is wrong (a device row measured on a slower machine, say):
// the trainer prints no MFU then, and says so once, instead of a figure
// over 100%.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/metrics_file.h"
#include "runtime/program.h"

namespace napkin::runtime {

// The program as one rank's step of `micro_batches` micro-batches sees it
// (gradient accumulation): the forward and backward run that many times, the
// optimizer once, so flops_per_step, tokens_per_step and the predicted step
// (and its MFU) are those of the whole step. The same program when 1.
Program per_step_view(const Program& p, int64_t micro_batches);

// MFU of a rate against a peak: a fraction in [0, 1], or nothing when there is
// no peak or the rate exceeds it.
struct Mfu {
  bool known = false;     // a peak exists and the rate is within it
  bool exceeded = false;  // the rate is above the peak: the peak is wrong
  double fraction = 0;
};
Mfu mfu_of(double flops_per_second, double peak_flops);
std::string mfu_text(const Mfu& m);  // "43.2%", "  n/a", or "> peak"

// "predicted 238 ms/step on cpu (time model, docs/report.md; MFU 86.2%)" and
// where the peak comes from, for the banner; "" when the device is unknown.
std::string predicted_banner(const Program& p);

// The one-time warning for a rate above the peak.
std::string peak_exceeded_warning(const Program& p, double flops_per_second);

// Step times of a run, for the end-of-run comparison.
class StepTimes {
 public:
  void add(double seconds) { seconds_.push_back(seconds); }
  size_t count() const { return seconds_.size(); }
  // The median step: robust to the first (warm-up) step and to a noisy
  // neighbour on a shared machine. 0 when no step ran.
  double median() const;

 private:
  std::vector<double> seconds_;
};

// "time: predicted 238 ms/step, measured 245 ms/step (median of 50 steps):
// measured/predicted 1.03; MFU predicted 86.2%, measured 83.7%".
std::string end_of_run_summary(const Program& p, const StepTimes& steps);
// The same as one metrics record (a "summary" record).
MetricsRecord end_of_run_metrics(const Program& p, const StepTimes& steps);

// --profile: measured seconds per kernel over `steps` steps against the
// prediction, by kernel class (sorted by the gap, the largest first), then
// the kernels with the largest gaps with their YAML lines.
std::string profile_report(const Program& p, const std::vector<double>& kernel_seconds, int64_t steps);
// The same as one metrics record: {"profile": true, "steps", "kernel_ms"},
// kernel_ms the measured milliseconds per step of each kernel in the
// program's order (--print-program names them), for scripts that add up a
// share of the step (bench/train_vs_peers.py: the expert GEMMs').
MetricsRecord profile_metrics(const std::vector<double>& kernel_seconds, int64_t steps);

}  // namespace napkin::runtime
