// Cast sinking: the precision policy's casts moved to where they store the
// fewest bytes, by rewrites that give every value the same bits as before.
//
// A cast is elementwise and data movement (views, concat) only moves
// elements, so the two commute; and a float widened exactly (bf16 -> f32)
// and narrowed back is itself. Six rewrites use that:
//
//  1. cast before views: a value v whose every reader is a cast to one dtype
//     T through views of v,
//         y_i = cast(view_i(v), T)   ->   c = cast(v, T);  y_i = view_i(c)
//     so v is read once, by a cast placed right after v's producer (which
//     fusion then merges into that producer's kernel: v is never stored, c
//     is). GPT's fused qkv: q, k and v were each cast from a strided view
//     of the f32 qkv; now the qkv kernel stores bf16 and the attention
//     reads its q, k, v views. Only where every reader of a y_i takes
//     strided operands (attention, matmuls, elementwise ops).
//  2. cast after concat: a concat of casts of one dtype S to T, each read
//     only by the concat (through views),
//         concat(view_i(cast(a_i, T)))   ->   cast(concat(view_i(a_i)), T)
//     concatenates the narrower values. The attention gradient: dq, dk, dv
//     (bf16) are concatenated in bf16, not widened first.
//  3. round trips: a cast back to x's dtype of an exact widening of x,
//         cast(view(cast(x, T)), dtype(x))   ->   view(x)
//     The gradient of the qkv matmul's bf16 operand is then the bf16 concat
//     itself.
//  4. reductions of widened values,
//         reduce(view(cast(y, f32)))   ->   reduce(view(y), dtype=f32)
//     read the narrow y and widen each element as they load it (the bias
//     gradients of a bf16 matmul's output). The cast is left to its other
//     readers, if any.
//  5. a norm whose only reader casts it,
//         cast(layernorm(x, g, b), T)   ->   layernorm(x, g, b, dtype=T)
//     (rmsnorm too) computes as before and rounds once as it stores, so its
//     f32 result is never written (the matmul input after each layernorm).
//  6. a norm's gradient of a widened dy,
//         layernorm_grad(x, g, cast(y, f32))   ->   layernorm_grad(x, g, y)
//     (rmsnorm_grad too; y bf16 or f16) reads the narrow y and widens each
//     element as it loads it: the bf16 GEMM result that is the gradient of
//     the norm's output (the input gradient of the matmul after each norm)
//     is stored and read in bf16, as the precision policy rounds it, and
//     matmul_epilogues finds no widening cast to make it store f32.
//
// Runs after autodiff and fold_concat_copy, before the optimizer pass and
// fusion; a later dce drops the casts and views it replaced. Every value has
// the bits the policy's casts give it (tests/unit/sink_casts_test.cpp
// compares steps with matmul_epilogues off); with matmul_epilogues on, rule 6
// keeps the policy's bf16 rounding of the dy it reads where that pass would
// otherwise have made the GEMM store its f32 sums.
#pragma once

#include <memory>

#include "passes/pass.h"

namespace napkin::passes {

// `placement` counts the rewrites by rule.
std::unique_ptr<Pass> make_sink_casts_pass(CastPlacement& placement);

}  // namespace napkin::passes
