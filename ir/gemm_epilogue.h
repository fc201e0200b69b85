// GEMM epilogues: the elementwise work a GEMM library applies to its result
// as it stores it, so the result never makes a round trip through memory.
//
// The form both backends run (cuBLASLt's epilogue and its C operand on
// CUDA, a per-panel loop on the CPU: codegen/plan.h Kernel::epilogue):
//
//     D = cast(acc + residual + bias)
//
//  - acc: a contraction's f32 result (matmul or einsum) whose last dim, n,
//    comes from its second input, a 2-D matrix (a weight), and whose other
//    dims all come from the first input, in order, in dims of that input that
//    merge into one (consecutive strides): so the GEMM is one plain
//    [rows, k] x [k, n] product and D is its [rows, n] result, row-major.
//  - residual (optional): a value of D's dtype and shape, contiguous,
//    added first (cuBLASLt adds C before the bias).
//  - bias (optional): an f32 vector of n elements, contiguous, broadcast over
//    the rows, added second.
//  - cast (optional, last): to bf16 or f16, where D is stored narrower than
//    the accumulator.
//  - gelu (optional, tanh form, after the adds): D = cast(gelu(acc +
//    residual + bias)), and aux = cast(acc + residual + bias) to D's dtype
//    may be stored besides (the input its gradient reads: cuBLASLt's
//    GELU_AUX; n a multiple of 8).
// Or the gelu's gradient (cuBLASLt's DGELU): D = cast(gelu_grad(f32(aux),
// acc)), aux that stored input (D's dtype, contiguous).
// At least one step. Each step reads the one before directly (not through
// a view), in this order; the adds may take acc on either side. D is
// narrower than f32 only in A's and B's own dtype (what the GEMM libraries
// store), the residual, bias and aux are not A or B, and a stored aux comes
// after D's cast (the kernel stores D first).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "ir/graph.h"

namespace napkin::ir {

enum class GemmActivation : uint8_t { None, Gelu, GeluGrad };

struct GemmEpilogue {
  NodeId contraction = kNoNode;
  std::vector<NodeId> steps;      // the epilogue's nodes, in order
  ValueId residual = kNoValue;    // the value added as C, or none
  ValueId bias = kNoValue;        // the [n] vector, or none
  GemmActivation activation = GemmActivation::None;
  // Gelu: the stored copy of its input, a second output (none if not
  // stored); GeluGrad: that stored input, read.
  ValueId aux = kNoValue;
  DType out = DType::F32;         // D's dtype
  ValueId result = kNoValue;      // D: the last step's result
};

// Whether `steps` (in order), the first reading `acc`, are the form above
// on the contraction's sums: acc is the contraction's f32 result, or (for a
// pass deciding to retype it) a widening cast of it. Checks the nodes only;
// the caller checks that no node outside them reads what they make (only D
// leaves the kernel).
std::optional<GemmEpilogue> match_gemm_epilogue(const Graph& g, NodeId contraction, ValueId acc,
                                                const std::vector<NodeId>& steps);

// Whether a contraction's result can be the acc of an epilogue (its dims and
// operands as above), whatever its dtype.
bool gemm_with_epilogue_shape(const Graph& g, const Node& contraction);

// A weight gradient's GEMM that also stores its bias gradient: the sums of
// its B operand over k, which the GEMM reads anyway (cuBLASLt's BGRADA; the
// CPU sums B's rows after the product). For y = x w + b the backward reads
// dy twice, dw = xᵀ dy and db = sum over the rows of dy; in one kernel dy is
// read once. The form:
//
//     D[m, n] = sum_k A[k.., m] B[k.., n]     (matmul or einsum)
//     g[n]    = reduce_sum(B, over the k dims)
//
//  - D: 2-D, f32, contiguous row-major (cuBLASLt stores the bias gradient
//    in D's type); m comes from A only, n from B only.
//  - k: every other dim of A and of B, the same ones in both, merging into
//    one stride in each (as a GEMM library takes them); A and B each with a
//    unit stride along one of their two GEMM dims.
//  - g: reduce_sum of B itself (the very value the contraction reads, a
//    view included) over exactly the k dims, not kept, into f32 [n].
struct GemmBiasGrad {
  NodeId contraction = kNoNode, reduction = kNoNode;
  ValueId b = kNoValue;       // what both read
  ValueId result = kNoValue;  // g
};
std::optional<GemmBiasGrad> match_gemm_bias_grad(const Graph& g, NodeId contraction, NodeId reduction);

}  // namespace napkin::ir
