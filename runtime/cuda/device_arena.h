// The CUDA engine's arena (runtime/cuda/cuda_engine.h): the program's
// planned bytes at one device address, backed by physical memory only where
// this rank uses them, so that a rank of a ZeRO job holds its own share of
// the optimizer state and not the others' (docs/cuda.md, "The arena, by
// virtual memory management").
//
// Terms:
//  - granule: cuMemGetAllocationGranularity's size for the device (2 MiB on
//    NVIDIA GPUs), the unit in which physical memory is mapped.
//  - reservation: the arena's address range, a whole number of granules
//    (cuMemAddressReserve). The arena ends where the reservation ends (its
//    start rounded down to 256 bytes): arena offset o is at
//    reservation + pad + o, pad = reserved - round_up(arena bytes, 256), so
//    a kernel running past the arena's end leaves the reservation at once.
//  - backed: the first work on the arena maps every granule not released by
//    then (one cuMemCreate + cuMemMap each, cuMemSetAccess per run of them)
//    and zero-fills it: a rank that releases before anything touches the
//    arena never maps what it released, so its peak is its share.
//  - released: arena byte ranges this rank never reads (another rank's
//    optimizer state under ZeRO-1). Every granule lying wholly inside their
//    union is unmapped and its physical memory freed; a granule that also
//    holds anything else stays (the reservation's bytes before and after
//    the arena hold nothing). The arena's offsets do not change.
//  - one physical allocation per granule: a physical allocation is freed
//    only whole, and cuMemUnmap cannot unmap part of a mapping, so this is
//    the one chunking that frees exactly the granules inside released
//    ranges whenever they are released (the trainer releases again after a
//    checkpoint). It costs a cuMemCreate and a cuMemMap per 2 MiB at start-up
//    (40,000 for an 80 GB arena), as PyTorch's expandable segments pay per
//    2 or 20 MiB.
//  - without virtual memory management (the device attribute
//    CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED is 0, or the
//    driver lacks the entry points): one cuMemAlloc, zero-filled, of which
//    nothing is ever given back; why_not_virtual() says why.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "runtime/cuda/cuda_driver.h"

namespace napkin::runtime::cuda {

class DeviceArena {
 public:
  // Reserves `bytes` (or allocates them, without virtual memory
  // management). Throws Error when the GPU cannot hold them.
  DeviceArena(CudaDriver& driver, CUdevice device, size_t bytes);
  ~DeviceArena();
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;

  // Arena offset 0.
  CUdeviceptr base() const { return base_; }
  bool virtual_memory() const { return why_not_virtual_.empty(); }
  const std::string& why_not_virtual() const { return why_not_virtual_; }

  // Maps and zero-fills (on `stream`) every granule not mapped and not
  // released; a no-op once done. Before the first work on the arena.
  void back(CUstream stream);
  bool backed() const { return backed_; }
  // Arena bytes [offset, offset + bytes) will never be read: the granules
  // wholly inside the released bytes are unmapped (noted only, before
  // back()). No work on the arena may be pending. A no-op without virtual
  // memory management.
  void release(int64_t offset, int64_t bytes);

  int64_t reserved_bytes() const { return static_cast<int64_t>(reserved_); }
  int64_t granularity() const { return static_cast<int64_t>(granule_); }
  // Bytes backed by physical memory now, and the most at any time.
  int64_t mapped_bytes() const { return mapped_; }
  int64_t peak_mapped_bytes() const { return peak_mapped_; }

 private:
  bool released_granule(size_t g) const;
  void unmap(size_t g) noexcept;

  CudaDriver& d_;
  CUdevice device_ = 0;
  std::string why_not_virtual_;
  CUdeviceptr reservation_ = 0, base_ = 0;
  size_t reserved_ = 0, granule_ = 0, pad_ = 0;
  std::vector<CUmemGenericAllocationHandle> handles_;  // per granule; 0: not mapped
  std::map<int64_t, int64_t> released_;                // merged [start, end) in arena offsets, by start
  bool backed_ = false;
  int64_t mapped_ = 0, peak_mapped_ = 0;
};

}  // namespace napkin::runtime::cuda
