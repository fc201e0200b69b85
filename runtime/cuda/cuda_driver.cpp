#include "runtime/cuda/cuda_driver.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <vector>

#include "runtime/error.h"

// Two steps so that the argument's macro (cuMemAlloc -> cuMemAlloc_v2) is
// expanded before it becomes a string.
#define NAPKIN_STRINGIFY_EXPANDED(x) #x
#define NAPKIN_STRINGIFY(x) NAPKIN_STRINGIFY_EXPANDED(x)

namespace napkin::runtime::cuda {

namespace {

// Resolves every entry point of a library; names the missing ones.
template <class Resolve>
std::vector<std::string> resolve_all(void* handle, Resolve&& resolve) {
  std::vector<std::string> missing;
  resolve([&](auto& fn, const char* symbol) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(handle, symbol));
    if (!fn) missing.push_back(symbol);
  });
  return missing;
}

}  // namespace

CudaDriver::CudaDriver(const char* library) {
  handle_ = dlopen(library, RTLD_NOW | RTLD_LOCAL);
  if (!handle_) {
    const char* why = dlerror();
    throw Error(fmt::format("{} cannot be loaded ({}): no NVIDIA driver is installed", library,
                            why ? why : "no reason given"));
  }
  std::vector<std::string> missing = resolve_all(handle_, [&](auto&& bind) {
#define NAPKIN_BIND(name) bind(name, NAPKIN_STRINGIFY(name));
    NAPKIN_CUDA_DRIVER_ENTRY_POINTS(NAPKIN_BIND)
#undef NAPKIN_BIND
  });
  if (!missing.empty()) {
    int version = 0;
    std::string has = cuDriverGetVersion && cuDriverGetVersion(&version) == CUDA_SUCCESS
                          ? fmt::format("a driver for CUDA {}.{}", version / 1000, version % 1000 / 10)
                          : std::string("the driver");
    dlclose(handle_);
    throw Error(fmt::format("{} is {}, which lacks {}; this trainer needs a driver for CUDA {}.{} or newer", library,
                            has, fmt::join(missing, ", "), CUDA_VERSION / 1000, CUDA_VERSION % 1000 / 10));
  }
  std::vector<std::string> missing_vmm = resolve_all(handle_, [&](auto&& bind) {
#define NAPKIN_BIND(name) bind(name, NAPKIN_STRINGIFY(name));
    NAPKIN_CUDA_VMM_ENTRY_POINTS(NAPKIN_BIND)
#undef NAPKIN_BIND
  });
  missing_vmm_ = fmt::format("{}", fmt::join(missing_vmm, ", "));
  // The toolkit's stub library answers no version (CUDA_ERROR_STUB_LIBRARY);
  // cuInit then says what it is.
  int version = 0;
  if (cuDriverGetVersion(&version) == CUDA_SUCCESS) {
    try {
      check_driver_version(library, version);
    } catch (...) {
      dlclose(handle_);
      throw;
    }
  }
}

void check_driver_version(const char* library, int driver_version) {
  if (driver_version / 1000 >= CUDA_VERSION / 1000) return;
  throw Error(fmt::format("{} is a driver for CUDA {}.{}; this trainer needs a driver for CUDA {}.{} or newer", library,
                          driver_version / 1000, driver_version % 1000 / 10, CUDA_VERSION / 1000,
                          CUDA_VERSION % 1000 / 10));
}

CudaDriver::~CudaDriver() { dlclose(handle_); }

std::string CudaDriver::error_text(CUresult r) const {
  const char* name = nullptr;
  const char* text = nullptr;
  if (cuGetErrorName(r, &name) != CUDA_SUCCESS || !name) {
    // The toolkit's stub libcuda (lib64/stubs) answers every call, this one
    // included, with CUDA_ERROR_STUB_LIBRARY.
    if (r == CUDA_ERROR_STUB_LIBRARY)
      return "CUDA_ERROR_STUB_LIBRARY (libcuda.so.1 is the CUDA toolkit's stub library, not an NVIDIA driver)";
    return fmt::format("CUresult {}", static_cast<int>(r));
  }
  if (cuGetErrorString(r, &text) != CUDA_SUCCESS || !text) return name;
  return fmt::format("{} ({})", name, text);
}

CublasLt::CublasLt() {
  const char* const names[] = {"libcublasLt.so." NAPKIN_STRINGIFY(CUBLAS_VER_MAJOR), "libcublasLt.so"};
  std::string why;
  for (const char* name : names) {
    handle_ = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (handle_) break;
    const char* e = dlerror();
    why += fmt::format("{}{}", why.empty() ? "" : "; ", e ? e : name);
  }
  if (!handle_)
    throw Error(
        fmt::format("cuBLASLt cannot be loaded ({}): install the CUDA {} cuBLAS library", why, CUBLAS_VER_MAJOR));
  std::vector<std::string> missing = resolve_all(handle_, [&](auto&& bind) {
#define NAPKIN_BIND(name) bind(name, NAPKIN_STRINGIFY(name));
    NAPKIN_CUBLASLT_ENTRY_POINTS(NAPKIN_BIND)
#undef NAPKIN_BIND
  });
  if (!missing.empty()) {
    dlclose(handle_);
    throw Error(fmt::format("the cuBLASLt library found lacks {}: install the CUDA {} cuBLAS library",
                            fmt::join(missing, ", "), CUBLAS_VER_MAJOR));
  }
  // Enum values and struct layouts change between major versions.
  size_t version = cublasLtGetVersion();
  if (version / 10000 != CUBLAS_VER_MAJOR) {
    dlclose(handle_);
    throw Error(fmt::format("the cuBLASLt library found is version {}, napkin needs major version {}", version,
                            CUBLAS_VER_MAJOR));
  }
}

CublasLt::~CublasLt() { dlclose(handle_); }

std::string CublasLt::error_text(cublasStatus_t s) const {
  return fmt::format("{} ({})", cublasLtGetStatusName(s), cublasLtGetStatusString(s));
}

std::string_view source_path(std::string_view file) {
  std::string_view root = NAPKIN_SOURCE_ROOT;
  if (file.starts_with(root)) file.remove_prefix(root.size());
  while (file.starts_with("../")) file.remove_prefix(3);  // relative to a build directory inside the tree
  return file;
}

std::string call_failed_message(const char* file, int line, std::string_view call, const std::string& error) {
  std::string_view function = call.substr(0, call.find('('));
  while (!function.empty() && function.back() == ' ') function.remove_suffix(1);
  return fmt::format("{}:{}: {} failed: {}", source_path(file), line, function, error);
}

void throw_call_failed(const char* file, int line, std::string_view call, const std::string& error) {
  throw Error(call_failed_message(file, line, call, error));
}

}  // namespace napkin::runtime::cuda
