#include "codegen/cuda/nvrtc_compile.h"

#include <dlfcn.h>
#include <fmt/format.h>
#include <nvrtc.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <regex>
#include <stdexcept>

#include "codegen/cuda/kernel_cache.h"
#include "codegen/cuda/sha256.h"
#include "ir/internal_check.h"

// Every NVRTC call goes through this: a failure is a napkin bug (or a broken
// toolkit), reported with napkin's file:line, the call and NVRTC's reason.
#define NAPKIN_NVRTC_CHECK(call)                                                                          \
  do {                                                                                                    \
    nvrtcResult napkin_nvrtc_result_ = (call);                                                            \
    if (napkin_nvrtc_result_ != NVRTC_SUCCESS)                                                            \
      throw ::napkin::ir::InternalError(__FILE__, __LINE__,                                               \
                                        ::fmt::format("{} failed: {}", #call,                             \
                                                      nvrtcGetErrorString(napkin_nvrtc_result_)));        \
  } while (0)

namespace napkin::codegen::cuda {

namespace {

std::vector<int> supported_arch_numbers() {
  int n = 0;
  NAPKIN_NVRTC_CHECK(nvrtcGetNumSupportedArchs(&n));
  std::vector<int> archs(static_cast<size_t>(n));
  NAPKIN_NVRTC_CHECK(nvrtcGetSupportedArchs(archs.data()));
  return archs;
}

std::string nvrtc_version() {
  int major = 0, minor = 0;
  NAPKIN_NVRTC_CHECK(nvrtcVersion(&major, &minor));
  return fmt::format("{}.{}", major, minor);
}

// What identifies the NVRTC that compiles, for the cache key: its version,
// and the library file (path, size, modification time), since a patch
// release keeps the version number and may change the code it generates.
std::string nvrtc_identity() {
  std::string id = nvrtc_version();
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&nvrtcCompileProgram), &info) && info.dli_fname) {
    std::error_code ec;
    std::filesystem::path lib = std::filesystem::canonical(info.dli_fname, ec);
    if (!ec) {
      auto size = std::filesystem::file_size(lib, ec);
      auto mtime = std::filesystem::last_write_time(lib, ec).time_since_epoch().count();
      id += fmt::format(" {} {} {}", lib.string(), ec ? 0 : size, ec ? 0 : mtime);
    }
  }
  return id;
}

std::string program_log(nvrtcProgram program) {
  size_t size = 0;
  NAPKIN_NVRTC_CHECK(nvrtcGetProgramLogSize(program, &size));
  std::string log(size, '\0');
  NAPKIN_NVRTC_CHECK(nvrtcGetProgramLog(program, log.data()));
  while (!log.empty() && (log.back() == '\0' || log.back() == '\n')) log.pop_back();
  return log;
}

// Owns an nvrtcProgram so every exit path destroys it.
struct Program {
  nvrtcProgram handle = nullptr;
  ~Program() {
    if (handle) nvrtcDestroyProgram(&handle);
  }
};

CachedKernels compile(const std::string& source, const std::string& name, const std::vector<std::string>& options) {
  Program p;
  NAPKIN_NVRTC_CHECK(nvrtcCreateProgram(&p.handle, source.c_str(), name.c_str(), 0, nullptr, nullptr));
  std::vector<const char*> argv;
  for (const std::string& o : options) argv.push_back(o.c_str());
  nvrtcResult r = nvrtcCompileProgram(p.handle, static_cast<int>(argv.size()), argv.data());
  NAPKIN_INTERNAL_CHECK(r == NVRTC_SUCCESS, "NVRTC cannot compile the generated CUDA C ({}, options {}): {}\n{}", name,
                        fmt::join(options, " "), nvrtcGetErrorString(r), program_log(p.handle));
  CachedKernels k;
  size_t size = 0;
  NAPKIN_NVRTC_CHECK(nvrtcGetCUBINSize(p.handle, &size));
  k.cubin.resize(size);
  NAPKIN_NVRTC_CHECK(nvrtcGetCUBIN(p.handle, k.cubin.data()));
  NAPKIN_NVRTC_CHECK(nvrtcGetPTXSize(p.handle, &size));  // includes the terminating NUL
  k.ptx.resize(size);
  NAPKIN_NVRTC_CHECK(nvrtcGetPTX(p.handle, k.ptx.data()));
  while (!k.ptx.empty() && k.ptx.back() == '\0') k.ptx.pop_back();
  NAPKIN_INTERNAL_CHECK(!k.cubin.empty() && !k.ptx.empty(), "NVRTC returned no cubin ({} bytes) or no PTX ({} bytes) for {}",
                        k.cubin.size(), k.ptx.size(), name);
  return k;
}

}  // namespace

std::vector<std::string> supported_archs() {
  std::vector<std::string> names;
  for (int a : supported_arch_numbers()) names.push_back(fmt::format("sm_{}", a));
  return names;
}

void check_arch(const std::string& arch) {
  static const std::regex pattern("sm_([0-9]+)([af]?)");
  std::smatch m;
  bool ok = false;
  if (std::regex_match(arch, m, pattern)) {
    int number = std::stoi(m[1].str());
    std::vector<int> archs = supported_arch_numbers();
    ok = std::find(archs.begin(), archs.end(), number) != archs.end() &&
         (m[2] != "a" || number >= 90) && (m[2] != "f" || number >= 100);
  }
  if (!ok)
    throw std::runtime_error(fmt::format(
        "--arch {}: not a GPU architecture NVRTC {} compiles for\n    hint: supported: {} (sm_NNa for NN >= 90 and "
        "sm_NNf for NN >= 100 add architecture- and family-specific features); H100/H200 is sm_90",
        arch, nvrtc_version(), fmt::join(supported_archs(), ", ")));
}

NvrtcResult nvrtc_compile(const std::string& source, const std::string& name, const NvrtcOptions& options) {
  check_arch(options.arch);
  auto t0 = std::chrono::steady_clock::now();
  std::vector<std::string> nvrtc_options = {"-arch=" + options.arch, "-std=c++17", "--fmad=false"};
  if (options.line_info) nvrtc_options.push_back("-lineinfo");

  NvrtcResult result;
  result.arch = options.arch;
  result.nvrtc_version = nvrtc_version();
  auto finish = [&](CachedKernels&& k, bool hit) {
    result.cubin = std::move(k.cubin);
    result.ptx = std::move(k.ptx);
    result.cache_hit = hit;
    result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return result;
  };
  if (!options.use_cache) return finish(compile(source, name, nvrtc_options), false);

  // Each field NUL-terminated and the options counted, so no two different
  // field lists hash the same bytes.
  Sha256 h;
  for (const std::string& field : {std::string("napkin-nvrtc-cache-1"), nvrtc_identity(), options.arch, name,
                                   std::to_string(nvrtc_options.size())}) {
    h.update(field);
    h.update(std::string_view("", 1));
  }
  for (const std::string& o : nvrtc_options) {
    h.update(o);
    h.update(std::string_view("", 1));
  }
  h.update(source);
  const CacheKey key = h.finish();
  KernelCache cache(options.cache_dir.empty() ? default_kernel_cache_dir() : std::filesystem::path(options.cache_dir));
  if (std::optional<CachedKernels> hit = cache.load(key)) return finish(std::move(*hit), true);
  CachedKernels fresh = compile(source, name, nvrtc_options);
  cache.store(key, fresh);
  return finish(std::move(fresh), false);
}

}  // namespace napkin::codegen::cuda
