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
// for a given K and N.
//
// ZeRO-2 (`shards` given, N > 1): each rank keeps the f32 sum of its own
// parameters' gradients only (OptimizerShards' owners). The gradients are
// packed in owner order (rank 0's parameters first, each rank's in the
// program's order), so each rank's part is one range; after every
// micro-batch they are reduce-scattered in buckets of at least
// Program::bucket_bytes (whole gradients each), and each rank adds its part
// of each bucket into its sum. finish() writes the rank's own mean
// gradients back and zeroes the others' in the arena, so that what the
// optimizer sums over every gradient (the clipping norm's squares, fp16's
// overflow probe) is this rank's part of the whole, which the program's
// all_reduce_sum kernels add up over the ranks (Engine::set_collectives).
// With K = 1 on an engine running the step's collectives on the device
// (Engine::run_collectives_on_device, NCCL), ZeRO-2's gradients are averaged
// there instead, each onto its owner as the backward writes its bucket, and
// the others' zeroed: no host buffer, no MPI; ZeRO-3's step averages them
// itself, and the stage only waits.
// docs/distributed.md.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/communicator.h"
#include "runtime/engine.h"
#include "runtime/optimizer_shards.h"

namespace napkin::runtime {

class GradientStage {
 public:
  // shards: ZeRO-2's owners (null: every rank averages every gradient).
  // reduced_in_step: ZeRO-3, whose step reduces each gradient to its owner
  // itself (passes/shard_parameters.h): the stage only adds the owner's
  // micro-batches, averages them and zeroes the others' gradients.
  // replicas (hybrid sharding): `comm` is this rank's sharding group, and
  // each owner's sum is then summed over the groups' ranks of its index.
  GradientStage(Engine& engine, Communicator& comm, int64_t micro_batches, const OptimizerShards* shards = nullptr,
                bool reduced_in_step = false, Communicator* replicas = nullptr);

  bool active() const { return active_; }
  // ZeRO-2 and 3: each rank holds the sum of its own parameters' gradients.
  bool sharded() const { return !rank_counts_.empty(); }
  // ZeRO-3: the step reduced them (no collective here).
  bool reduced_in_step() const { return reduced_in_step_; }
  // ZeRO-2: the buckets each micro-batch's gradients are reduce-scattered in.
  size_t buckets() const { return buckets_.size(); }
  // The device's collectives the stage uses ("NCCL 2.28.3"), "" for the
  // host path; and why not, when the engine has some but could not use them.
  const std::string& device_collectives() const { return device_; }
  const std::string& why_not_device() const { return why_not_device_; }
  int64_t micro_batches() const { return micro_batches_; }
  // Bytes the stage holds besides the arena (0 when inactive): the f32 sum
  // (ZeRO-2: this rank's part), and a staging copy when some gradient is not
  // f32 (ZeRO-2: one bucket's).
  int64_t buffer_bytes() const;
  // What the stage will hold for rank `rank` of `ranks` on the host path
  // (no device collectives), before any stage exists, and the largest MPI
  // message of its step: a rank's memory prediction (runtime/rank_memory.h),
  // for this job and for the others it suggests. `shards`,
  // `reduced_in_step`: as the constructor's.
  struct HostBuffers {
    int64_t bytes = 0;          // buffer_bytes()
    int64_t all_reduced = 0;    // the f32 sum, all-reduced whole once a step (0: not)
    int64_t scattered = 0;      // ZeRO-2: the widest bucket reduce-scattered (0: none)
  };
  static HostBuffers host_buffers(const Program& program, int64_t micro_batches, int ranks, int rank,
                                  const OptimizerShards* shards, bool reduced_in_step);

  // After micro-batch k's backward (k = 0 first: the sum starts over).
  void add_micro_batch(int64_t k);
  // After the last micro-batch: all-reduce, average, write back (ZeRO-2:
  // average this rank's part, write it back, zero the others').
  void finish();

  // What the step's collectives took so far: steps, seconds in MPI (the
  // wait for the slowest rank included), and the bytes a step reduces. The
  // collective is an all-reduce, or ZeRO-2's reduce-scatters (one per
  // bucket of each micro-batch).
  int64_t all_reduces() const { return all_reduces_; }
  double all_reduce_seconds() const { return all_reduce_seconds_; }
  // Bytes a step's collectives carry: the f32 sum on the host (ZeRO-2: once
  // per micro-batch), the gradients in their own dtypes on the device. With
  // device collectives the seconds are the wait after the backward (the rest
  // overlapped with it).
  int64_t all_reduce_bytes() const;

 private:
  Engine& engine_;
  Communicator& comm_;
  Communicator* replicas_ = nullptr;
  int64_t micro_batches_ = 1;
  bool active_ = false, all_f32_ = true, reduced_in_step_ = false;
  std::string device_, why_not_device_;
  int64_t numel_ = 0, gradient_bytes_ = 0;  // over every gradient
  std::vector<float> sum_;
  std::vector<char> raw_;  // the gradients' own bytes (only when some is not f32)
  // ZeRO-2.
  struct Bucket {
    size_t first = 0, last = 0;   // its gradients: order_[first, last)
    std::vector<int64_t> counts;  // elements per rank
    int64_t own_at = 0;           // where this rank's part goes in sum_
  };
  std::vector<size_t> order_;        // gradient indices in owner order
  std::vector<int64_t> rank_counts_;  // elements each rank sums
  std::vector<bool> owned_;          // per gradient index
  std::vector<int64_t> own_at_;      // per owned gradient: its elements' start in sum_
  std::vector<Bucket> buckets_;
  std::vector<float> staging_;  // one bucket, packed (also the zeros written into others' gradients)
  // The host buffers' sizes and ZeRO-2/3's packing: a function of the
  // program, the micro-batches and the rank (shards null: every gradient
  // averaged whole).
  struct Layout {
    int64_t sum = 0, staging = 0, raw = 0;  // sum_'s and staging_'s elements, raw_'s bytes
    std::vector<size_t> order;
    std::vector<int64_t> rank_counts, own_at;
    std::vector<bool> owned;
    std::vector<Bucket> buckets;
  };
  static Layout layout(const Program& p, int64_t micro_batches, int ranks, int rank, const OptimizerShards* shards,
                       bool reduced_in_step);
  void add_sharded(int64_t k);
  void add_reduced(int64_t k);
  void finish_sharded();
  int64_t all_reduces_ = 0;
  double all_reduce_seconds_ = 0;
};

}  // namespace napkin::runtime
