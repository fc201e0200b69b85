// Matmul epilogues: work on a contraction's result that the contraction can
// do as it stores, instead of a kernel of its own. So far one: the widening
// cast of a bf16 result to f32 (f16 results keep PyTorch AMP's rounding to
// f16, which fp16-mixed's loss scaling and its overflow checks are designed
// around),
//
//   y = cast(einsum(a, b), f32)   ->   y = einsum(a, b, dtype=f32)
//
// when the cast is the result's only reader (besides reductions that widen
// it as they load, which then read the f32 sums) and would be a kernel of its
// own (no reader of y is an elementwise op of the cast's phase, which fusion
// would merge the cast into, reading the narrow result). The GEMM then stores
// its f32 sums instead of rounding them to bf16 for the cast to widen: 4
// bytes written per element instead of 2 + 2 read + 4 written, one kernel
// less, and the value is the unrounded sum (Megatron's f32 weight-gradient
// GEMM). Under bf16-mixed that is every weight gradient (the cast of the
// bf16 parameter copy differentiates into a cast to f32); a layernorm's
// input gradient is read in bf16 by the norm's gradient instead
// (passes/sink_casts.h rule 6), so no widening cast is left after its GEMM.
//
// Runs after autodiff (it changes values: the interpreter, the report and
// the backends all read the new dtype), before the optimizer pass.
#pragma once

#include <memory>

#include "passes/pass.h"

namespace napkin::passes {

// `placement` counts the epilogues.
std::unique_ptr<Pass> make_matmul_epilogues_pass(CastPlacement& placement);

// The rewrite itself, for this pass and passes/fuse_gemm_epilogues.h: the
// contraction accumulates into its result as f32 (`dtype=f32`) and every use
// of `widening_cast`, a cast of that result to f32, becomes a use of the
// result (which takes the cast's name if it had none). The cast is left
// without readers, for the caller or dce to erase.
void accumulate_in_f32(ir::Graph& g, ir::NodeId contraction, ir::NodeId widening_cast);

}  // namespace napkin::passes
