// Contractions (matmul, einsum) as GEMM calls: whether the GEMM library
// takes one (which makes its kernel a Gemm, analysis/step_kernels.h) and how.
//
// Every contraction is a loop over axis ids; each id has a size and a stride
// in A, B and the output C (0 where it does not occur). An id in A, B and C is
// a batch axis; in A and C an M axis; in B and C an N axis; in A and B only a
// K axis (summed). A GEMM library computes
//     C[batch.., m, n] = sum_k A[batch.., m, k] B[batch.., k, n]
// with one stride per batch axis and 2-D matrices that have a unit stride in
// one of their two dims (a transposed or plain BLAS matrix). So the M ids must
// merge into one dim of A and of C (consecutive strides), and likewise N in
// B and C and K in A and B. M (or N) ids that do not merge become batch axes
// with stride 0 in B (or A); K ids that do not merge, or ids that occur in
// only one input, make the contraction a ContractionLoops kernel instead (generated code).
// When C's unit stride belongs to M rather than N, A and B trade places:
// C^T = B^T A^T.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "ir/dtype.h"
#include "ir/graph.h"

namespace napkin::analysis {

// The same fields as runtime::MatmulDesc (runtime/gemm.h): the runtime knows
// nothing of the compiler, so the kernel plan carries its own copy.
struct MatmulLowering {
  bool swap_operands = false;  // A is the node's second input
  std::vector<int64_t> batch;
  std::vector<int64_t> a_batch_stride, b_batch_stride, c_batch_stride;
  int64_t m = 1, n = 1, k = 1;
  int64_t a_m_stride = 0, a_k_stride = 1;
  int64_t b_k_stride = 0, b_n_stride = 1;
  int64_t c_m_stride = 0;
};

// One loop axis of a contraction: its size and its stride in each operand.
struct ContractionAxis {
  int64_t size = 1;
  int64_t a = 0, b = 0, c = 0;
};

// The axes of contraction n storing its result in `out`: n's output, or the
// value a GEMM epilogue stores (ir/gemm_epilogue.h), of the same shape.
// Each operand is read with its layout's strides.
std::vector<ContractionAxis> contraction_axes(const ir::Graph& g, const ir::Node& n, ir::ValueId out);

// The GEMM form of the contraction, or nullopt when it has none (see above).
std::optional<MatmulLowering> lower_to_gemm(const std::vector<ContractionAxis>& axes);

// Whether the GEMM library (runtime/gemm.h) takes these element types: A and
// B one float type, C the same or, for bf16/f16 (fp32 accumulation), f32.
// Integer and fp8 contractions become loop kernels. A float contraction with
// A and B of different types is an internal error: the graph casts both
// inputs of a contraction to one dtype (mixed precision included).
bool gemm_takes(ir::DType a, ir::DType b, ir::DType c);

}  // namespace napkin::analysis
