// A fake NVIDIA GPU for the tests: libnapkin_fake_cuda.so implements the
// CUDA driver API entry points and the cuBLASLt entry points a CUDA trainer
// resolves (runtime/cuda/cuda_driver.h), so that the CUDA engine runs on a
// machine without a GPU, loaded as `libcuda.so.1` and `libcublasLt.so.13`
// (two symlinks to this one library; glibc maps one file once, so both names
// share this state).
//
// Terms:
//  - device memory: host memory the fake hands out as CUdeviceptr values
//    (the address itself). Each allocation is 256-byte aligned, filled with
//    0xff bytes (a NaN in every float type) so that a read before any write
//    shows up, and ends (up to 256 bytes of rounding) at a PROT_NONE guard
//    page, so running past it faults. Module globals (napkin_bad_index) are
//    device memory too. Every copy, memset, launch and matmul checks that
//    the device bytes it touches lie inside one device region.
//  - virtual memory management: a reservation (cuMemAddressReserve) is an
//    mmap(PROT_NONE) range of host memory, followed by a guard page, and a
//    device region whose bytes are device memory only where mapped and
//    accessible. A physical allocation (cuMemCreate) is a size in granules
//    of 2 MiB (cuMemGetAllocationGranularity's answer, as on NVIDIA GPUs);
//    cuMemMap ties it to granule-aligned bytes of a reservation, which
//    cuMemSetAccess makes readable and writable (mprotect) and fills with
//    0xff; cuMemUnmap makes them inaccessible again and gives the pages back
//    (madvise MADV_DONTNEED), so a kernel touching an unmapped granule
//    faults, and a copy, memset or launch operand there is refused as
//    outside device memory. Unlike a GPU, a physical allocation maps once
//    (whole, at offset 0) and its bytes do not outlive its mapping. Mapped
//    bytes are counted (now and at peak); NAPKIN_FAKE_CUDA_VMM=0 makes a
//    device without virtual memory management
//    (CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED 0).
//  - report: with NAPKIN_FAKE_CUDA_REPORT=PREFIX, the process writes
//    PREFIX.RANK.json at exit (RANK from Open MPI's OMPI_COMM_WORLD_RANK,
//    else 0): {"mapped_bytes": now, "peak_mapped_bytes", "allocated_bytes":
//    cuMemAlloc's now, "peak_allocated_bytes"}. In the process itself,
//    napkin_fake_cuda_mapped_bytes() answers the mapped bytes now.
//  - pinned memory: cuMemHostAlloc's blocks. Captured copies must use it.
//  - stream work (an Op): a kernel launch, copy, memset, matmul or event
//    record. Submitted work runs at once, or, with NAPKIN_FAKE_CUDA_DEFER=1,
//    when the stream is synchronized (as late as a GPU may run it, so a host
//    that reads or refills a buffer before waiting sees stale data). While
//    the stream captures, work is recorded into the capture instead, and a
//    graph launch replays the recorded work in order.
//  - capture (CU_STREAM_CAPTURE_MODE_GLOBAL or THREAD_LOCAL, the same here
//    since the fake serves one host thread): while one runs, calls the
//    driver calls "unsafe" (synchronizing a stream or event, allocating or
//    freeing memory, loading a module, a copy from pageable memory) fail
//    with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidate the capture,
//    whose end then fails with CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, as the
//    driver does. A RELAXED capture forbids none of them.
//  - sticky error: a launch or matmul that fails while running (an emulated
//    kernel's barrier deadlock, an access outside device memory) prints why
//    on stderr ("napkin fake CUDA: ...") and, as a fault on a GPU does,
//    makes every later call return its error.
//  - kernels: the module image (cubin or PTX) is checked and its kernel
//    names read, but what runs is the CUDA C source named by the environment
//    variable NAPKIN_FAKE_CUDA_SOURCE (`napkin build --emit-cuda FILE`),
//    compiled for the host by tests/support/cuda_emulator.h; the image's
//    kernels must be exactly the source's.
//  - device: "NVIDIA Fake GPU", compute capability 9.0 (H100-like limits),
//    or 8.0 (A100-like) when NAPKIN_FAKE_CUDA_ARCH=sm_80. A cubin runs on
//    the same major architecture with a minor version up to the device's; a
//    PTX compiles for a device at least its .target.
#pragma once

#include <cuda.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace napkin::fake_cuda {

using Op = std::function<CUresult()>;

struct Stream {
  std::vector<Op> pending;                    // deferred work, in order
  bool capturing = false;
  bool capture_invalidated = false;
  CUstreamCaptureMode capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
  std::shared_ptr<std::vector<Op>> captured;  // while capturing
};

