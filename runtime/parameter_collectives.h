// What the collective kernels of a step (runtime/kernel_spec.h
// CollectiveSpec) do in a job of several ranks, under ZeRO-2 and ZeRO-3
// (docs/distributed.md): the executor calls this with each kernel's
// operand `x` and output `y`.
//
//  - all_reduce_sum: x copied to y and summed over the ranks in place (each
//    rank's part of the clipping norm or of fp16's overflow probe), stages
//    2 and 3.
//  - all_gather (stage 3): the parameter's value, from its owner
//    (OptimizerShards::owner) to every rank: the owner copies x to y, then
//    one broadcast. The others never read x, their home copy of the
//    parameter, whose memory is given back.
//  - reduce_scatter (stage 3): the sum over the ranks of each rank's
//    gradient x, into y on the parameter's owner (MPI_Reduce); the others'
//    y is not written, and the gradient stage zeroes it without backing it
//    (runtime/gradient_stage.h). A gradient in another dtype than f32 is
//    summed in f32 and rounded once.
// Elsewhere (stages 0 and 1, or a gather or reduce under stage 2), a copy.
//
// Under stage 2 a program built for stage 3 keeps its gathers and reduces
// as copies: every rank holds every parameter, and the gradient stage
// reduce-scatters the gradients itself.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/communicator.h"
#include "runtime/kernel_spec.h"
#include "runtime/optimizer_shards.h"

namespace napkin::runtime {

class ParameterCollectives {
 public:
  ParameterCollectives(const OptimizerShards& shards, Communicator& comm, int stage);

  void operator()(const CollectiveSpec& spec, const char* x, char* y);

  // What the gathers and reduces took so far: calls, seconds (the wait for
  // the slowest rank included) and bytes this rank sent or received.
  struct Totals {
    int64_t calls = 0;
    double seconds = 0, bytes = 0;
  };
  const Totals& gathers() const { return gathers_; }
  const Totals& reduces() const { return reduces_; }
  // Off: the calls are not counted (an eval's forwards).
  void set_counting(bool on) { counting_ = on; }

 private:
  const OptimizerShards& shards_;
  Communicator& comm_;
  int stage_ = 2;
  std::vector<float> staging_;  // a gradient not in f32, widened
  Totals gathers_, reduces_;
  bool counting_ = true;
};

// Whether a program's step gathers its parameters itself (napkin build
// --zero 3: passes/shard_parameters.h).
bool gathers_parameters(const Program& program);

}  // namespace napkin::runtime
