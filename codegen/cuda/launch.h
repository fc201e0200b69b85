// What the CUDA kernel emitters (codegen/cuda/emit.h) make and
// emit_cuda_source (codegen/cuda/kernel_source.h) collects: a function's
// launch, and where a fused classifier's chunks sit. Apart from both so the
// emitters do not include the source that includes them.
#pragma once

#include <cstdint>

#include "runtime/kernel_spec.h"

namespace napkin::codegen::cuda {

// One launch of an extern "C" __global__ function (blocks, threads per
// block, dynamic shared memory, the `off` values): what the program carries.
using CudaLaunch = runtime::CudaLaunchSpec;

// How a Classifier plan kernel runs on the GPU (codegen/cuda/classifier.cpp):
// the vocabulary in `chunks` chunks of `chunk` classes (the last may be
// shorter), each chunk's GEMMs on cuBLASLt between the launches; where its
// buffers sit in the scratch buffer (byte offsets): the chunk's logits (then
// its gradient) [rows, chunk] in x's type, the per-row running state, and
// (backward, 16-bit x) dx's f32 sums [rows, d] (-1: dx accumulates in place).
struct CudaClassifierLayout {
  int64_t rows = 0, vocab = 0, d = 0;
  int64_t chunk = 0, chunks = 0;
  int64_t logits = 0, state = 0, dx_acc = -1;
  int64_t scratch_bytes = 0;
};

}  // namespace napkin::codegen::cuda
