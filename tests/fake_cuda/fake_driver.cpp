// The fake GPU's CUDA driver API (fake_cuda.h defines the terms): every
// entry point runtime/cuda/cuda_driver.h resolves, plus cuFuncGetAttribute.
// cuda.h's macros give each definition its versioned symbol (cuMemAlloc is
// cuMemAlloc_v2), exactly as the engine's dlsym looks it up.
#include <dlfcn.h>
#include <elf.h>
#include <link.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>

#include "fake_cuda/fake_cuda.h"
#include "support/cuda_emulator.h"

using napkin::fake_cuda::Fake;
using napkin::fake_cuda::Op;
using napkin::fake_cuda::Region;

namespace {

constexpr int kDefaultDynamicShared = 48 << 10;

// A kernel of the module's source: its name, __launch_bounds__ and
// NapkinOffsets<N> (-1: it takes no offsets parameter).
struct SourceKernel {
  int max_threads = 1024;
  int offsets = -1;
};

}  // namespace

struct CUctx_st {};

struct CUfunc_st {
  CUmod_st* module = nullptr;
  std::string name;
  SourceKernel kernel;
  int max_dynamic_shared = kDefaultDynamicShared;
};

struct CUmod_st {
  std::unique_ptr<napkin::testing::CudaEmulator> emulator;
  std::map<std::string, CUfunc_st> functions;  // the source's kernels
  std::vector<std::pair<char*, size_t>> globals;
};

namespace {

CUctx_st primary_context;

int max_shared_optin() { return Fake::get().arch >= 90 ? 232448 : 166912; }

// The kernels of a CUDA C source as codegen/cuda emits them; throws
// std::runtime_error for a kernel whose parameters the fake cannot pass.
std::map<std::string, SourceKernel> source_kernels(const std::string& src) {
  std::map<std::string, SourceKernel> kernels;
  const std::string_view head = "\nextern \"C\" __global__ void ";
  const std::string_view bounds = "__launch_bounds__(";
  const std::string_view params = "(char* __restrict__ arena, char* __restrict__ scratch";
  const std::string_view offsets = ", const NAPKIN_OFFSETS(";
  for (size_t at = src.find(head); at != std::string::npos; at = src.find(head, at)) {
    at += head.size();
    SourceKernel k;
    if (src.compare(at, bounds.size(), bounds) == 0) {
      k.max_threads = std::atoi(src.c_str() + at + bounds.size());
      at = src.find(") ", at) + 2;
    }
    size_t paren = src.find('(', at);
    std::string name = src.substr(at, paren - at);
    if (src.compare(paren, params.size(), params) != 0)
      throw std::runtime_error("kernel " + name + " does not take (arena, scratch, ...) as codegen/cuda emits it");
    size_t rest = paren + params.size();
    if (src.compare(rest, offsets.size(), offsets) == 0) k.offsets = std::atoi(src.c_str() + rest + offsets.size());
    kernels[name] = k;
  }
  return kernels;
}

// What a module image is: a cubin's or PTX's architecture and kernel names.
struct Image {
  bool cubin = false;
  int arch = 0;
  std::set<std::string> kernels;
};

// CUDA_SUCCESS and the image, or why the driver would refuse it.
CUresult read_image(const void* data, Image* image, std::string* why) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  if (std::memcmp(bytes, ELFMAG, SELFMAG) == 0) {
    const auto* eh = static_cast<const Elf64_Ehdr*>(data);
    if (eh->e_ident[EI_CLASS] != ELFCLASS64 || eh->e_machine != EM_CUDA) {
      *why = "an ELF image that is not a 64-bit CUDA cubin (e_machine " + std::to_string(eh->e_machine) + ")";
      return CUDA_ERROR_INVALID_IMAGE;
    }
    image->cubin = true;
    // The SM of a cubin: e_flags bits 8-15 from ELF ABI version 8 (CUDA
    // 12.8+), bits 0-7 before.
    image->arch = eh->e_ident[EI_ABIVERSION] >= 8 ? (eh->e_flags >> 8) & 0xff : eh->e_flags & 0xff;
    const auto* sections = reinterpret_cast<const Elf64_Shdr*>(bytes + eh->e_shoff);
    for (int i = 0; i < eh->e_shnum; ++i) {
      if (sections[i].sh_type != SHT_SYMTAB) continue;
      const char* names = reinterpret_cast<const char*>(bytes + sections[sections[i].sh_link].sh_offset);
      const auto* symbols = reinterpret_cast<const Elf64_Sym*>(bytes + sections[i].sh_offset);
      for (size_t s = 0; s < sections[i].sh_size / sizeof(Elf64_Sym); ++s)
        if (ELF64_ST_TYPE(symbols[s].st_info) == STT_FUNC && ELF64_ST_BIND(symbols[s].st_info) == STB_GLOBAL)
          image->kernels.insert(names + symbols[s].st_name);
    }
    return CUDA_SUCCESS;
  }
  std::string_view text(static_cast<const char*>(data));
  size_t target = text.find("\n.target sm_");
  if (target == std::string_view::npos) {
    *why = "neither a cubin nor PTX text with a .target";
    return CUDA_ERROR_INVALID_IMAGE;
  }
  image->arch = std::atoi(text.data() + target + 12);
  for (size_t at = text.find(".entry "); at != std::string_view::npos; at = text.find(".entry ", at)) {
    at += 7;
    image->kernels.insert(std::string(text.substr(at, text.find('(', at) - at)));
  }
  return CUDA_SUCCESS;
}

