// NVRTC: one CUDA C translation unit -> machine code for one GPU architecture
// (a cubin) plus PTX for the same architecture's virtual ISA, which the
// driver JIT-compiles when the trainer runs on a newer GPU than the cubin's.
//
// Terms:
//  - arch: a real architecture as NVRTC's -arch takes it: "sm_NN" (sm_80,
//    sm_89, sm_90, sm_100, sm_120, ...), or "sm_NNa" (NN >= 90: with
//    architecture-specific features; its cubin and PTX run on exactly that
//    architecture) or "sm_NNf" (NN >= 100: family-specific features; runs on
//    that family). NN must be one of nvrtcGetSupportedArchs.
//  - cubin: the ELF image NVRTC compiled for arch (nvrtcGetCUBIN); it loads
//    on a GPU of that architecture only (same major, minor >= NN's).
//  - PTX: the same compile's virtual-ISA text (".target sm_NN", i.e.
//    compute_NN; nvrtcGetPTX), NUL-free; a GPU of a later architecture than
//    NN loads it by JIT compilation.
//  - options: always -arch=ARCH -std=c++17 --fmad=false, plus -lineinfo when
//    asked. Not --use_fast_math (approximate division, sqrt, exp and
//    flush-to-zero) and not FMA contraction: the CPU backend rounds every
//    multiply and add separately, and the CUDA kernels must compute what it
//    computes. Not -default-device: every device function in the source says
//    __device__, as the host emulation of the source needs
//    (codegen/cuda/kernel_source.h), so a missing one is a compile error.
//  - cache: results are kept on disk (codegen/cuda/kernel_cache.h), keyed by
//    source, options, arch and NVRTC's version; a hit returns the same bytes
//    a compile would.
#pragma once

#include <string>
#include <vector>

namespace napkin::codegen::cuda {

struct NvrtcOptions {
  std::string arch = "sm_90";
  bool line_info = false;  // -lineinfo: source lines for profilers (Nsight Compute)
  bool use_cache = true;
  std::string cache_dir;  // "" : default_kernel_cache_dir()
};

struct NvrtcResult {
  std::string cubin;  // ELF bytes
  std::string ptx;    // text, without a trailing NUL
  std::string arch;
  std::string nvrtc_version;  // "13.0"
  double seconds = 0;         // the compile, or the cache lookup on a hit
  bool cache_hit = false;
};

// NVRTC's supported real architectures as "sm_NN", ascending.
std::vector<std::string> supported_archs();

// Throws std::runtime_error (the user's mistake: a bad --arch) naming the
// supported architectures if `arch` is not one NVRTC can compile for.
void check_arch(const std::string& arch);

// Compiles `source` (named `name` in NVRTC's messages). A bad arch throws
// std::runtime_error; a source NVRTC rejects is a napkin bug and throws
// ir::InternalError carrying NVRTC's log.
NvrtcResult nvrtc_compile(const std::string& source, const std::string& name, const NvrtcOptions& options);

}  // namespace napkin::codegen::cuda
