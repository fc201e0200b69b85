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
//  - prefetch (unless off): the gathers of a unit are issued ahead of its
//    first use, so that the ranks move the unit's parameters while this rank
//    computes. A unit is the parameters whose first readers share a scope
//    (one block of a `repeat`, or a run of top-level parameters) and a phase.
//    Each unit's gathers move, together, to the latest schedule position
//    from which the time model says they finish before the unit's first use
//    (the compute between: analysis/cost.h's per-node roofline seconds on
//    `device`; the gather: the bytes over `link` at `ranks`, one latency per
//    call, after the gathers issued before it), but never before the
//    previous unit's first use nor into another phase: at most two units'
//    parameters are held gathered, the one in use and the next. The runtime
//    issues such a gather when the schedule reaches it and waits for it at
//    its first reader (runtime/parameter_collectives.h).
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
#include <string>
#include <vector>

#include "analysis/devices.h"
#include "analysis/distributed.h"
#include "passes/pass.h"

namespace napkin::passes {

struct ShardOptions {
  // The backward reads the forward's gathered copies instead of gathering
  // again: half the all-gathers, every parameter held from its first forward
  // use to its last backward use.
  bool keep_gathered = false;
  // Issue each unit's gathers ahead of its first use (above); off: right
  // before it.
  bool prefetch = true;
  // The time model the prefetch is placed by: null takes the cpu row and
  // "shm" (the CPU trainers' ranks on one host).
  const analysis::Device* device = nullptr;
  const analysis::Interconnect* link = nullptr;
  int ranks = 8;
};

// What the pass planned, for the report: the units, where their gathers
// were issued, and the time model's account of the step's communication
// (every collective in one queue per rank, in schedule order; the compute
// between them at the device's roofline).
struct ShardUnit {
  std::string scope;  // "blocks.3", "" at top level
  ir::Phase phase = ir::Phase::Forward;
  int gathers = 0;
  double bytes = 0;     // gathered
  double seconds = 0;   // the gathers' predicted time
  double ahead_seconds = 0;  // compute between the issue and the first use
  double exposed_seconds = 0;  // the wait at its first use
};
struct ShardSchedule {
  bool ran = false, prefetch = false;
  std::string device, link;
  int ranks = 0;
  std::vector<ShardUnit> units;
  int reduces = 0;
  double gather_seconds = 0, reduce_seconds = 0;  // every gather's / reduce's predicted time
  double compute_seconds = 0;                      // the step's nodes at the roofline, no collectives
  double exposed_seconds = 0;                      // what the collectives add to the compute
};

std::unique_ptr<Pass> make_shard_parameters_pass(ShardOptions options, ShardSchedule& schedule);

}  // namespace napkin::passes
