// Elementwise fusion: chains of elementwise ops become one kernel each, so
// the values between them live in registers instead of memory.
//
// Terms (ir/fusion_group.h defines group, member, internal value, group
// input and output; this pass only sets Node::group and reorders):
//  - fusible node: an Elementwise-class op (casts, comparisons, where,
//    gelu_grad and triu/causal_mask included) or a copy. Constants are not
//    fusible themselves; they fold in at the end (below).
//  - iteration shape: a fusible node's output shape. Its inputs may have any
//    shape that broadcasts to it and any layout (views of any buffer): a
//    kernel reads them in place, by strides.
//  - the pass walks the schedule once, in order. A fusible node n joins the
//    groups of the producers of its inputs (read directly, not through a
//    view) that have n's iteration shape and phase; several such groups merge
//    into one. A 0-d node whose producers are in no such group joins the
//    latest 0-d group of its phase instead (horizontal fusion of scalars: the
//    optimizer's learning-rate and bias-correction chain becomes one kernel).
//    Otherwise n starts a group of its own.
//  - a merge of node sets into one group is legal when no node scheduled
//    between them both depends on the set (transitively, views included) and
//    is needed by it: that node would have to run inside the kernel. A legal
//    merge reorders the span [first member, last member]: the nodes that do
//    not depend on the set first, then the members, then the nodes that do,
//    each part in its old order, so the schedule stays topological and every
//    reader of a group output runs after the group. A read through a view of
//    a group value inside the group is such a node (the view), so it is
//    never merged: members read each other's values directly.
//  - constants: each constant read directly by members of a group gets a copy
//    in that group (scheduled at its start, with its phase), which the kernel
//    inlines as an immediate; a constant left without readers is erased.
//  - a group of one node is dissolved (it is a kernel either way); ids are
//    then renumbered 0 .. n-1 in schedule order.
//  - a reduction (reduce_sum, _mean, _max, _min) joins the group of the
//    member whose result it reads directly (else a group one of whose
//    members reads the same value directly: the kernel loads it anyway; it
//    may then move later, to after that group, when none of its readers
//    comes before the group's end),
//    once the walk is done, as its
//    last member, when the group has the value's shape and phase and no
//    reduction yet, and no member needs its element's position. It moves to
//    right after the group's other members. The group still stores every
//    member result read outside it (a bias gradient is summed in the kernel
//    that also stores the gradient for the matmuls), and the value reduced is
//    internal when the reduction was its only reader (gradient clipping's
//    squares are never stored).
// Runs near the end of the training pipeline: later stages (memory, kernel
// plan, report) read the groups; a pass that moves or adds nodes after it
// (passes/fuse_gemm_epilogues.h, which adds a contraction to the group that
// is its GEMM's epilogue) must keep the invariants of ir/fusion_group.h.
// Normalizations, losses and contractions are never members here: softmax,
// layernorm, rmsnorm and cross-entropy and their gradients are already one
// kernel each (docs/fusion.md).
#pragma once

#include <cstdint>
#include <memory>

#include "passes/pass.h"

namespace napkin::passes {

// `work`, when given, is increased by the steps the pass takes (nodes and
// edges visited, members moved; not the upkeep of the labels that order its
// working list, O(log N) amortized per move): a deterministic measure for the
// tests that check the pass stays linear in the size of the graph.
std::unique_ptr<Pass> make_fuse_elementwise_pass(int64_t* work = nullptr);

// Group ids 0 .. n-1 in schedule order again (ir/fusion_group.h), after a
// pass that moved groups or made new ones.
void renumber_groups(ir::Graph& g);

}  // namespace napkin::passes
