// The runtime's matmul: every matmul and einsum contraction of a generated
// trainer is one Gemm, described once at start-up (shapes and strides are
// static) and run every step.
//
//   C[batch..., m, n] = sum_k A[batch..., m, k] * B[batch..., k, n]
//
// C is overwritten, never accumulated into; k == 0 gives C = 0. All strides
// are in elements. A and B may each be transposed (whichever of their two
// matrix strides is 1 is the contiguous one), batch dims may broadcast
// (stride 0) and need not collapse into one uniform stride (attention's q,
// k, v viewed inside a fused qkv buffer: batch dims (b, h), strides
// (T*3*d, head_dim)). C's n stride is 1.
//
// Implementation (chosen by measurement, bench/gemm_peak.cpp; numbers in
// bench/README.md): fp32 is oneDNN's dnnl_sgemm, single-threaded, called from
// the chunks of napkin's ThreadPool: a batch is split across the workers, a
// single matrix (or a batch that does not divide evenly) into row or column
// panels. All of the trainer's parallelism then comes from the one pool;
// oneDNN's OpenMP threads never start (each pool thread sets OpenMP's
// per-thread thread count to 1 before its first sgemm). fp64 is a plain loop
// on the same split (f64 trainers are for checking, not speed). Splits depend
// only on the shape and the pool size, so results are bit-identical run to
// run for a given thread count. Matmuls under ~250 kFLOP run inline.
//
// Link: -ldnnl -lpthread (CMake: target napkin_runtime carries them; packages
// libdnnl-dev, which brings libgomp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/thread_pool.h"

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
};

class Gemm {
 public:
  // Validates the descriptor (throws runtime::Error naming the problem) and
  // precomputes the BLAS call and the work split.
  explicit Gemm(MatmulDesc desc);

  void run(const float* a, const float* b, float* c, ThreadPool& pool) const;
  void run(const double* a, const double* b, double* c, ThreadPool& pool) const;
  // Same, on the calling thread only.
  void run(const float* a, const float* b, float* c) const;
  void run(const double* a, const double* b, double* c) const;

  const MatmulDesc& desc() const { return d_; }
  int64_t batch_count() const { return batch_count_; }
  double flops() const { return 2.0 * double(batch_count_) * double(d_.m) * double(d_.n) * double(d_.k); }

 private:
  template <class T>
  void run_t(const T* a, const T* b, T* c, ThreadPool* pool) const;
  struct Split {
    int64_t parts = 1;     // panels per batch entry
    int64_t panel = 0;     // rows (split_m) or columns of C per panel
    bool split_m = true;
  };
  Split split_for(int threads) const;
  template <class T>
  void run_items(const T* a, const T* b, T* c, const Split& s, int64_t begin, int64_t end) const;
  void batch_offsets(int64_t index, int64_t* oa, int64_t* ob, int64_t* oc) const;

  MatmulDesc d_;
  // Batch dims after dropping size-1 dims and merging collapsible neighbours.
  std::vector<int64_t> bsize_, bsa_, bsb_, bsc_;
  int64_t batch_count_ = 1;
  bool trans_a_ = false, trans_b_ = false;
  bool a_direct_ = true, b_direct_ = true;  // false: strides BLAS cannot take, packed per call
  int64_t lda_ = 1, ldb_ = 1, ldc_ = 1;
  // Work items of a run: batch_count_ * parts, item i = (batch entry i / parts,
  // panel i % parts), cut into the pool's contiguous chunks.
};

}  // namespace napkin::runtime
