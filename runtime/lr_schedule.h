// The learning-rate schedule a trainer's optimizer kernels compute
// (passes/optimizer.h, docs/training.md): fixed when napkin built the
// trainer, its length being train.steps then. A run with another --steps
// does not stretch it; the trainer says so (docs/runtime.md, "Trainer flags").
#pragma once

#include <cstdint>
#include <string>

namespace napkin::runtime {

struct LrSchedule {
  std::string kind = "constant";  // "constant" or "cosine"
  int64_t warmup = 0;             // steps of linear warmup
  int64_t steps = 0;              // train.steps at build time: the cosine decay ends there
  double lr = 0, min_lr = 0;

  // The learning rate of update t (1 for the first), as the kernels compute it.
  double at(int64_t t) const;
  // The step after which the rate no longer changes: the end of the cosine
  // decay, or of the warmup; 0 for a constant rate without warmup.
  int64_t end() const;
  // "cosine: warmup 700 steps, then decay to min_lr 6e-05, ending at step
  // 19,073 (train.steps when napkin built this trainer)".
  std::string describe() const;
  // Why a run to step `run_steps` does not follow the schedule to its end
  // (it stops inside it, or a cosine decay ended long before), with the fix;
  // "" when it does.
  std::string mismatch(int64_t run_steps) const;
  bool operator==(const LrSchedule&) const = default;
};

}  // namespace napkin::runtime
