// The CUDA backend's kernels: every loop kernel of a plan as CUDA C source,
// one translation unit that NVRTC compiles (codegen/cuda/nvrtc_compile.h).
// Gemm kernels are not here: the runtime runs them on cuBLASLt, as it runs
// the GEMMs of a Classifier kernel between that kernel's launches.
//
// Terms:
//  - launch: one kernel function launched on a 1-D grid of 1-D blocks. A
//    plan kernel is one or more launches, run in order on one stream (a
//    cross-entropy loss is per-row losses, then their sum in a fixed order).
//  - signature: every function is
//        extern "C" __global__ void NAME(char* __restrict__ arena, char* __restrict__ scratch,
//                                        const NAPKIN_OFFSETS(N) off)
//    where NAPKIN_OFFSETS(N) is the prelude's `struct NapkinOffsets<N> {
//    long long at[N]; }`, passed by value (by reference under host
//    emulation). Slot j of `off` is the byte offset of one operand of the
//    plan kernel, which the function reaches as arena + off.at[j]; the slots
//    number the plan kernel's distinct operand offsets, and every function of
//    one plan kernel takes all of them. Sizes, strides, dtypes, the launch
//    shape and the plan kernel's index (for bad ids) are compiled in as
//    constants; only byte offsets are parameters. `scratch` is a device
//    buffer of CudaSource::scratch_bytes that launches of one plan kernel
//    pass partial results through; nothing in it survives from one plan
//    kernel to the next.
//  - launch arguments: CudaLaunch::offsets, the N values of `off`. The
//    runtime passes them as the third kernel parameter (cuLaunchKernel:
//    kernelParams[2] points to the N long longs). A function that moves an
//    operand in 16-byte vectors was emitted so because that operand's offset
//    is a multiple of 16, and every launch of it has such an offset in that
//    slot (checked when the source is emitted).
//  - sharing: plan kernels whose functions are textually the same once the
//    offsets are parameters (a transformer's layers, the updates of
//    same-shaped parameters) are launched through one set of functions, named
//    after the first such plan kernel (NAME, NAME_2, ...): a launch's
//    function need not carry its own plan kernel's name.
//  - determinism: no floating-point atomics anywhere. Every sum runs in an
//    order fixed by the source and the launch shape, so a step gives the same
//    bits every run (the embedding gradient included).
//  - numerics: values are computed in f32 (f64 for f64); bf16, f16 and the
//    fp8 formats are converted on load exactly and rounded to nearest even on
//    store, by the same bit manipulation as the CPU backend
//    (codegen/cpu/loop_emitter.h), so the two backends round identically.
//  - bad index: an embedding or class id outside [0, bound) is not stored;
//    the first one is recorded as {plan kernel index, id, bound} in the
//    device global `long long napkin_bad_index[3]` (element 0 is -1 until
//    then), which the runtime reads (cuModuleGetGlobal) after a step and
//    reports as the CPU backend's napkin_rt_bad_index does.
//  - host emulation: the source uses only the CUDA features the prelude lists
//    (threadIdx/blockIdx/blockDim/gridDim .x, __syncthreads, __shared__,
//    extern __shared__, __shfl_xor_sync with a full mask, float math, and the
//    prelude's napkin_mma_m16n8k16_bf16/_f16: mma.sync as a warp-collective
//    over all 32 lanes), so the
//    tests can also compile it as C++ and run it on the CPU
//    (tests/support/cuda_emulator.h) against the reference interpreter.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "codegen/cuda/launch.h"
#include "codegen/plan.h"
#include "runtime/kernel_spec.h"

namespace napkin::codegen::cuda {

struct CudaSourceOptions {
  // The most bytes one chunk of a classifier's logits may take: about half
  // an H100's 50 MB L2, so the GEMM's output is still there when the row
  // kernel reads it. Tests make it small to get many chunks from a small model.
  int64_t classifier_logits_bytes = 32ll << 20;
};
CudaClassifierLayout classifier_layout(const Kernel& k, const CudaSourceOptions& options);

struct CudaSource {
  std::string text;  // the translation unit: prelude, then every distinct kernel
  // Per plan kernel, in plan order: its launches (empty for Gemm kernels).
  std::vector<std::vector<CudaLaunch>> launches;
  // Per plan kernel, in plan order: its layout (Classifier kernels; chunks
  // 0 for the rest).
  std::vector<CudaClassifierLayout> classifiers;
  int64_t scratch_bytes = 0;  // the largest any plan kernel needs
};

// The CUDA C source of every loop kernel of `plan`. `model_name` goes into
// the header comment only.
CudaSource emit_cuda_source(const KernelPlan& plan, const std::string& model_name, const CudaSourceOptions& options = {});

// The prelude every translation unit starts with: dtype conversions,
// block-wide reductions, and the host-emulation shims' entry point.
std::string_view cuda_prelude();

}  // namespace napkin::codegen::cuda
