#include "runtime/lr_schedule.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "runtime/dataset.h"

namespace napkin::runtime {

namespace {

// passes/optimizer.cpp's decay length: at least one step.
int64_t decay_steps(const LrSchedule& s) { return std::max<int64_t>(1, s.steps - s.warmup); }

}  // namespace

double LrSchedule::at(int64_t t) const {
  const double step = static_cast<double>(t), warm = static_cast<double>(warmup);
  if (warmup > 0 && (kind == "constant" || t <= warmup)) return lr * std::min(1.0, step / warm);
  if (kind == "constant") return lr;
  const double progress = std::min(1.0, (step - warm) / static_cast<double>(decay_steps(*this)));
  return min_lr + 0.5 * (lr - min_lr) * (1 + std::cos(M_PI * progress));
}

int64_t LrSchedule::end() const { return kind == "cosine" ? warmup + decay_steps(*this) : warmup; }

std::string LrSchedule::describe() const {
  const std::string warm = warmup > 0 ? fmt::format("warmup {} steps, then ", with_commas(warmup)) : "";
  if (kind == "constant") return warmup > 0 ? fmt::format("{}constant", warm) : "constant";
  return fmt::format("cosine: {}decay to min_lr {:g}, ending at step {} (train.steps when napkin built this trainer)",
                     warm, min_lr, with_commas(end()));
}

std::string LrSchedule::mismatch(int64_t run_steps) const {
  const int64_t last = end();
  // A constant rate after its warmup stays so: only a run that stops inside the warmup misses it.
  if (last == 0 || run_steps == last || (kind == "constant" && run_steps > last)) return "";
  const std::string where = run_steps <= warmup ? "inside the warmup"
                            : run_steps < last  ? "before the decay ends"
                                                : fmt::format("{} steps after the decay ended", with_commas(run_steps - last));
  return fmt::format(
      "--steps {} is not the length of this trainer's learning-rate schedule ({}): napkin fixed the schedule when it "
      "built the trainer, and the run ends at step {}, {}, at lr {:.4g} of {:g}. To fit the schedule to this run, set "
      "train.steps: {} in the model's YAML and rebuild",
      with_commas(run_steps), describe(), with_commas(run_steps), where, at(run_steps), lr, run_steps);
}

}  // namespace napkin::runtime
