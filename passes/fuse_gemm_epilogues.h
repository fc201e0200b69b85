// GEMM epilogue fusion: a contraction joins the fusion group that consumes
// its result when that group is an epilogue a GEMM library applies as it
// stores (ir/gemm_epilogue.h: D = cast(acc + residual + bias)). The
// contraction becomes the group's first member and its result an internal
// value: never stored. The kernel plan makes such a group one Gemm kernel
// with an epilogue (codegen/plan.h Kernel::epilogue).
//
//   y = cast(x @ w, f32) + b -> cast bf16      (the qkv projection)
//   x = x + cast(y @ w, f32) + b               (a residual projection)
//
// Under bf16-mixed the contraction's bf16 result is read by a widening cast
// first; the pass makes the contraction accumulate into its f32 result
// directly (as passes/matmul_epilogues.h does for a cast alone) and drops the
// cast, so the epilogue adds to the unrounded sums: a value that was rounded
// to bf16 and widened back is now exact (what cuBLASLt's epilogue computes).
// Only where every step is the form and only D is read outside the group.
//
// Runs after fuse_elementwise (it reads the groups that pass formed) and
// keeps the invariants of ir/fusion_group.h: the contraction moves to right
// before the group's first member (nothing between reads its result), and
// group ids are renumbered in schedule order.
#pragma once

#include <memory>

#include "passes/pass.h"

namespace napkin::passes {

struct Rematerialized;  // passes/rematerialize.h

// `rematerialized`, what passes/rematerialize.h did, is corrected for the
// recomputations the pass replaces by a stored gelu input (their FLOPs come
// off, the count goes up).
std::unique_ptr<Pass> make_fuse_gemm_epilogues_pass(Rematerialized& rematerialized);

// The reason (passes/mixed_precision.h kAmpCastAttr) on the cast that stores
// a gelu's input in bf16 for its gradient.
inline constexpr const char* kGeluInputCastReason = "gelu input for its gradient";

}  // namespace napkin::passes
