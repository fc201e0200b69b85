// One matmul as both GEMM back ends take it: row-major semantics,
// C[batch.., m, n] = sum_k A[batch.., m, k] B[batch.., k, n], with element
// strides for every dim (analysis/contraction.h lowers contractions to it).
// Its own file so that a CUDA trainer, which runs matmuls on cuBLASLt
// (runtime/cuda/cublaslt_matmul.h), does not link the CPU GEMM and oneDNN.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace napkin::runtime {

struct MatmulDesc {
  std::vector<int64_t> batch;  // batch dim sizes, outermost first (may be empty)
  std::vector<int64_t> a_batch_stride, b_batch_stride, c_batch_stride;  // one per batch dim; 0 = broadcast
  int64_t m = 0, n = 0, k = 0;
  int64_t a_m_stride = 0, a_k_stride = 1;  // one of them is 1 (or its dim has size 1)
  int64_t b_k_stride = 0, b_n_stride = 1;  // one of them is 1 (or its dim has size 1)
  int64_t c_m_stride = 0;                  // C's n stride is 1

  // A contiguous row-major (non-batched) C = op(A) op(B) with A m x k
  // (or k x m when trans_a) and B k x n (or n x k when trans_b).
  static MatmulDesc plain(int64_t m, int64_t n, int64_t k, bool trans_a = false, bool trans_b = false);
  std::string to_string() const;  // "[2x3] 8x16x4 A(ldm..." for messages and benches

  // Throws Error ("matmul DESC: what") unless there is one a, b and c stride
  // per batch dim and no size is negative: what every back end checks first.
  void check_sizes() const;

  // One batch dim: its size and its stride in A, B and C.
  struct BatchDim {
    int64_t size = 1, a = 0, b = 0, c = 0;
  };
  // The batch dims without the size-1 ones, and neighbours merged where all
  // three strides allow (the outer stride is the inner stride times the inner
  // size), outermost first: the fewest loops over the batch entries.
  std::vector<BatchDim> merged_batch() const;
  bool operator==(const MatmulDesc&) const = default;
};

}  // namespace napkin::runtime