// A physical allocation's place in a reservation (cuMemMap).
struct Mapping {
  size_t bytes = 0;
  CUmemGenericAllocationHandle handle = 0;
  bool accessible = false;  // cuMemSetAccess
};

struct Region {
  char* base = nullptr;
  size_t bytes = 0;
  bool device = false;         // else pinned host memory
  void* mapping = nullptr;     // what munmap releases (nullptr: not ours, e.g. a module global)
  size_t mapping_bytes = 0;
  bool reservation = false;    // device memory only where mapped
  std::map<size_t, Mapping> mappings;  // a reservation's, by offset
};

// The fake's whole state (one device, one primary context).
class Fake {
 public:
  static Fake& get();

  int arch = 90;  // compute capability major * 10 + minor
  bool initialized = false;
  int primary_refs = 0;
  bool context_current = false;
  CUresult sticky = CUDA_SUCCESS;
  bool defer = false;

  // Device and pinned memory.
  CUresult alloc_device(size_t bytes, char** out);
  CUresult alloc_pinned(size_t bytes, char** out);
  CUresult free_region(const void* base, bool device);
  void add_foreign_device_region(char* base, size_t bytes);  // a module global
  void remove_regions_in(const void* begin, const void* end);
  // The device region holding [p, p + bytes), or nullptr; in a
  // reservation, only if every byte is mapped and accessible (unless
  // `mapped_only` is false).
  const Region* device_region(const void* p, size_t bytes, bool mapped_only = true) const;

  // Virtual memory management (the terms above).
  static constexpr size_t kGranule = 2u << 20;
  bool vmm = true;
  CUresult reserve(size_t bytes, size_t alignment, char** out);
  CUresult free_reservation(const void* base, size_t bytes);
  CUresult create(size_t bytes, CUmemGenericAllocationHandle* out);
  CUresult release_physical(CUmemGenericAllocationHandle handle);
  CUresult map(const void* at, size_t bytes, CUmemGenericAllocationHandle handle);
  CUresult unmap(const void* at, size_t bytes);
  CUresult set_access(const void* at, size_t bytes);
  int64_t mapped_bytes = 0, peak_mapped_bytes = 0, allocated_bytes = 0, peak_allocated_bytes = 0;
  bool pinned(const void* p, size_t bytes) const;

  // Work. `stream` nullptr is the default stream.
  Stream& stream(CUstream s);
  CUresult submit(CUstream s, Op op);
  CUresult synchronize(CUstream s);
  // For a call the driver forbids during capture: UNSUPPORTED (and the
  // capture invalidated) when one runs, else CUDA_SUCCESS.
  CUresult forbid_during_capture();
  // The error a call returns before doing anything: not initialized, no
  // current context, or the sticky error.
  CUresult precondition(bool needs_context = true) const;
  // Records a failure of running work: prints `why`, makes `error` sticky.
  CUresult fail(CUresult error, const std::string& why);

  double now_ms() const;

 private:
  Fake();
  ~Fake();  // writes NAPKIN_FAKE_CUDA_REPORT's file
  std::map<uintptr_t, Region> regions_;  // by base address
  // Physical allocations: their bytes and whether mapped; cuMemRelease'd ones go when unmapped.
  struct Physical {
    size_t bytes = 0;
    bool mapped = false, released = false;
  };
  std::map<CUmemGenericAllocationHandle, Physical> physical_;
  CUmemGenericAllocationHandle next_handle_ = 1;
  // The reservation holding `at`, with `at`'s offset in it, or nullptr.
  Region* reservation_at(const void* at, size_t* offset);
  Stream default_stream_;
  std::vector<Stream*> streams_;  // every created stream, for capture checks
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();

 public:
  void add_stream(Stream* s) { streams_.push_back(s); }
  void remove_stream(Stream* s);
};

}  // namespace napkin::fake_cuda

// The driver's opaque handle types, defined here.
struct CUstream_st {
  napkin::fake_cuda::Stream stream;
};
struct CUevent_st {
  bool timing = true;
  bool recorded = false;  // cuEventRecord was called
  bool done = false;      // its record ran
  double ms = 0;          // host time when it ran
  CUstream stream = nullptr;
};
struct CUgraph_st {
  std::shared_ptr<std::vector<napkin::fake_cuda::Op>> ops;
};
struct CUgraphExec_st {
  std::shared_ptr<const std::vector<napkin::fake_cuda::Op>> ops;
};
