// NVIDIA's libraries as a CUDA trainer uses them: the driver API (libcuda)
// and cuBLASLt, both opened at run time with dlopen rather than linked, so a
// trainer starts on any machine and can say why it cannot train there
// (no driver, a stub driver, no GPU) instead of failing to load.
//
// Terms:
//  - entry point: a member named as the header names the function
//    (`cuMemAlloc`). cuda.h turns most names into versioned symbols with
//    macros (`#define cuMemAlloc cuMemAlloc_v2`), and the same macro applies
//    to the member's declaration, its dlsym lookup (the stringified name)
//    and every call, so the member has exactly the type of the declaration
//    the header picked and is resolved by exactly that symbol.
//  - checked call: NAPKIN_CU(driver, cuMemAlloc(&p, n)) and
//    NAPKIN_CUBLASLT(lt, cublasLtMatmul(...)) call the entry point and throw
//    runtime::Error on failure:
//      runtime/cuda/cuda_engine.cpp:123: cuModuleLoadData failed: CUDA_ERROR_INVALID_IMAGE (device kernel image is invalid)
//    (file:line of the call, as the source tree names it; the call; the
//    error's name and text).
#pragma once

#include <cublasLt.h>
#include <cuda.h>

#include <string>
#include <string_view>

namespace napkin::runtime::cuda {

// The driver entry points the runtime calls, in one list so that the
// members and their lookup cannot drift apart.
#define NAPKIN_CUDA_DRIVER_ENTRY_POINTS(X)                                                                      \
  X(cuGetErrorName)                                                                                            \
  X(cuGetErrorString)                                                                                          \
  X(cuDriverGetVersion)                                                                                        \
  X(cuInit)                                                                                                    \
  X(cuDeviceGetCount)                                                                                          \
  X(cuDeviceGet)                                                                                               \
  X(cuDeviceGetName)                                                                                           \
  X(cuDeviceGetAttribute)                                                                                      \
  X(cuDevicePrimaryCtxRetain)                                                                                  \
  X(cuDevicePrimaryCtxRelease)                                                                                 \
  X(cuCtxSetCurrent)                                                                                           \
  X(cuStreamCreate)                                                                                            \
  X(cuStreamDestroy)                                                                                           \
  X(cuStreamSynchronize)                                                                                       \
  X(cuModuleLoadData)                                                                                          \
  X(cuModuleLoadDataEx)                                                                                        \
  X(cuModuleUnload)                                                                                            \
  X(cuModuleGetFunction)                                                                                       \
  X(cuModuleGetGlobal)                                                                                         \
  X(cuFuncSetAttribute)                                                                                        \
  X(cuFuncGetParamInfo)                                                                                        \
  X(cuLaunchKernel)                                                                                            \
  X(cuMemAlloc)                                                                                                \
  X(cuMemFree)                                                                                                 \
  X(cuMemHostAlloc)                                                                                            \
  X(cuMemFreeHost)                                                                                             \
  X(cuMemsetD8Async)                                                                                           \
  X(cuMemsetD2D8Async)                                                                                         \
  X(cuMemcpyHtoDAsync)                                                                                         \
  X(cuMemcpyDtoHAsync)                                                                                         \
  X(cuMemcpyDtoDAsync)                                                                                         \
  X(cuEventCreate)                                                                                             \
  X(cuEventDestroy)                                                                                            \
  X(cuEventRecord)                                                                                             \
  X(cuEventSynchronize)                                                                                        \
  X(cuStreamWaitEvent)                                                                                         \
  X(cuEventElapsedTime)                                                                                        \
  X(cuStreamBeginCapture)                                                                                      \
  X(cuStreamEndCapture)                                                                                        \
  X(cuGraphInstantiate)                                                                                        \
  X(cuGraphDestroy)                                                                                            \
  X(cuGraphExecDestroy)                                                                                        \
  X(cuGraphLaunch)

// Virtual memory management (the arena, runtime/cuda/device_arena.h): looked
// up too, but a driver without them still trains, from one cuMemAlloc.
#define NAPKIN_CUDA_VMM_ENTRY_POINTS(X) \
  X(cuMemGetAllocationGranularity)      \
  X(cuMemAddressReserve)                \
  X(cuMemAddressFree)                   \
  X(cuMemCreate)                        \
  X(cuMemRelease)                       \
  X(cuMemMap)                           \
  X(cuMemUnmap)                         \
  X(cuMemSetAccess)

#define NAPKIN_CUBLASLT_ENTRY_POINTS(X) \
  X(cublasLtGetVersion)                 \
  X(cublasLtGetStatusName)              \
  X(cublasLtGetStatusString)            \
  X(cublasLtCreate)                     \
  X(cublasLtDestroy)                    \
  X(cublasLtMatmulDescCreate)           \
  X(cublasLtMatmulDescDestroy)          \
  X(cublasLtMatmulDescSetAttribute)     \
  X(cublasLtMatmulDescGetAttribute)     \
  X(cublasLtMatrixLayoutCreate)         \
  X(cublasLtMatrixLayoutDestroy)        \
  X(cublasLtMatrixLayoutSetAttribute)   \
  X(cublasLtMatrixLayoutGetAttribute)   \
  X(cublasLtMatmulPreferenceCreate)     \
  X(cublasLtMatmulPreferenceDestroy)    \
  X(cublasLtMatmulPreferenceSetAttribute) \
  X(cublasLtMatmulAlgoGetHeuristic)     \
  X(cublasLtMatmul)

#define NAPKIN_DECLARE_ENTRY_POINT(name) decltype(&::name) name = nullptr;

// The driver API. Loading it touches no GPU (cuInit is the caller's first
// call); the engine turns a failure here into its "no GPU" message.
class CudaDriver {
 public:
  // `library`: a name dlopen searches for ("libcuda.so.1") or a path. Throws
  // Error when it cannot be opened, saying why (dlerror), or when it lacks an
  // entry point (a driver older than the toolkit napkin was built with).
  explicit CudaDriver(const char* library = "libcuda.so.1");
  ~CudaDriver();
  CudaDriver(const CudaDriver&) = delete;
  CudaDriver& operator=(const CudaDriver&) = delete;

