// A matmul kernel of a CUDA program on cuBLASLt.
//
// napkin describes a matmul row-major (runtime/gemm.h):
//   C[batch..., m, n] = sum_k A[batch..., m, k] * B[batch..., k, n]
// cuBLASLt is column-major. A row-major C (m x n, row stride c_m) is, byte
// for byte, the column-major n x m matrix C^T with leading dimension c_m, and
// C^T = B^T A^T, so cuBLASLt computes
//   D (n x m) = op(Lt A) (n x k) * op(Lt B) (k x m)
// with Lt A = napkin's B, Lt B = napkin's A, D = napkin's C (beta = 0, so C
// is overwritten, never read).
//
// A weight gradient's GEMM that stores its bias gradient (MatmulSpec::
// bias_grad, napkin's B summed over k): CUBLASLT_EPILOGUE_BGRADA, which sums
// Lt A (napkin's B) over k into one f32 element per row of D (napkin's n);
// where the heuristic has no algorithm for it, the product alone and a second
// GEMM, ones[1, k] x B, into the same vector (a note on stderr says so).
//
// A GEMM epilogue (runtime/program.h GemmEpilogueSpec, D = cast(A B +
// residual + bias)): D is the epilogue's output in its dtype, the residual
// is cuBLASLt's C (beta = 1, a separate pointer with D's layout, or D itself
// when the plan writes D in place of it), the f32 bias is
// CUBLASLT_EPILOGUE_BIAS's vector (cuBLASLt's rows of D are napkin's n).
//
// Terms:
//  - stored operand: the matrix as cuBLASLt stores it, rows x cols
//    column-major with leading dimension ld >= rows (columns may not
//    overlap). A napkin matrix X (r x c, strides rs, cs) whose columns are
//    contiguous (cs == 1) is X^T stored c x r with ld = rs, op N; one whose
//    rows are contiguous (rs == 1) is X stored r x c with ld = cs, op T. A
//    dim of size 1 has no meaningful stride, so only the other dim decides.
//    A matrix with neither stride 1 is rejected (Error): cuBLASLt has no
//    general strides and the plan gives the CUDA backend none.
//  - strided batch: one batch dim (after dropping size-1 dims and merging
//    neighbours that collapse into one stride, as runtime/gemm.cpp does),
//    the largest (the innermost among equals), goes to cuBLASLt as
//    BATCH_COUNT with each operand's STRIDED_BATCH_OFFSET (0 broadcasts A
//    or B; C never broadcasts). The other batch dims are calls: one
//    cublasLtMatmul per entry, at its own element offsets.
//  - types: napkin's dtype names to cuBLASLt's: f32 (compute 32F, or
//    32F_FAST_TF32 with the program's tf32 flag), f64 (64F), bf16 and f16
//    (fp32 accumulation, C in the same type or f32), fp8 (f8e4m3 x f8e4m3,
//    f8e4m3 x f8e5m2, f8e5m2 x f8e4m3; fp32 accumulation; C bf16, f16 or
//    f32; per-tensor A and B scales as device pointers to float). cuBLASLt's
//    fp8 kernels on Hopper take only the "TN" layout: op(Lt A) = T and
//    op(Lt B) = N, that is napkin's A and B both contiguous along k, with
//    m, n, k and the leading dimensions multiples of 16.
//
// lt_shape, lt_types, check_fp8_layout and pointer_alignment are pure (no
// library, no GPU) so that the tests can check the mapping exhaustively on
// the host; LtDescriptors needs only the cuBLASLt library; LtMatmul a GPU.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/cuda/cuda_driver.h"
#include "runtime/program.h"

