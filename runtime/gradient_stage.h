// The gradient stage of a training step: what happens to the gradients
// between the backward (kernels [0, Program::num_gradient_kernels)) and the
// optimizer, when a step is more than one micro-batch on one rank.
//
//   step = for k in 0..K-1: forward + backward of micro-batch k, add its
//          gradients into `sum` (f32, every gradient packed in the
//          program's order); then all-reduce `sum` over the N ranks,
//          multiply by 1/(K·N), and write it back into the gradient
//          buffers, where the optimizer reads the mean gradient of the
//          K·N micro-batches: the gradient of the global batch's mean loss.
//
// With K = N = 1 there is nothing to do and the stage is skipped (no
// buffer). With K = 1 on an engine with device collectives (NCCL on a GPU)
// the gradients are averaged in place on the device instead, with no host
// buffer. The sum is in f32 whatever the gradients' dtype (a bf16 gradient
// is widened as it is added and rounded once at the end), in a fixed order
// (micro-batches in order, then MPI's), so a run is reproducible bit for bit
// for a given K and N. docs/distributed.md.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/communicator.h"
#include "runtime/engine.h"

namespace napkin::runtime {

class GradientStage {
 public:
  GradientStage(Engine& engine, Communicator& comm, int64_t micro_batches);

  bool active() const { return active_; }
  // The device's collectives the stage uses ("NCCL 2.28.3"), "" for the
  // host path; and why not, when the engine has some but could not use them.
  const std::string& device_collectives() const { return device_; }
  const std::string& why_not_device() const { return why_not_device_; }
  int64_t micro_batches() const { return micro_batches_; }
  // Bytes the stage holds besides the arena (0 when inactive): the f32 sum,
  // and a staging copy when some gradient is not f32.
  int64_t buffer_bytes() const;

  // After micro-batch k's backward (k = 0 first: the sum starts over).
  void add_micro_batch(int64_t k);
  // After the last micro-batch: all-reduce, average, write back.
  void finish();

  // What the all-reduces took so far: calls, seconds in MPI (the wait for
  // the slowest rank included), and the bytes each reduced.
  int64_t all_reduces() const { return all_reduces_; }
  double all_reduce_seconds() const { return all_reduce_seconds_; }
  // Bytes each all-reduce carries: the f32 sum on the host, the gradients
  // in their own dtypes on the device. With device collectives the seconds
  // are the wait after the backward (the rest overlapped with it).
  int64_t all_reduce_bytes() const;

 private:
  Engine& engine_;
  Communicator& comm_;
  int64_t micro_batches_ = 1;
  bool active_ = false, all_f32_ = true;
  std::string device_, why_not_device_;
  int64_t numel_ = 0, gradient_bytes_ = 0;  // over every gradient
  std::vector<float> sum_;
  std::vector<char> raw_;  // the gradients' own bytes (only when some is not f32)
  int64_t all_reduces_ = 0;
  double all_reduce_seconds_ = 0;
};

}  // namespace napkin::runtime
