// A fused classifier kernel of a CUDA program (runtime/classifier.h has the
// math, codegen/cuda/classifier.cpp the row kernels and the scratch layout):
// its chunk GEMMs on cuBLASLt, interleaved with the kernel's launches.
//
//   forward   for each chunk c: logits (scratch) = x w_cᵀ; launch c.
//             Then the last launch (lse and the loss).
//   backward  for each chunk c: logits = x w_cᵀ; launch c (logits -> g in
//             place); dw_c = gᵀ x; dx (+)= g w_c, into dx itself for f32 and
//             f64 x, else into f32 sums in scratch that the last launch
//             rounds into dx.
//
// x is [rows, d] with rows x_row_stride apart; w [vocab, d] by its two
// strides; dw is contiguous [vocab, d]; the chunk's logits are [rows, chunk]
// with row stride `chunk` (the last chunk is narrower, same stride). GEMMs
// read and write x's type (f32 sums for dx of 16-bit x), accumulate in f32
// (f64 for f64), and follow the program's tf32 flag. Every GEMM is built
// (and its algorithm chosen) once, so enqueue() only launches and can be
// captured in a CUDA graph.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/cuda/cublaslt_matmul.h"
#include "runtime/program.h"

namespace napkin::runtime::cuda {

// The GEMMs of a classifier kernel as napkin matmul specs (row-major; byte
// offsets in the arena, or in scratch where LtPlacement says), per chunk.
// Pure: the tests check them without a GPU.
struct ClassifierGemms {
  struct Chunk {
    MatmulSpec logits;  // x [rows, d] · w_cᵀ [d, n] -> scratch logits [rows, n]
    MatmulSpec dw;      // gᵀ [n, rows] · x [rows, d] -> dw rows [n, d] (backward)
    MatmulSpec dx;      // g [rows, n] · w_c [n, d] -> dx or its sums [rows, d] (backward)
  };
  std::vector<Chunk> chunks;
  bool dx_in_scratch = false;  // dx's f32 sums in scratch (else dx itself)
};
// Throws Error naming `kernel` when the spec is inconsistent (no CUDA
// layout, launches of the wrong count).
ClassifierGemms classifier_gemms(const KernelSpec& kernel);

class CudaClassifier {
 public:
  CudaClassifier(const LtContext& ctx, const KernelSpec& kernel, bool tf32, CUdeviceptr arena, CUdeviceptr scratch);
  // Enqueues the kernel on `stream`; launch(j) enqueues the kernel's launch j.
  void enqueue(CUstream stream, const std::function<void(int)>& launch) const;

 private:
  struct Chunk {
    std::unique_ptr<LtMatmul> logits, dw, dx;
  };
  std::vector<Chunk> chunks_;
  int launches_ = 0;
};

}  // namespace napkin::runtime::cuda
