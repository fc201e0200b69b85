// `napkin build --target cuda`: a training graph -> a standalone GPU trainer
// executable. The steps, in order (each timed for --time-passes): kernel
// plan, CUDA C (codegen/cuda/kernel_source.h), NVRTC (cubin + PTX,
// codegen/cuda/nvrtc_compile.h; cached), program description with its CUDA
// fields (codegen/cuda/program_cuda.h), data object (program, cubin and PTX
// as exported arrays, codegen/host/data_object.h), link with the CUDA runtime
// and its trainer main (runtime/cuda).
//
// Building needs no GPU: the trainer finds one when it runs, loads the cubin
// if the GPU is of `arch`, else JIT-compiles the PTX.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "codegen/cuda/kernel_source.h"
#include "codegen/host/build_result.h"
#include "ir/graph.h"

namespace napkin::codegen::cuda {

struct CudaBuildOptions {
  std::string output;          // the executable
  std::string model_hash;      // written into the program; checkpoints check it
  std::string device = "h100";  // MFU is measured against its peak
  std::string arch = "sm_90";  // NVRTC's target (codegen/cuda/nvrtc_compile.h)
  bool tf32 = false;           // fp32 matmuls may use TF32 tensor cores (and the peak is TF32's)
  bool line_info = false;      // -lineinfo, for profilers
  bool no_cache = false;       // compile with NVRTC even if the kernel cache has the result
  std::string emit_cuda;       // also write the CUDA C source here ("" : no)
  std::string emit_program;    // also write the program JSON here ("" : no)
  // The most bytes one chunk of a fused classifier's logits may take
  // (codegen/cuda/kernel_source.h, CudaSourceOptions).
  int64_t classifier_chunk_bytes = CudaSourceOptions{}.classifier_logits_bytes;
};

// The CPU build's result (arena, kernel counts, seconds per step) and what
// the CUDA build adds.
struct CudaBuildResult : host::BuildResult {
  int launches = 0;  // CUDA kernel launches per step (cuBLASLt matmuls not counted), of `functions`
  std::string arch, nvrtc_version;
  int64_t cubin_bytes = 0, ptx_bytes = 0;
  double nvrtc_seconds = 0;  // the compile, or the cache lookup on a hit
  bool cache_hit = false;
};

// Throws std::runtime_error for what the user can fix (a bad --arch, an
// unknown device, linker failure, unwritable output); ir::InternalError for
// napkin bugs (NVRTC rejecting the generated source).
CudaBuildResult build_cuda_trainer(const ir::Graph& g, const CudaBuildOptions& options);

// The static library of the CUDA runtime a trainer links (napkin train keys
// its trainer cache on it, so a rebuilt runtime means a rebuilt trainer).
const char* cuda_runtime_library();

}  // namespace napkin::codegen::cuda