namespace napkin::runtime::cuda {

struct LtOperand {
  bool transpose = false;      // op T (else N)
  int64_t rows = 0, cols = 0;  // as stored
  int64_t ld = 0;              // elements between columns as stored
  int64_t batch_stride = 0;    // elements between strided-batch entries
};

// Element offsets of napkin's A, B and C for one cublasLtMatmul call.
struct LtCall {
  int64_t a = 0, b = 0, c = 0;
};

struct LtShape {
  int64_t m = 0, n = 0, k = 0;  // cuBLASLt's: D is m x n (napkin's n x m)
  LtOperand a, b, d;            // Lt A = napkin's B, Lt B = napkin's A, D = napkin's C (op N)
  int64_t batch_count = 1;      // strided batch entries per call
  std::vector<LtCall> calls;    // empty when C has no elements
};

// Throws Error("matmul <desc>: ...") for a descriptor cuBLASLt cannot take.
LtShape lt_shape(const MatmulDesc& desc);

struct LtTypes {
  cudaDataType_t a = CUDA_R_32F, b = CUDA_R_32F, c = CUDA_R_32F;  // napkin's A, B, C
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  cudaDataType_t scale = CUDA_R_32F;  // alpha and beta
  bool fp8 = false;
};

// Throws Error("no cuBLASLt matmul of A by B into C") for other mixes.
LtTypes lt_types(DType a_dtype, DType b_dtype, DType c_dtype, bool tf32);
int64_t lt_type_bytes(cudaDataType_t t);

// Throws Error naming `kernel` when an fp8 matmul is not in the TN layout
// with dims and leading dimensions multiples of 16.
void check_fp8_layout(const LtShape& s, const std::string& kernel);

// The largest power of two up to 256 dividing every byte offset (cuBLASLt's
// MIN_ALIGNMENT preferences: heuristics must not pick a kernel that needs
// more alignment than the pointers have; cuMemAlloc gives 256).
uint32_t pointer_alignment(const std::vector<int64_t>& byte_offsets);

// A cuBLASLt epilogue: the kind (CUBLASLT_EPILOGUE_*), the f32 bias (one
// element per element of napkin's n, cuBLASLt's rows of D; 0: none) and the
// gelu's input (aux: stored by GELU_AUX, read by DGELU; D's type, aux_ld
// elements between columns as stored; 0: none).
struct LtEpilogue {
  cublasLtEpilogue_t kind = CUBLASLT_EPILOGUE_DEFAULT;
  CUdeviceptr bias = 0, aux = 0;
  int64_t aux_ld = 0;
};

// The epilogue of a MatmulSpec's GemmEpilogueSpec with its pointers in
// `arena`. Throws Error for a combination cuBLASLt has no epilogue for.
LtEpilogue lt_epilogue(const GemmEpilogueSpec& e, int64_t n, CUdeviceptr arena);

// The descriptors of one matmul: the operation, the three layouts (C's
// serves as D too) and the heuristic's preferences. Host objects only.
class LtDescriptors {
 public:
  // alignments: of napkin's A, B and C pointers, in bytes. fp8: a_scale and
  // b_scale are device pointers to napkin's A and B scales (float).
  LtDescriptors(const CublasLt& lt, const LtShape& s, const LtTypes& t, uint64_t workspace_bytes, uint32_t a_align,
                uint32_t b_align, uint32_t c_align, CUdeviceptr a_scale = 0, CUdeviceptr b_scale = 0,
                const LtEpilogue& epilogue = {});
  ~LtDescriptors();
  LtDescriptors(const LtDescriptors&) = delete;
  LtDescriptors& operator=(const LtDescriptors&) = delete;

  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t lt_a = nullptr, lt_b = nullptr, d = nullptr;  // Lt A (napkin's B), Lt B (napkin's A), C = D
  cublasLtMatmulPreference_t preference = nullptr;

 private:
  const CublasLt& lt_;
  void release() noexcept;
};

// What every matmul of an engine shares.
struct LtContext {
  const CudaDriver& driver;
  const CublasLt& lt;
  cublasLtHandle_t handle;
  CUdeviceptr workspace;
  uint64_t workspace_bytes;
};

// The device buffers that a MatmulSpec's byte offsets of A, B and C are in
// (each 256-byte aligned, as cuMemAlloc gives), and whether C accumulates:
// C = A B + C (beta = 1) instead of C = A B.
struct LtPlacement {
  CUdeviceptr a = 0, b = 0, c = 0;
  bool accumulate = false;
};

// Device memory a matmul owns (cuMemAlloc'd, freed when it goes).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const CudaDriver& driver, size_t bytes);
  DeviceBuffer(DeviceBuffer&& other) noexcept { *this = std::move(other); }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  ~DeviceBuffer();
  CUdeviceptr get() const { return pointer_; }

 private:
  const CudaDriver* driver_ = nullptr;
  CUdeviceptr pointer_ = 0;
};

// One matmul kernel, its algorithm chosen once (cublasLtMatmulAlgoGetHeuristic)
// at construction. enqueue() only launches, so it can be captured in a CUDA
// graph: cuBLASLt allocates nothing when given the workspace.
class LtMatmul {
 public:
  // `kernel`: the kernel's name, for messages. `arena`: the device arena the
  // spec's byte offsets are in. fp8 needs a_scale and b_scale (device
  // pointers to float; the plan has none for CUDA programs yet).
  LtMatmul(const LtContext& ctx, const MatmulSpec& spec, bool tf32, const std::string& kernel, CUdeviceptr arena,
           CUdeviceptr a_scale = 0, CUdeviceptr b_scale = 0);
  // The same with each operand in its own buffer, C accumulating or not
  // (the fused classifier's GEMMs: runtime/cuda/cuda_classifier.h).
  LtMatmul(const LtContext& ctx, const MatmulSpec& spec, bool tf32, const std::string& kernel, LtPlacement where);
  LtMatmul(const LtMatmul&) = delete;
  LtMatmul& operator=(const LtMatmul&) = delete;
  void enqueue(CUstream stream) const;

 private:
  LtMatmul(const LtContext& ctx, const MatmulSpec& spec, bool tf32, const std::string& kernel, LtPlacement where,
           CUdeviceptr a_scale, CUdeviceptr b_scale);
  // The bias gradient as a GEMM of its own, ones[1, k] x B, where cuBLASLt
  // has no BGRADA algorithm for the product (the same sums, B read twice).
  void add_bias_grad_gemm(const MatmulSpec& spec, const std::string& kernel, LtPlacement where);
  DeviceBuffer ones_;  // k ones in B's type (before the GEMM that reads it: destroyed after it)
  std::unique_ptr<LtMatmul> bias_grad_gemm_;
  LtContext ctx_;
  LtShape shape_;
  LtTypes types_;
  CUdeviceptr a_ = 0, b_ = 0, c_ = 0;  // napkin's operands' first elements
  CUdeviceptr c_in_ = 0;                // what cuBLASLt reads as C: c_, or an epilogue's residual
  std::unique_ptr<LtDescriptors> desc_;
  cublasLtMatmulAlgo_t algo_{};
  float alpha32_ = 1, beta32_ = 0;
  double alpha64_ = 1, beta64_ = 0;
  bool accumulate_ = false;
};

}  // namespace napkin::runtime::cuda
