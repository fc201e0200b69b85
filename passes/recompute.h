// Activation checkpointing under a memory budget (`--memory-budget BYTES`):
// forward values the backward phase reads are recomputed in the backward phase
// instead of being kept, until the planned arena (analysis/memory_plan.h) fits
// the budget, adding as few FLOPs as the greedy below finds.
//
// Terms:
//  - saved buffer: a buffer of MemoryCategory::SavedActivations (made by a
//    forward node, read by a backward node, directly or through a view).
//  - recomputable: a saved buffer that no graph output, update value or
//    optimizer node reads (those would keep the original alive anyway).
//    Params, state and inputs are never recomputed (they are no node's
//    result); every op is a pure function of its inputs and attributes, so
//    running a forward node again gives the same bits.
//  - recompute set S: the forward buffers (by owning value) recomputed. The
//    graph with S is the original with, in the backward phase, a clone of the
//    producer of each buffer in S (Phase::Backward, same op, attributes, YAML
//    location, scope; Node::origin = the forward node), inserted just before
//    the first backward node that needs it; every backward reader of the
//    buffer (or of a view of it) reads the clone (or a clone of the view)
//    instead. A clone's inputs are the originals, or their clones when they
//    are in S too (chains). Forward nodes and their results are unchanged.
//  - FLOPs added: the op-table FLOPs of the cloned non-view nodes.
//  - planned arena of S: the arena of the graph with S after fuse-elementwise
//    (which the pipeline runs right after this pass): fusion keeps some values
//    in registers and widens live ranges to whole kernels, so the budget is
//    checked against the arena the trainer will allocate. The peaks the greedy
//    reads are the unfused graph's (its positions are the ones S is built on).
//  - the greedy: start from S = {}; while the planned arena exceeds the
//    budget, look at the position p of the liveness peak; for each
//    recomputable buffer c live at p whose first backward read comes after p,
//    its closure is c plus, recursively, the non-resident forward buffers its
//    producer reads that are dead at p (recomputing c without them would make
//    them live at p); the bytes saved at the peak are the closure's bytes live
//    at p. Add the closure with the most bytes saved per FLOP added (ties: more
//    bytes, then the earlier in the schedule), rebuild, re-run the memory analysis.
//    Cheap elementwise results (gelu, layernorm outputs) go first, matmul
//    results last.
//  - smallest feasible budget: the smallest arena on the greedy's path when it
//    runs until no candidate saves bytes at the peak. A budget below it is a
//    user error that names it; that budget itself is met (the greedy takes the
//    same path and stops there).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "passes/pass.h"

namespace napkin::passes {

struct RecomputedValue {
  std::string name;  // the value's name, or "%<id>"
  std::string op;    // its producer's op
  int line = 0;      // the producer's YAML line (0: unknown)
  int64_t bytes = 0;
  double flops = 0;  // of one recomputation
};

// What the pass did, for the report.
struct RecomputeReport {
  bool ran = false;  // a budget was given
  int64_t budget = 0;
  int64_t arena_before = 0, arena_after = 0;
  int64_t peak_before = 0, peak_after = 0;  // liveness peaks
  double step_flops = 0;                     // the step before recomputation
  double flops_added = 0;
  std::vector<RecomputedValue> values;  // schedule order of their forward producers
};

// `--memory-budget`: 0 for none. The pipeline runs the pass when bytes > 0.
struct MemoryBudget {
  int64_t bytes = 0;
};

// The graph with the buffers (owning values) in `recomputed` recomputed in
// the backward phase (the header's "graph with S"); `flops_added` gets the
// FLOPs of the clones. passes/rematerialize uses it too.
ir::Graph with_recompute(const ir::Graph& original, const std::set<ir::ValueId>& recomputed, double& flops_added);

// The pass ("recompute"); it says what it did in `report`.
std::unique_ptr<Pass> make_recompute_pass(int64_t budget, RecomputeReport& report);

// "64MiB", "1.5GB", "1000000", "2 GiB": a positive byte count. Units: B, kB/KB,
// MB, GB, TB (powers of 1000) and KiB, MiB, GiB, TiB (powers of 1024).
std::optional<int64_t> parse_memory_budget(std::string_view text, std::string& error);

}  // namespace napkin::passes
