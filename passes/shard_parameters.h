// ZeRO-3 (fully sharded data parallel) in the step itself: `napkin build
// --zero 3`. Each parameter lives on one rank of a job, its owner (the
// runtime chooses owners: runtime/optimizer_shards.h); the other ranks hold
// no copy between its uses. The step says where the parameters come and go,
// so the memory plan holds every gathered copy for exactly its live range
// and the planned arena per rank is exact (docs/distributed.md, "ZeRO-3").
//
// The rewrite, for every parameter p the forward or backward reads:
//  - gather: g = all_gather(p), a Forward node placed right before the first
//    node that reads p; every forward and backward read of p (and of a view
//    of p) reads g instead. The optimizer, built after this pass, reads p
//    itself: the owner updates its own copy, and only the owner runs that
//    update (ZeRO-1's skipping).
//  - gather again for the backward (unless `keep_gathered`): g, and every
//    forward value computed from gathered parameters alone (the precision
//    policy's casts of a weight, its transposed views), is recomputed in the
//    backward right before the first backward node that reads it
//    (passes/recompute.h with_recompute), so no gathered parameter lives
//    from the forward into the backward: at any point a rank holds the
//    parameters in use, not the model.
//  - scatter: each gradient output "grad.<p>" v becomes r = reduce_scatter(v),
//    a Backward node right after v's producer: the sum over the ranks of
//    every rank's v, kept by p's owner, so v is a temporary that dies there.
//
// In one process, and in a job that does not shard its parameters (--zero
// 0, 1 or 2 at run time), both collectives are copies: the program trains
// as the unsharded one does, bit for bit.
//
// Runs after autodiff and the passes that rewrite the backward, before loss
// scaling (which unscales the summed gradients and probes them for
// overflows) and the optimizer (which reads the parameters and the summed
// gradients).
#pragma once

#include <memory>

#include "passes/pass.h"

namespace napkin::passes {

struct ShardOptions {
  // The backward reads the forward's gathered copies instead of gathering
  // again: half the all-gathers, every parameter held from its first forward
  // use to its last backward use.
  bool keep_gathered = false;
};

std::unique_ptr<Pass> make_shard_parameters_pass(ShardOptions options);

}  // namespace napkin::passes