std::string read_text(const char* path) {
  std::ifstream in(path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

CUresult load_module(CUmodule* module, const void* image_data, char* log, size_t log_bytes) {
  Fake& fake = Fake::get();
  if (CUresult r = fake.precondition(); r != CUDA_SUCCESS) return r;
  if (CUresult r = fake.forbid_during_capture(); r != CUDA_SUCCESS) return r;
  if (!module || !image_data) return CUDA_ERROR_INVALID_VALUE;
  Image image;
  std::string why;
  if (CUresult r = read_image(image_data, &image, &why); r != CUDA_SUCCESS) {
    std::fprintf(stderr, "napkin fake CUDA: cuModuleLoadData: %s\n", why.c_str());
    return r;
  }
  if (image.cubin && (image.arch / 10 != fake.arch / 10 || image.arch % 10 > fake.arch % 10))
    return CUDA_ERROR_NO_BINARY_FOR_GPU;
  if (!image.cubin && image.arch > fake.arch) {
    if (log && log_bytes > 0)
      std::snprintf(log, log_bytes, "ptxas fatal   : SM version specified by .target (sm_%d) is higher than the "
                    "device's (sm_%d)", image.arch, fake.arch);
    return CUDA_ERROR_INVALID_PTX;
  }
  const char* source_path = std::getenv("NAPKIN_FAKE_CUDA_SOURCE");
  if (!source_path) {
    std::fprintf(stderr, "napkin fake CUDA: set NAPKIN_FAKE_CUDA_SOURCE to the trainer's CUDA C source "
                         "(napkin build --emit-cuda FILE)\n");
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  std::string source = read_text(source_path);
  auto m = std::make_unique<CUmod_st>();
  try {
    std::map<std::string, SourceKernel> kernels = source_kernels(source);
    std::set<std::string> names;
    for (const auto& [name, k] : kernels) names.insert(name);
    if (names != image.kernels) {
      std::fprintf(stderr, "napkin fake CUDA: the module image's %zu kernels are not the %zu of %s\n",
                   image.kernels.size(), names.size(), source_path);
      return CUDA_ERROR_INVALID_IMAGE;
    }
    m->emulator = std::make_unique<napkin::testing::CudaEmulator>(source);
    for (const auto& [name, k] : kernels) m->functions[name] = CUfunc_st{m.get(), name, k};
  } catch (const std::exception& e) {
    std::fprintf(stderr, "napkin fake CUDA: %s\n", e.what());
    return CUDA_ERROR_INVALID_IMAGE;
  }
  *module = m.release();
  return CUDA_SUCCESS;
}

// [p, p + bytes) in device memory, for a call's arguments.
bool device_bytes(CUdeviceptr p, size_t bytes) {
  return Fake::get().device_region(reinterpret_cast<const void*>(p), bytes) != nullptr;
}

// When queued work runs: its device bytes are still mapped (a reservation's
// granule unmapped after the work was queued is a fault on a GPU).
CUresult still_mapped(const char* call, const void* device, size_t bytes) {
  if (Fake::get().device_region(device, bytes)) return CUDA_SUCCESS;
  return Fake::get().fail(CUDA_ERROR_ILLEGAL_ADDRESS,
                          std::string(call) + ": its device bytes were unmapped before the stream ran it");
}

// An async copy with host memory on one side: pinned memory is copied when
// the stream gets there; pageable memory is staged by the driver, so the
// call returns when the copy is done, and a capture cannot record it.
CUresult host_copy(const char* call, void* to, const void* from, size_t bytes, const void* host, const void* device,
                   CUstream stream) {
  Fake& fake = Fake::get();
  if (fake.pinned(host, bytes)) {
    return fake.submit(stream, [=] {
      if (CUresult r = still_mapped(call, device, bytes); r != CUDA_SUCCESS) return r;
      std::memcpy(to, from, bytes);
      return CUDA_SUCCESS;
    });
  }
  if (CUresult r = fake.forbid_during_capture(); r != CUDA_SUCCESS) return r;
  if (CUresult r = fake.synchronize(stream); r != CUDA_SUCCESS) return r;
  std::memcpy(to, from, bytes);
  return CUDA_SUCCESS;
}

}  // namespace

namespace {

// The one kind of allocation napkin asks for: device memory of GPU 0.
bool device_memory(const CUmemAllocationProp* prop) {
  return prop && prop->type == CU_MEM_ALLOCATION_TYPE_PINNED && prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE &&
         prop->location.id == 0;
}

// The checks every virtual memory call makes first.
CUresult vmm_precondition() {
  Fake& fake = Fake::get();
  if (CUresult r = fake.precondition(); r != CUDA_SUCCESS) return r;
  if (!fake.vmm) return CUDA_ERROR_NOT_SUPPORTED;
  return fake.forbid_during_capture();
}

}  // namespace

extern "C" {

CUresult cuGetErrorName(CUresult error, const char** name) {
  switch (error) {
#define NAME(e)     \
  case e:           \
    *name = #e;     \
    return CUDA_SUCCESS;
    NAME(CUDA_SUCCESS)
    NAME(CUDA_ERROR_INVALID_VALUE)
    NAME(CUDA_ERROR_OUT_OF_MEMORY)
    NAME(CUDA_ERROR_NOT_INITIALIZED)
    NAME(CUDA_ERROR_INVALID_DEVICE)
    NAME(CUDA_ERROR_INVALID_IMAGE)
    NAME(CUDA_ERROR_INVALID_CONTEXT)
    NAME(CUDA_ERROR_NO_BINARY_FOR_GPU)
    NAME(CUDA_ERROR_INVALID_PTX)
    NAME(CUDA_ERROR_INVALID_HANDLE)
    NAME(CUDA_ERROR_ILLEGAL_STATE)
    NAME(CUDA_ERROR_NOT_FOUND)
    NAME(CUDA_ERROR_NOT_READY)
    NAME(CUDA_ERROR_ILLEGAL_ADDRESS)
    NAME(CUDA_ERROR_LAUNCH_FAILED)
    NAME(CUDA_ERROR_NOT_SUPPORTED)
    NAME(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)
    NAME(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)
#undef NAME
    default:
      *name = nullptr;
      return CUDA_ERROR_INVALID_VALUE;
  }
}

CUresult cuGetErrorString(CUresult error, const char** text) {
  switch (error) {
#define TEXT(e, t) \
  case e:          \
    *text = t;     \
    return CUDA_SUCCESS;
    TEXT(CUDA_SUCCESS, "no error")
    TEXT(CUDA_ERROR_INVALID_VALUE, "invalid argument")
    TEXT(CUDA_ERROR_OUT_OF_MEMORY, "out of memory")
    TEXT(CUDA_ERROR_NOT_INITIALIZED, "initialization error")
    TEXT(CUDA_ERROR_INVALID_DEVICE, "invalid device ordinal")
    TEXT(CUDA_ERROR_INVALID_IMAGE, "device kernel image is invalid")
    TEXT(CUDA_ERROR_INVALID_CONTEXT, "invalid device context")
    TEXT(CUDA_ERROR_NO_BINARY_FOR_GPU, "no kernel image is available for execution on the device")
    TEXT(CUDA_ERROR_INVALID_PTX, "a PTX JIT compilation failed")
    TEXT(CUDA_ERROR_INVALID_HANDLE, "invalid resource handle")
    TEXT(CUDA_ERROR_ILLEGAL_STATE, "the operation cannot be performed in the present state")
    TEXT(CUDA_ERROR_NOT_FOUND, "named symbol not found")
    TEXT(CUDA_ERROR_NOT_READY, "device not ready")
    TEXT(CUDA_ERROR_ILLEGAL_ADDRESS, "an illegal memory access was encountered")
    TEXT(CUDA_ERROR_LAUNCH_FAILED, "unspecified launch failure")
    TEXT(CUDA_ERROR_NOT_SUPPORTED, "operation not supported")
    TEXT(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "operation not permitted when stream is capturing")
    TEXT(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "operation failed due to a previous error during capture")
#undef TEXT
    default:
      *text = nullptr;
      return CUDA_ERROR_INVALID_VALUE;
  }
}

CUresult cuDriverGetVersion(int* version) {
  if (!version) return CUDA_ERROR_INVALID_VALUE;
  *version = CUDA_VERSION;
  return CUDA_SUCCESS;
}

CUresult cuInit(unsigned int flags) {
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  Fake::get().initialized = true;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int* count) {
  if (CUresult r = Fake::get().precondition(false); r != CUDA_SUCCESS) return r;
  if (!count) return CUDA_ERROR_INVALID_VALUE;
  *count = 1;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  if (CUresult r = Fake::get().precondition(false); r != CUDA_SUCCESS) return r;
  if (!device) return CUDA_ERROR_INVALID_VALUE;
  if (ordinal != 0) return CUDA_ERROR_INVALID_DEVICE;
  *device = 0;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char* name, int len, CUdevice device) {
  if (CUresult r = Fake::get().precondition(false); r != CUDA_SUCCESS) return r;
  if (device != 0) return CUDA_ERROR_INVALID_DEVICE;
  if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  std::snprintf(name, static_cast<size_t>(len), "%s", "NVIDIA Fake GPU");
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetAttribute(int* value, CUdevice_attribute attribute, CUdevice device) {
  Fake& fake = Fake::get();
  if (CUresult r = fake.precondition(false); r != CUDA_SUCCESS) return r;
  if (device != 0) return CUDA_ERROR_INVALID_DEVICE;
  if (!value) return CUDA_ERROR_INVALID_VALUE;
  bool hopper = fake.arch >= 90;
  switch (attribute) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *value = fake.arch / 10; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *value = fake.arch % 10; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK:
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X:
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: *value = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: *value = 64; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: *value = 2147483647; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y:
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: *value = 65535; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: *value = kDefaultDynamicShared; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: *value = max_shared_optin(); break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: *value = hopper ? 233472 : 167936; break;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: *value = 32; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *value = hopper ? 132 : 108; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: *value = 2048; break;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK: *value = 65536; break;
    case CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY: *value = 65536; break;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: *value = hopper ? 50 << 20 : 40 << 20; break;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY: *value = 1; break;
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: *value = fake.vmm ? 1 : 0; break;
    default: return CUDA_ERROR_NOT_SUPPORTED;  // a real attribute the fake has no value for
  }
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext* context, CUdevice device) {
  if (CUresult r = Fake::get().precondition(false); r != CUDA_SUCCESS) return r;
  if (device != 0) return CUDA_ERROR_INVALID_DEVICE;
  if (!context) return CUDA_ERROR_INVALID_VALUE;
  ++Fake::get().primary_refs;
  *context = &primary_context;
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease(CUdevice device) {
  Fake& fake = Fake::get();
  if (!fake.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (device != 0) return CUDA_ERROR_INVALID_DEVICE;
  if (fake.primary_refs == 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (--fake.primary_refs == 0) fake.context_current = false;
  return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext context) {
  Fake& fake = Fake::get();
  if (CUresult r = fake.precondition(false); r != CUDA_SUCCESS) return r;
  if (context == nullptr) {
    fake.context_current = false;
    return CUDA_SUCCESS;
  }
  if (context != &primary_context || fake.primary_refs == 0) return CUDA_ERROR_INVALID_CONTEXT;
  fake.context_current = true;
  return CUDA_SUCCESS;
}

CUresult cuStreamCreate(CUstream* stream, unsigned int flags) {
  Fake& fake = Fake::get();
  if (CUresult r = fake.precondition(); r != CUDA_SUCCESS) return r;
  if (!stream || (flags != CU_STREAM_DEFAULT && flags != CU_STREAM_NON_BLOCKING)) return CUDA_ERROR_INVALID_VALUE;
  *stream = new CUstream_st;
  fake.add_stream(&(*stream)->stream);
  return CUDA_SUCCESS;
}

CUresult cuStreamDestroy(CUstream stream) {
  Fake& fake = Fake::get();
  if (!stream) return CUDA_ERROR_INVALID_HANDLE;
  if (stream->stream.capturing) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  fake.synchronize(stream);  // the driver lets queued work finish
  fake.remove_stream(&stream->stream);
  delete stream;
  return CUDA_SUCCESS;
}

CUresult cuStreamSynchronize(CUstream stream) {
  Fake& fake = Fake::get();
  if (CUresult r = fake.precondition(); r != CUDA_SUCCESS) return r;
  if (CUresult r = fake.forbid_during_capture(); r != CUDA_SUCCESS) return r;
  return fake.synchronize(stream);
}

CUresult cuModuleLoadData(CUmodule* module, const void* image) { return load_module(module, image, nullptr, 0); }

CUresult cuModuleLoadDataEx(CUmodule* module, const void* image, unsigned int num_options, CUjit_option* options,
                            void** values) {
  char* log = nullptr;
  size_t log_bytes = 0;
  for (unsigned i = 0; i < num_options; ++i) {
    if (options[i] == CU_JIT_ERROR_LOG_BUFFER) log = static_cast<char*>(values[i]);
    if (options[i] == CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES)
      log_bytes = static_cast<size_t>(reinterpret_cast<uintptr_t>(values[i]));
  }
  return load_module(module, image, log, log_bytes);
}

CUresult cuModuleUnload(CUmodule module) {
  Fake& fake = Fake::get();
  if (CUresult r = fake.precondition(); r != CUDA_SUCCESS) return r;
  if (CUresult r = fake.forbid_during_capture(); r != CUDA_SUCCESS) return r;
  if (!module) return CUDA_ERROR_INVALID_HANDLE;
  for (auto [base, bytes] : module->globals) fake.remove_regions_in(base, base + bytes);
  delete module;
  return CUDA_SUCCESS;
}

CUresult cuModuleGetFunction(CUfunction* function, CUmodule module, const char* name) {
  if (CUresult r = Fake::get().precondition(); r != CUDA_SUCCESS) return r;
  if (!module) return CUDA_ERROR_INVALID_HANDLE;
  if (!function || !name) return CUDA_ERROR_INVALID_VALUE;
  auto it = module->functions.find(name);
  if (it == module->functions.end()) return CUDA_ERROR_NOT_FOUND;
  *function = &it->second;
  return CUDA_SUCCESS;
}

CUresult cuModuleGetGlobal(CUdeviceptr* pointer, size_t* bytes, CUmodule module, const char* name) {
  Fake& fake = Fake::get();
  if (CUresult r = fake.precondition(); r != CUDA_SUCCESS) return r;
  if (!module) return CUDA_ERROR_INVALID_HANDLE;
  if (!name) return CUDA_ERROR_INVALID_VALUE;
  void* address = nullptr;
  try {
    address = module->emulator->global(name);
  } catch (const std::exception&) {
    return CUDA_ERROR_NOT_FOUND;
  }
  Dl_info info;
  void* symbol = nullptr;
  if (!dladdr1(address, &info, &symbol, RTLD_DL_SYMENT) || !symbol) return CUDA_ERROR_NOT_FOUND;
  size_t size = static_cast<const ElfW(Sym)*>(symbol)->st_size;
  fake.add_foreign_device_region(static_cast<char*>(address), size);
  module->globals.push_back({static_cast<char*>(address), size});
  if (pointer) *pointer = reinterpret_cast<CUdeviceptr>(address);
  if (bytes) *bytes = size;
  return CUDA_SUCCESS;
}

CUresult cuFuncSetAttribute(CUfunction function, CUfunction_attribute attribute, int value) {
  if (CUresult r = Fake::get().precondition(); r != CUDA_SUCCESS) return r;
  if (!function) return CUDA_ERROR_INVALID_HANDLE;
  switch (attribute) {
    case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES:
      if (value < 0 || value > max_shared_optin()) return CUDA_ERROR_INVALID_VALUE;
      function->max_dynamic_shared = value;
      return CUDA_SUCCESS;
    case CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT:
      return value >= -1 && value <= 100 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    default: return CUDA_ERROR_NOT_SUPPORTED;
  }
}

CUresult cuFuncGetAttribute(int* value, CUfunction_attribute attribute, CUfunction function) {
  if (CUresult r = Fake::get().precondition(); r != CUDA_SUCCESS) return r;
  if (!function) return CUDA_ERROR_INVALID_HANDLE;
  if (!value) return CUDA_ERROR_INVALID_VALUE;
  switch (attribute) {
    case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *value = function->kernel.max_threads; break;
    case CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES: *value = 0; break;
    case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: *value = function->max_dynamic_shared; break;
    case CU_FUNC_ATTRIBUTE_PTX_VERSION:
    case CU_FUNC_ATTRIBUTE_BINARY_VERSION: *value = Fake::get().arch; break;
    default: return CUDA_ERROR_NOT_SUPPORTED;
  }
  return CUDA_SUCCESS;
}

CUresult cuFuncGetParamInfo(CUfunction function, size_t index, size_t* offset, size_t* bytes) {
  if (CUresult r = Fake::get().precondition(); r != CUDA_SUCCESS) return r;
  if (!function) return CUDA_ERROR_INVALID_HANDLE;
  size_t params = function->kernel.offsets >= 0 ? 3 : 2;
  if (index >= params || !offset || !bytes) return CUDA_ERROR_INVALID_VALUE;
  *offset = 8 * index;  // two pointers, then the 8-aligned NapkinOffsets<N>
  *bytes = index < 2 ? 8 : 8 * static_cast<size_t>(function->kernel.offsets);
  return CUDA_SUCCESS;
}

CUresult cuLaunchKernel(CUfunction f, unsigned int grid_x, unsigned int grid_y, unsigned int grid_z,
                        unsigned int block_x, unsigned int block_y, unsigned int block_z, unsigned int shared_bytes,
                        CUstream stream, void** params, void** extra) {
  Fake& fake = Fake::get();
  if (CUresult r = fake.precondition(); r != CUDA_SUCCESS) return r;
  if (!f) return CUDA_ERROR_INVALID_HANDLE;
  if (grid_x == 0 || grid_y == 0 || grid_z == 0 || block_x == 0 || block_y == 0 || block_z == 0 ||
      grid_x > 2147483647u || grid_y > 65535 || grid_z > 65535 || block_x * block_y * block_z > 1024u)
    return CUDA_ERROR_INVALID_VALUE;
  if (block_x * block_y * block_z > static_cast<unsigned>(f->kernel.max_threads))
    return CUDA_ERROR_INVALID_VALUE;  // more threads than its __launch_bounds__
  if (static_cast<int>(shared_bytes) > f->max_dynamic_shared || shared_bytes > static_cast<unsigned>(max_shared_optin()))
    return CUDA_ERROR_INVALID_VALUE;
  if (grid_y != 1 || grid_z != 1 || block_y != 1 || block_z != 1) {
    std::fprintf(stderr, "napkin fake CUDA: %s: only 1-D launches are emulated\n", f->name.c_str());
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  if (!params || extra) return CUDA_ERROR_INVALID_VALUE;
  // The driver copies the parameters' bytes now: later changes to them do
  // not reach this launch.
  CUdeviceptr arena = 0, scratch = 0;
  std::memcpy(&arena, params[0], sizeof arena);
  std::memcpy(&scratch, params[1], sizeof scratch);
  std::vector<int64_t> offsets(static_cast<size_t>(std::max(f->kernel.offsets, 0)));
  if (!offsets.empty()) std::memcpy(offsets.data(), params[2], offsets.size() * sizeof(int64_t));
  napkin::testing::CudaEmulator* emulator = f->module->emulator.get();
  std::string name = f->name;
  return fake.submit(stream, [=]() -> CUresult {
    Fake& fake = Fake::get();
    // The arena's own address, and an operand's, may lie in an unmapped granule of a reservation: a kernel may
    // be given operands it does not touch (a batch's members its run mask skips: another ZeRO rank's
    // parameters). A touch of an unmapped granule is a fault, as on a GPU: the PROT_NONE pages end the process.
    const Region* region = fake.device_region(reinterpret_cast<void*>(arena), 1, false);
    if (!region) return fake.fail(CUDA_ERROR_ILLEGAL_ADDRESS, name + ": the arena argument is not device memory");
    for (int64_t o : offsets)
      if (o < 0 || fake.device_region(reinterpret_cast<char*>(arena) + o, 1, false) != region)
        return fake.fail(CUDA_ERROR_ILLEGAL_ADDRESS,
                         name + ": operand offset " + std::to_string(o) + " is outside the arena's allocation");
    if (scratch && !fake.device_region(reinterpret_cast<void*>(scratch), 1))
      return fake.fail(CUDA_ERROR_ILLEGAL_ADDRESS, name + ": the scratch argument is not device memory");
    try {
      emulator->launch(name, grid_x, static_cast<int>(block_x), static_cast<int>(shared_bytes),
                       reinterpret_cast<char*>(arena), reinterpret_cast<char*>(scratch), offsets);
    } catch (const std::exception& e) {
      return fake.fail(CUDA_ERROR_LAUNCH_FAILED, e.what());
    }
    return CUDA_SUCCESS;
  });
}

CUresult cuMemAlloc(CUdeviceptr* pointer, size_t bytes) {
  Fake& fake = Fake::get();
  if (CUresult r = fake.precondition(); r != CUDA_SUCCESS) return r;
  if (CUresult r = fake.forbid_during_capture(); r != CUDA_SUCCESS) return r;
  if (!pointer) return CUDA_ERROR_INVALID_VALUE;
  char* p = nullptr;
  CUresult r = fake.alloc_device(bytes, &p);
  *pointer = reinterpret_cast<CUdeviceptr>(p);
  return r;
}

CUresult cuMemFree(CUdeviceptr pointer) {
  Fake& fake = Fake::get();
  if (CUresult r = fake.precondition(); r != CUDA_SUCCESS) return r;
  if (CUresult r = fake.forbid_during_capture(); r != CUDA_SUCCESS) return r;
  if (pointer == 0) return CUDA_SUCCESS;
  return fake.free_region(reinterpret_cast<void*>(pointer), true);
}

CUresult cuMemHostAlloc(void** pointer, size_t bytes, unsigned int flags) {
  Fake& fake = Fake::get();
  if (CUresult r = fake.precondition(); r != CUDA_SUCCESS) return r;
  if (CUresult r = fake.forbid_during_capture(); r != CUDA_SUCCESS) return r;
  if (!pointer || (flags & ~(CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED)))
    return CUDA_ERROR_INVALID_VALUE;
  char* p = nullptr;
  CUresult r = fake.alloc_pinned(bytes, &p);
  *pointer = p;
  return r;
}

CUresult cuMemFreeHost(void* pointer) {
  Fake& fake = Fake::get();
  if (CUresult r = fake.precondition(); r != CUDA_SUCCESS) return r;
  if (CUresult r = fake.forbid_during_capture(); r != CUDA_SUCCESS) return r;
  return fake.free_region(pointer, false);
}

CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t bytes, CUstream stream) {
  Fake& fake = Fake::get();
  if (CUresult r = fake.precondition(); r != CUDA_SUCCESS) return r;
  if (bytes == 0) return CUDA_SUCCESS;
  if (!device_bytes(dst, bytes)) return CUDA_ERROR_INVALID_VALUE;
  return fake.submit(stream, [=] {
    if (CUresult r = still_mapped("cuMemsetD8Async", reinterpret_cast<void*>(dst), bytes); r != CUDA_SUCCESS) return r;
    std::memset(reinterpret_cast<void*>(dst), value, bytes);
    return CUDA_SUCCESS;
  });
}

CUresult cuMemsetD2D8Async(CUdeviceptr dst, size_t pitch, unsigned char value, size_t width, size_t height,
                           CUstream stream) {
  Fake& fake = Fake::get();
  if (CUresult r = fake.precondition(); r != CUDA_SUCCESS) return r;
  if (width == 0 || height == 0) return CUDA_SUCCESS;
  if (pitch < width || !device_bytes(dst, pitch * (height - 1) + width)) return CUDA_ERROR_INVALID_VALUE;
  return fake.submit(stream, [=] {
    for (size_t row = 0; row < height; ++row) std::memset(reinterpret_cast<char*>(dst) + row * pitch, value, width);
    return CUDA_SUCCESS;
  });
}

CUresult cuMemcpyHtoDAsync(CUdeviceptr dst, const void* src, size_t bytes, CUstream stream) {
  Fake& fake = Fake::get();
  if (CUresult r = fake.precondition(); r != CUDA_SUCCESS) return r;
  if (bytes == 0) return CUDA_SUCCESS;
  if (!device_bytes(dst, bytes) || !src) return CUDA_ERROR_INVALID_VALUE;
  return host_copy("cuMemcpyHtoDAsync", reinterpret_cast<void*>(dst), src, bytes, src, reinterpret_cast<void*>(dst),
                   stream);
}

CUresult cuMemcpyDtoHAsync(void* dst, CUdeviceptr src, size_t bytes, CUstream stream) {
  Fake& fake = Fake::get();
  if (CUresult r = fake.precondition(); r != CUDA_SUCCESS) return r;
  if (bytes == 0) return CUDA_SUCCESS;
  if (!device_bytes(src, bytes) || !dst) return CUDA_ERROR_INVALID_VALUE;
  return host_copy("cuMemcpyDtoHAsync", dst, reinterpret_cast<const void*>(src), bytes, dst,
                   reinterpret_cast<const void*>(src), stream);
}

CUresult cuMemcpyDtoDAsync(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream) {
  Fake& fake = Fake::get();
  if (CUresult r = fake.precondition(); r != CUDA_SUCCESS) return r;
  if (bytes == 0) return CUDA_SUCCESS;
  if (!device_bytes(dst, bytes) || !device_bytes(src, bytes)) return CUDA_ERROR_INVALID_VALUE;
  if (dst < src + bytes && src < dst + bytes) {
    // The GPU's copy engines give no defined result for overlapping bytes.
    std::fprintf(stderr, "napkin fake CUDA: cuMemcpyDtoDAsync between overlapping bytes\n");
    return CUDA_ERROR_INVALID_VALUE;
  }
  return fake.submit(stream, [=] {
    for (CUdeviceptr p : {dst, src})
      if (CUresult r = still_mapped("cuMemcpyDtoDAsync", reinterpret_cast<void*>(p), bytes); r != CUDA_SUCCESS) return r;
    std::memcpy(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), bytes);
    return CUDA_SUCCESS;
  });
}

CUresult cuEventCreate(CUevent* event, unsigned int flags) {
  if (CUresult r = Fake::get().precondition(); r != CUDA_SUCCESS) return r;
  if (!event) return CUDA_ERROR_INVALID_VALUE;
  *event = new CUevent_st;
  (*event)->timing = (flags & CU_EVENT_DISABLE_TIMING) == 0;
  return CUDA_SUCCESS;
}

CUresult cuEventDestroy(CUevent event) {
  if (!event) return CUDA_ERROR_INVALID_HANDLE;
  delete event;
  return CUDA_SUCCESS;
}

CUresult cuEventRecord(CUevent event, CUstream stream) {
  Fake& fake = Fake::get();
  if (CUresult r = fake.precondition(); r != CUDA_SUCCESS) return r;
  if (!event) return CUDA_ERROR_INVALID_HANDLE;
  event->recorded = true;
  event->done = false;
  event->stream = stream;
  return fake.submit(stream, [event] {
    event->ms = Fake::get().now_ms();
    event->done = true;
    return CUDA_SUCCESS;
  });
}

// The stream's later work waits for the event: the fake runs the event's
// stream up to now (its pending work, the record included), so whatever the
// waiting stream runs later sees it done. Not captured: napkin waits for
// events between graphs, never inside one.
CUresult cuStreamWaitEvent(CUstream stream, CUevent event, unsigned int flags) {
  Fake& fake = Fake::get();
  if (CUresult r = fake.precondition(); r != CUDA_SUCCESS) return r;
  if (!event) return CUDA_ERROR_INVALID_HANDLE;
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (fake.stream(stream).capturing || (event->recorded && fake.stream(event->stream).capturing))
    return fake.fail(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "cuStreamWaitEvent during a capture (the fake has none)");
  if (!event->recorded || event->done) return CUDA_SUCCESS;
  return fake.synchronize(event->stream);
}

CUresult cuEventSynchronize(CUevent event) {
  Fake& fake = Fake::get();
  if (CUresult r = fake.precondition(); r != CUDA_SUCCESS) return r;
  if (!event) return CUDA_ERROR_INVALID_HANDLE;
  if (CUresult r = fake.forbid_during_capture(); r != CUDA_SUCCESS) return r;
  if (!event->recorded) return CUDA_SUCCESS;
  return fake.synchronize(event->stream);
}

CUresult cuEventElapsedTime(float* ms, CUevent start, CUevent end) {
  if (CUresult r = Fake::get().precondition(); r != CUDA_SUCCESS) return r;
  if (!start || !end || !ms) return CUDA_ERROR_INVALID_VALUE;
  if (!start->timing || !end->timing || !start->recorded || !end->recorded) return CUDA_ERROR_INVALID_HANDLE;
  if (!start->done || !end->done) return CUDA_ERROR_NOT_READY;
  *ms = static_cast<float>(end->ms - start->ms);
  return CUDA_SUCCESS;
}

CUresult cuStreamBeginCapture(CUstream stream, CUstreamCaptureMode mode) {
  Fake& fake = Fake::get();
  if (CUresult r = fake.precondition(); r != CUDA_SUCCESS) return r;
  if (!stream) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;  // the legacy stream cannot capture
  if (mode != CU_STREAM_CAPTURE_MODE_GLOBAL && mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
      mode != CU_STREAM_CAPTURE_MODE_RELAXED)
    return CUDA_ERROR_INVALID_VALUE;
  napkin::fake_cuda::Stream& s = stream->stream;
  if (s.capturing) return CUDA_ERROR_ILLEGAL_STATE;
  s.capturing = true;
  s.capture_invalidated = false;
  s.capture_mode = mode;
  s.captured = std::make_shared<std::vector<Op>>();
  return CUDA_SUCCESS;
}

CUresult cuStreamEndCapture(CUstream stream, CUgraph* graph) {
  if (!stream || !graph) return CUDA_ERROR_INVALID_VALUE;
  napkin::fake_cuda::Stream& s = stream->stream;
  if (!s.capturing) return CUDA_ERROR_ILLEGAL_STATE;
  s.capturing = false;
  auto ops = std::move(s.captured);
  if (s.capture_invalidated) {
    *graph = nullptr;
    return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  }
  *graph = new CUgraph_st{std::move(ops)};
  return CUDA_SUCCESS;
}

CUresult cuGraphInstantiate(CUgraphExec* exec, CUgraph graph, unsigned long long flags) {
  if (CUresult r = Fake::get().precondition(); r != CUDA_SUCCESS) return r;
  if (!exec || !graph || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  // The executable graph is a copy: destroying the graph leaves it intact.
  *exec = new CUgraphExec_st{std::make_shared<const std::vector<Op>>(*graph->ops)};
  return CUDA_SUCCESS;
}

CUresult cuGraphDestroy(CUgraph graph) {
  if (!graph) return CUDA_ERROR_INVALID_VALUE;
  delete graph;
  return CUDA_SUCCESS;
}

CUresult cuGraphExecDestroy(CUgraphExec exec) {
  if (!exec) return CUDA_ERROR_INVALID_VALUE;
  delete exec;
  return CUDA_SUCCESS;
}

CUresult cuGraphLaunch(CUgraphExec exec, CUstream stream) {
  Fake& fake = Fake::get();
  if (CUresult r = fake.precondition(); r != CUDA_SUCCESS) return r;
  if (!exec) return CUDA_ERROR_INVALID_VALUE;
  return fake.submit(stream, [ops = exec->ops]() -> CUresult {
    for (const Op& op : *ops)
      if (CUresult r = op(); r != CUDA_SUCCESS) return r;
    return CUDA_SUCCESS;
  });
}


// Virtual memory management (fake_cuda.h: the terms).

CUresult cuMemGetAllocationGranularity(size_t* granularity, const CUmemAllocationProp* prop,
                                       CUmemAllocationGranularity_flags option) {
  if (CUresult r = vmm_precondition(); r != CUDA_SUCCESS) return r;
  if (!granularity || !device_memory(prop) ||
      (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM && option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED))
    return CUDA_ERROR_INVALID_VALUE;
  *granularity = Fake::kGranule;
  return CUDA_SUCCESS;
}

CUresult cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags) {
  if (CUresult r = vmm_precondition(); r != CUDA_SUCCESS) return r;
  if (!ptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  (void)addr;  // a hint the driver may ignore, as the fake does
  char* p = nullptr;
  CUresult r = Fake::get().reserve(size, alignment, &p);
  *ptr = reinterpret_cast<CUdeviceptr>(p);
  return r;
}

CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  if (CUresult r = vmm_precondition(); r != CUDA_SUCCESS) return r;
  return Fake::get().free_reservation(reinterpret_cast<void*>(ptr), size);
}

CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size, const CUmemAllocationProp* prop,
                     unsigned long long flags) {
  if (CUresult r = vmm_precondition(); r != CUDA_SUCCESS) return r;
  if (!handle || !device_memory(prop) || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  return Fake::get().create(size, handle);
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  if (CUresult r = vmm_precondition(); r != CUDA_SUCCESS) return r;
  return Fake::get().release_physical(handle);
}

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags) {
  if (CUresult r = vmm_precondition(); r != CUDA_SUCCESS) return r;
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (offset != 0) return CUDA_ERROR_NOT_SUPPORTED;  // the fake maps a whole allocation
  return Fake::get().map(reinterpret_cast<void*>(ptr), size, handle);
}

CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  if (CUresult r = vmm_precondition(); r != CUDA_SUCCESS) return r;
  return Fake::get().unmap(reinterpret_cast<void*>(ptr), size);
}

CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count) {
  if (CUresult r = vmm_precondition(); r != CUDA_SUCCESS) return r;
  if (!desc || count != 1 || desc->location.type != CU_MEM_LOCATION_TYPE_DEVICE || desc->location.id != 0 ||
      desc->flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
    return CUDA_ERROR_INVALID_VALUE;
  return Fake::get().set_access(reinterpret_cast<void*>(ptr), size);
}

// For tests in the process that loaded the fake (dlsym): the bytes mapped now.
int64_t napkin_fake_cuda_mapped_bytes() { return Fake::get().mapped_bytes; }

}  // extern "C"
