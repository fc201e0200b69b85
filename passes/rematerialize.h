// Rematerialization: a forward value the backward reads is recomputed in
// the backward, inside the kernel that reads it, from inputs the step keeps
// anyway, when those take no more bytes than the value. Same bits (every op
// is a pure function of its inputs), fewer bytes kept and moved.
//
// Where it pays: GPT-2's MLP under bf16-mixed keeps `fc(x) + b` in f32 for
// gelu's gradient; the bf16 GEMM result it comes from is half the size and
// the backward's `gelu_grad` kernel adds the bias again as it loads it. The
// forward kernel no longer stores the f32 value at all.
//
// Terms:
//  - saved value: a forward node's result (its buffer) that a backward node
//    reads, directly or through a view.
//  - candidate: a saved value v made by an elementwise node, no step output
//    nor update source, that only backward elementwise nodes of v's shape
//    read in the backward, each directly: fusion then puts the recomputation
//    in the reader's kernel, so nothing is stored again.
//  - chain: the elementwise forward nodes v is computed by, walking its
//    inputs back while they are elementwise results nothing in the backward
//    reads (at most kMaxChain nodes); they are recomputed with v.
//  - leaves: the chain's inputs that are not in it: params, data, state and
//    constants (resident or inlined: free) and other results (kept from the forward to the
//    backward now, if they were not saved already).
//  - the rule: recompute v when the bytes of the leaves not saved already
//    are at most v's bytes. Candidates are taken in schedule order, each
//    decision counting the leaves earlier ones made saved.
// Runs after the optimizer pass and before recompute (--memory-budget) and
// fusion, with passes/recompute's with_recompute: each chain is cloned into
// the backward just before its first reader there.
#pragma once

#include <cstdint>
#include <memory>

#include "passes/pass.h"

namespace napkin::passes {

// What the pass did, for the report.
struct Rematerialized {
  int values = 0;             // saved values recomputed in the backward
  int64_t bytes_before = 0;   // their bytes: what the step no longer keeps for the backward
  int64_t bytes_after = 0;    // the leaves it keeps instead that it did not keep already
  double flops_added = 0;     // of the clones (less those a later pass removed, below)
  // Of the values, those whose recomputation passes/fuse_gemm_epilogues.h
  // replaced by a bf16 copy its GEMM epilogue stores (a gelu's input): kept
  // in as many bytes, read instead of recomputed.
  int stored_by_epilogues = 0;
};

// The pass; it says what it did in `report`.
std::unique_ptr<Pass> make_rematerialize_pass(Rematerialized& report);

}  // namespace napkin::passes
