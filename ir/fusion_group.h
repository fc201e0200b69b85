// Fusion groups as the later stages see them: which nodes run as one kernel,
// what that kernel reads and writes, and which values never reach memory.
// passes/fuse_elementwise forms the groups; memory, the kernel plan, the
// report and `napkin graph --dot` read them through this file.
//
// Terms:
//  - member: a node with Node::group == the group's id. Members are
//    contiguous in the schedule and share one phase (the verifier checks it).
//  - iteration shape: the output shape of the group's non-constant members
//    (all the same); a constant member is a scalar folded in as an immediate.
//  - reduction: a group may end with one reduction (reduce_sum, _mean, _max,
//    _min) of a member's result, or of a value a member reads too, read
//    directly (not through a view): the elementwise members are
//    its prologue, computed per element as the reduction loads it. Its input
//    shape is the iteration shape. Its result is a group output; the kernel
//    stores the other members' results that are group outputs as it visits
//    each element (once).
//  - GEMM epilogue: a group may start with a contraction whose result its
//    other members, the epilogue, read directly (ir/gemm_epilogue.h, made by
//    passes/fuse_gemm_epilogues): the GEMM library applies them as it stores.
//    Its result is internal; the iteration shape is its shape. Or a GEMM's
//    group is the contraction and a reduction of its B operand, the bias
//    gradient it stores besides D (ir/gemm_epilogue.h GemmBiasGrad): D is
//    then a group output, and the iteration shape D's.
//  - internal value: made by a member, and every node that reads it (directly
//    or through a view of its buffer) is a member, and it is not a graph
//    output nor (the buffer of) an update's value. It lives in a register for
//    one element and owns no buffer.
//  - group output: a value made by a member that is not internal: the kernel
//    stores it. A group may have several (the optimizer's m, v and param).
//  - group input: a value read by a member and made outside the group
//    (params, state, data, other kernels' results, views of any of them),
//    distinct, in order of first use.
//  - batch (horizontal fusion): consecutive groups of the optimizer phase
//    with one signature (batch_signature) run as one kernel over a table of
//    tensors: every parameter's AdamW update in one launch, each
//    parameter's sum of squares for gradient clipping in another. A batch's
//    kernel spans its groups' positions. fuse_elementwise schedules groups
//    of one signature next to each other.
#pragma once

#include <vector>

#include "ir/graph.h"

namespace napkin::ir {

struct FusionGroup {
  int id = -1;
  Phase phase = Phase::Forward;
  std::vector<NodeId> nodes;  // schedule order
  std::vector<ValueId> inputs;
  std::vector<ValueId> outputs;   // in the order their producers run
  std::vector<ValueId> internal;  // likewise
  std::vector<int64_t> shape;     // the iteration shape
  NodeId reduction = kNoNode;     // the last member, when the group ends with a reduction
  NodeId contraction = kNoNode;   // the first member, when the group is a GEMM's epilogue
  int first = 0, last = 0;        // schedule positions of the first and last member
};

// Groups (ids, schedule order, at least two) that run as one kernel.
struct FusionBatch {
  std::vector<int> groups;
  int first = 0, last = 0;  // schedule positions: the first group's first member, the last group's last
};

struct FusionGroups {
  std::vector<FusionGroup> groups;  // by id, ids 0 .. n-1 in schedule order
  std::vector<FusionBatch> batches;
  std::vector<int> batch_of;        // per group id: its batch, -1 for none
  std::vector<bool> internal;       // per value id
  // The group of the node at each schedule position, -1 for an unfused node.
  std::vector<int> group_at;
  // The schedule positions a kernel spans: a member's batch's or group's
  // [first, last], or [p, p] for an unfused node at p.
  int kernel_first(int position) const;
  int kernel_last(int position) const;
};

// Computes the groups of g from the nodes' annotations. Internal error when
// the annotations break the invariants above (the verifier reports those
// first).
FusionGroups fusion_groups(const Graph& g);

// What makes groups batchable together: equal non-empty signatures. Empty
// when fg cannot be batched: not in the optimizer phase, a member that needs
// its element's position, an input that is neither 0-d nor a contiguous value
// of the iteration shape, an output that is not contiguous, or a reduction
// that does not reduce every axis to a 0-d result. Within a batch every
// member is then a flat loop over its own element count.
std::string batch_signature(const Graph& g, const FusionGroup& fg);

}  // namespace napkin::ir
