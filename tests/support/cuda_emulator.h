// Runs CUDA C kernel sources (codegen/cuda/kernel_source.h) on the host, so
// the tests can check the CUDA backend's kernels without a GPU.
//
// Terms:
//  - emulated library: the source compiled as C++17 by the host compiler
//    (g++ -O1 -fPIC -shared -DNAPKIN_HOST_EMULATION, with
//    tests/support/cuda_host_shim.h force-included) and loaded with dlopen.
//    The shim defines the CUDA execution model there: see its header comment
//    for what is emulated and how.
//  - launch: one kernel over a 1-D grid of 1-D blocks, run to completion on
//    the calling thread before launch() returns. `arena` and `scratch` are
//    the kernel's first two arguments (the device arena and scratch buffer);
//    they must be 16-byte aligned, as the GPU's 16-byte vector loads need.
//    With `offsets` empty the kernel takes just those two; otherwise its third
//    parameter is `const NAPKIN_OFFSETS(N) off` (the prelude's
//    NapkinOffsets<N>, codegen/cuda/kernel_source.h) with N = offsets.size(),
//    which the kernel reads as off.at[0 .. N).
//
// One launch at a time per emulator; emulators are independent of each other.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace napkin::testing {

class CudaEmulator {
 public:
  // Compiles and loads `source`. Throws std::runtime_error with the
  // compiler's messages when it does not compile.
  explicit CudaEmulator(const std::string& source);
  ~CudaEmulator();
  CudaEmulator(const CudaEmulator&) = delete;
  CudaEmulator& operator=(const CudaEmulator&) = delete;

  // Runs `function` (an extern "C" __global__ function of the source).
  // Throws std::runtime_error when the source has no such function, when the
  // launch shape is one CUDA rejects, or when a block cannot complete (a
  // barrier some threads never reach): the message names the kernel, the
  // block and the threads.
  void launch(const std::string& function, int64_t grid, int block, int shared_bytes, char* arena, char* scratch,
              const std::vector<int64_t>& offsets = {});

  // The address of a __device__ variable of the source (cuModuleGetGlobal's
  // counterpart). Throws std::runtime_error when there is none.
  void* global(const std::string& name);

 private:
  using Kernel = void (*)();  // the shim casts it back by whether there are offsets
  using LaunchEntry = void (*)(Kernel, long long, int, int, char*, char*, const long long*, const char*);
  using ErrorEntry = const char* (*)();

  void* symbol(const std::string& name, const char* what);

  void* library_ = nullptr;
  LaunchEntry launch_ = nullptr;
  ErrorEntry last_error_ = nullptr;
};

}  // namespace napkin::testing
