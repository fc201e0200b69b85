// fp8-mixed: the contractions of the step read fp8-quantized operands with
// per-tensor scales, expressed as plain IR ops so that the interpreter
// emulates them exactly and a backend can recognize a scaled fp8 GEMM.
//
// It runs after autodiff, on the bf16-mixed training graph (the
// mixed-precision pass has made every contraction not kept in f32 a bf16 one).
// Quantization is not differentiated: the backward contractions are quantized
// themselves instead, as fp8 training recipes do (the gradient of a
// quantize-dequantize is taken as the identity; differentiating the amax
// would send gradient to one element and the VJP of the f8 cast would round
// gradients to E4M3).
//
// Terms:
//  - quantized contraction: a matmul or einsum (any phase) whose operands are
//    bf16. Contractions in f32 (fp32 overrides) are left alone.
//  - the format of an operand: E5M2 (f8e5m2: range for gradients) when the
//    operand is a gradient, that is its buffer is made by a backward-phase
//    node; E4M3 (f8e4m3: precision for activations and weights) otherwise.
//  - per-tensor scale of an operand x with format F (fmax = F's largest
//    finite value, 448 for E4M3, 57344 for E5M2), in f32:
//      amax = max |x|                       (reduce_max of abs, exact in bf16)
//      s    = amax / fmax,  or 1 when amax == 0
//  - quantize-dequantize: q = cast(f32(x) / s, F), x' = bf16(f32(q) · s);
//    the contraction reads x' in place of x. |x/s| <= fmax, so E4M3 never
//    overflows (it has no Inf; past 448 it would be NaN), and a tensor of tiny
//    values uses the format's full range instead of flushing to zero.
//    Versus a scaled fp8 GEMM (Σ q_a q_b in f32, times s_a s_b), the
//    difference is the bf16 rounding of q · s (relative 2^-9, below the f8
//    step of 2^-4 or 2^-3) and the order of summation.
//  - every node a quantization adds carries attr `amp` = kFp8CastReason (the
//    report's audit counts them apart) and has the phase, location, scope and origin
//    of its contraction and is scheduled just before it.
#pragma once

#include <memory>

#include "passes/pass.h"

namespace napkin::passes {

std::unique_ptr<Pass> make_fp8_scaling_pass();

inline constexpr const char* kFp8CastReason = "fp8 scaling";

}  // namespace napkin::passes
