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
// Low precision: A and B both bf16 (or both f16), products summed in fp32, C
// bf16/f16 (rounded to nearest even once, at the end) or fp32. Same split as
// fp32; each work item is one of two kernels:
//   primitive   oneDNN's matmul primitive (bf16 only: brgemm with
//               AVX512_BF16 dot products), one per distinct panel shape,
//               created at start-up (prepare) single-threaded and run in the
//               pool's chunks like sgemm, with a per-thread scratchpad.
//   f32 panels  the item's A rows and B columns widened to fp32 (exact) in
//               per-thread scratch, then sgemm, then C narrowed. Any layout,
//               any low dtype: f16 (oneDNN has no f16 matmul without
//               AVX512_FP16), and bf16 where the primitive has no fast kernel
//               for the strides (it falls back to a reference loop) or
//               measured slower (bench/README.md, "bf16").
//
// Link: -ldnnl -lpthread (CMake: target napkin_runtime carries them; packages
// libdnnl-dev, which brings libgomp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/tensor_types.h"
#include "runtime/matmul_desc.h"
#include "runtime/thread_pool.h"

namespace napkin::runtime {

// Sets OpenMP's thread count to 1 on the calling thread, once per thread:
// each of napkin's pool threads calls oneDNN's sgemm single-threaded
// (gemm.cpp says why). Gemm and the attention kernel's tile products call it.
void make_openmp_serial();

// Element types a Gemm takes: A and B share one, C has its own (fp32 or the
// same as A and B).
enum class GemmType : uint8_t { F32, F64, BF16, F16 };
GemmType gemm_type(DType dtype);  // f32, f64, bf16, f16; throws Error for others
const char* gemm_type_name(GemmType t);
size_t gemm_type_bytes(GemmType t);  // bytes per element: 8, 4 or 2
struct GemmTypes {
  GemmType ab = GemmType::F32, c = GemmType::F32;
};
// How bf16 items run (f16 always takes f32 panels). Auto is the measured
// choice; benches and tests force one to compare them.
enum class LowPrecisionKernel : uint8_t { Auto, Primitive, F32Panels };


// What a Gemm built for an epilogue calls on each panel of rows it has
// computed: rows [r0, r1) of the product as f32 sums, n floats a row, row r0
// first, in the calling thread's scratch (valid until the call returns).
struct RowsEpilogue {
  void (*fn)(void* ctx, int64_t r0, int64_t r1, const float* sums) = nullptr;
  void* ctx = nullptr;
};

class Gemm {
 public:
  // Validates the descriptor and the types (throws runtime::Error naming the
  // problem) and precomputes the BLAS call and the work split.
  // epilogue_panels: run only by run_with_epilogue (f32 C, one batch entry,
  // rows of C n apart): the split is panels of whole rows small enough that
  // their sums stay in cache for the epilogue.
  explicit Gemm(MatmulDesc desc, GemmTypes types = {}, LowPrecisionKernel kernel = LowPrecisionKernel::Auto,
                bool epilogue_panels = false);
  ~Gemm();
  Gemm(Gemm&&) noexcept;

  // Creates the oneDNN primitives the work items of a run on `threads`
  // threads need (bf16 only; a no-op otherwise). run() does it on the calling
  // thread when it meets a thread count not prepared yet; the executor
  // prepares at start-up so that no step pays for it.
  void prepare(int threads) const;

  // Operands of the constructed types (a, b: GemmTypes::ab; c: GemmTypes::c).
  void run(const void* a, const void* b, void* c, ThreadPool& pool) const;
  void run(const void* a, const void* b, void* c) const;  // on the calling thread only
  // The product a panel of rows at a time, each panel's sums handed to
  // `epilogue` (called on the thread that computed them) and never stored.
  void run_with_epilogue(const void* a, const void* b, const RowsEpilogue& epilogue, ThreadPool& pool) const;
  // Typed shorthands; the Gemm must have been built for that type.
  void run(const float* a, const float* b, float* c, ThreadPool& pool) const;
  void run(const double* a, const double* b, double* c, ThreadPool& pool) const;
  void run(const float* a, const float* b, float* c) const;
  void run(const double* a, const double* b, double* c) const;

  const MatmulDesc& desc() const { return d_; }
  GemmTypes types() const { return types_; }
  // Whether bf16 work items of a run on `threads` threads use the oneDNN
  // primitive (false: f32 panels). For benches and tests.
  bool uses_primitive(int threads) const;
  int64_t batch_count() const { return batch_count_; }
  double flops() const { return 2.0 * double(batch_count_) * double(d_.m) * double(d_.n) * double(d_.k); }

 private:
  struct Split {
    int64_t parts = 1;     // panels per batch entry
    int64_t panel = 0;     // rows (split_m) or columns of C per panel
    bool split_m = true;
  };
  struct Panel {  // the part of C one work item writes: rows [r0, r1) x columns [c0, c1)
    int64_t r0, r1, c0, c1;
  };
  struct Primitives;  // oneDNN objects (gemm.cpp)
  struct Run;         // one run's operands and split (gemm.cpp)

  void run_any(const void* a, const void* b, void* c, ThreadPool* pool, const RowsEpilogue* epilogue) const;
  void run_panel(const Run& r, int64_t p, const char* A, const char* B, char* Cp, const Panel& pn) const;
  int threads_for(ThreadPool* pool) const;
  Split split_for(int threads) const;
  Panel panel_of(const Split& s, int64_t p) const;
  void run_items(const Run& r, int64_t begin, int64_t end) const;
  template <class T>
  void blas_item(const T* A, const T* B, T* Cp, const Panel& p) const;
  // Cp: the panel's first element of C (or of an epilogue's sums), rows ldc_ apart.
  void panels_item(const void* A, const void* B, void* Cp, const Panel& p) const;
  void batch_offsets(int64_t index, int64_t* oa, int64_t* ob, int64_t* oc) const;

  MatmulDesc d_;
  GemmTypes types_;
  LowPrecisionKernel kernel_ = LowPrecisionKernel::Auto;
  bool epilogue_panels_ = false;
  std::unique_ptr<Primitives> prims_;  // bf16 only
  std::vector<MatmulDesc::BatchDim> batch_;  // MatmulDesc::merged_batch
  int64_t batch_count_ = 1;
  bool trans_a_ = false, trans_b_ = false;
  bool a_direct_ = true, b_direct_ = true;  // false: strides BLAS cannot take, packed per call
  int64_t lda_ = 1, ldb_ = 1, ldc_ = 1;
  // Work items of a run: batch_count_ * parts, item i = (batch entry i / parts,
  // panel i % parts), cut into the pool's contiguous chunks.
};

// sums[j] = sum over k of B[k, j], for j in [0, n), with B as `d` describes
// it (one batch entry; batch strides ignored) in `type` (bf16 and f16 widen
// exactly as they load), summed in double and rounded to f32 once: the bias
// gradient a weight gradient's GEMM stores besides C (runtime/program.h
// MatmulSpec::bias_grad; cuBLASLt's BGRADA on the GPU). The columns are split
// across the pool, each summed in k order: the same bits for any thread count.
void sum_b_over_k(const MatmulDesc& d, GemmType type, const void* b, float* sums, ThreadPool& pool);

}  // namespace napkin::runtime