  // "CUDA_ERROR_NO_DEVICE (no CUDA-capable device is detected)"; a name the
  // driver cannot give (a stub library names nothing) is spelled out here.
  std::string error_text(CUresult r) const;

  NAPKIN_CUDA_DRIVER_ENTRY_POINTS(NAPKIN_DECLARE_ENTRY_POINT)
  NAPKIN_CUDA_VMM_ENTRY_POINTS(NAPKIN_DECLARE_ENTRY_POINT)

  // "" when every virtual memory management entry point resolved, else
  // which are missing ("cuMemCreate, cuMemMap").
  const std::string& missing_vmm() const { return missing_vmm_; }

 private:
  void* handle_ = nullptr;
  std::string missing_vmm_;
};

// cuBLASLt: libcublasLt.so.13 (the major version napkin was built with),
// else libcublasLt.so if that is the same major version.
class CublasLt {
 public:
  CublasLt();
  ~CublasLt();
  CublasLt(const CublasLt&) = delete;
  CublasLt& operator=(const CublasLt&) = delete;

  // "CUBLAS_STATUS_NOT_SUPPORTED (the requested functionality is not supported)"
  std::string error_text(cublasStatus_t s) const;

  NAPKIN_CUBLASLT_ENTRY_POINTS(NAPKIN_DECLARE_ENTRY_POINT)

 private:
  void* handle_ = nullptr;
};

#undef NAPKIN_DECLARE_ENTRY_POINT

// Throws Error unless a driver reporting `driver_version` (cuDriverGetVersion:
// 1000 * major + 10 * minor) runs what this toolkit (CUDA_VERSION) builds: the
// same major version or newer. An older major version can lack none of the
// entry points (a 12.8 driver has them all) and still reject the cubin and
// the PTX, whose ISA is newer than its JIT compiler; named here instead.
void check_driver_version(const char* library, int driver_version);

// __FILE__ as the source tree names it: "runtime/cuda/cuda_engine.cpp", not
// "/home/me/napkin/runtime/..." or "../runtime/...".
std::string_view source_path(std::string_view file);

// "FILE:LINE: FUNCTION failed: ERROR", FILE as source_path gives it and
// FUNCTION the called name at the start of `call` ("cuMemAlloc(&p, n)" ->
// "cuMemAlloc").
std::string call_failed_message(const char* file, int line, std::string_view call, const std::string& error);

[[noreturn]] void throw_call_failed(const char* file, int line, std::string_view call, const std::string& error);

inline void check_call(const CudaDriver& d, CUresult r, const char* call, const char* file, int line) {
  if (r != CUDA_SUCCESS) throw_call_failed(file, line, call, d.error_text(r));
}
inline void check_call(const CublasLt& lt, cublasStatus_t s, const char* call, const char* file, int line) {
  if (s != CUBLAS_STATUS_SUCCESS) throw_call_failed(file, line, call, lt.error_text(s));
}

}  // namespace napkin::runtime::cuda

// `call` names the entry point as the header does: NAPKIN_CU(drv, cuMemAlloc(&p, bytes)).
#define NAPKIN_CU(driver, call) \
  ::napkin::runtime::cuda::check_call((driver), (driver).call, #call, __FILE__, __LINE__)
#define NAPKIN_CUBLASLT(lt, call) \
  ::napkin::runtime::cuda::check_call((lt), (lt).call, #call, __FILE__, __LINE__)
