#include "runtime/cuda/device_arena.h"

#include <fmt/format.h>

#include <algorithm>

#include "runtime/error.h"

namespace napkin::runtime::cuda {

namespace {

size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

CUmemAllocationProp device_memory(CUdevice device) {
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}

}  // namespace

DeviceArena::DeviceArena(CudaDriver& driver, CUdevice device, size_t bytes) : d_(driver), device_(device) {
  int supported = 0;
  NAPKIN_CU(d_, cuDeviceGetAttribute(&supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, device));
  if (!d_.missing_vmm().empty())
    why_not_virtual_ = "the driver lacks " + d_.missing_vmm();
  else if (!supported)
    why_not_virtual_ = "this GPU has no virtual memory management";
  if (!virtual_memory()) {
    if (CUresult r = d_.cuMemAlloc(&base_, bytes); r != CUDA_SUCCESS)
      throw Error(fmt::format("the arena ({} bytes) does not fit on this GPU: {}", bytes,
                              call_failed_message(__FILE__, __LINE__, "cuMemAlloc", d_.error_text(r))));
    reserved_ = bytes;
    return;
  }
  const CUmemAllocationProp prop = device_memory(device);
  NAPKIN_CU(d_, cuMemGetAllocationGranularity(&granule_, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  reserved_ = round_up(bytes, granule_);
  pad_ = reserved_ - round_up(bytes, 256);
  NAPKIN_CU(d_, cuMemAddressReserve(&reservation_, reserved_, granule_, 0, 0));
  base_ = reservation_ + pad_;
  handles_.assign(reserved_ / granule_, 0);
  // The reservation's bytes before and after the arena hold nothing: a granule whose arena bytes are all released goes.
  const int64_t before = static_cast<int64_t>(pad_), after = static_cast<int64_t>(reserved_ - pad_ - bytes);
  if (before > 0) released_.emplace(-before, 0);
  if (after > 0) released_.emplace(static_cast<int64_t>(bytes), static_cast<int64_t>(bytes) + after);
}

DeviceArena::~DeviceArena() {
  if (!virtual_memory()) {
    if (base_) d_.cuMemFree(base_);
    return;
  }
  for (size_t g = 0; g < handles_.size(); ++g) unmap(g);
  if (reservation_) d_.cuMemAddressFree(reservation_, reserved_);
}

void DeviceArena::back(CUstream stream) {
  if (backed_) return;
  if (!virtual_memory()) {
    NAPKIN_CU(d_, cuMemsetD8Async(base_, 0, reserved_, stream));  // optimizer state starts at 0
    mapped_ = peak_mapped_ = static_cast<int64_t>(reserved_);
    backed_ = true;
    return;
  }
  const CUmemAllocationProp prop = device_memory(device_);
  CUmemAccessDesc access = {};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  size_t needed = 0;
  for (size_t g = 0; g < handles_.size(); ++g) needed += handles_[g] || released_granule(g) ? 0 : granule_;
  // Runs of granules to map: each granule its own allocation, the access and the zero fill per run.
  for (size_t g = 0; g < handles_.size();) {
    if (handles_[g] || released_granule(g)) {
      ++g;
      continue;
    }
    const size_t first = g;
    for (; g < handles_.size() && !handles_[g] && !released_granule(g); ++g) {
      CUmemGenericAllocationHandle h = 0;
      if (CUresult r = d_.cuMemCreate(&h, granule_, &prop, 0); r != CUDA_SUCCESS)
        throw Error(fmt::format("this rank's share of the arena ({} of {} bytes) does not fit on this GPU: {}", needed,
                                reserved_, call_failed_message(__FILE__, __LINE__, "cuMemCreate", d_.error_text(r))));
      if (CUresult r = d_.cuMemMap(reservation_ + g * granule_, granule_, 0, h, 0); r != CUDA_SUCCESS) {
        d_.cuMemRelease(h);
        throw_call_failed(__FILE__, __LINE__, "cuMemMap", d_.error_text(r));
      }
      handles_[g] = h;
      mapped_ += static_cast<int64_t>(granule_);
    }
    const CUdeviceptr run = reservation_ + first * granule_;
    const size_t run_bytes = (g - first) * granule_;
    NAPKIN_CU(d_, cuMemSetAccess(run, run_bytes, &access, 1));
    NAPKIN_CU(d_, cuMemsetD8Async(run, 0, run_bytes, stream));  // optimizer state starts at 0
  }
  peak_mapped_ = std::max(peak_mapped_, mapped_);
  backed_ = true;
}

void DeviceArena::release(int64_t offset, int64_t bytes) {
  if (!virtual_memory() || bytes <= 0) return;
  // Merge [offset, offset + bytes) into the released ranges.
  int64_t start = offset, end = offset + bytes;
  auto it = released_.upper_bound(start);
  if (it != released_.begin() && std::prev(it)->second >= start) --it;
  while (it != released_.end() && it->first <= end) {
    start = std::min(start, it->first);
    end = std::max(end, it->second);
    it = released_.erase(it);
  }
  released_.emplace(start, end);
  // Granule g holds arena offsets [g * granule - pad, (g + 1) * granule - pad).
  const auto at = [&](int64_t o) { return static_cast<size_t>(o + static_cast<int64_t>(pad_)); };
  for (size_t g = at(start) / granule_; g < handles_.size() && g * granule_ < at(end); ++g) {
    if (!handles_[g] || !released_granule(g)) continue;
    NAPKIN_CU(d_, cuMemUnmap(reservation_ + g * granule_, granule_));
    const CUmemGenericAllocationHandle h = handles_[g];
    handles_[g] = 0;
    mapped_ -= static_cast<int64_t>(granule_);
    NAPKIN_CU(d_, cuMemRelease(h));
  }
}

bool DeviceArena::released_granule(size_t g) const {
  const int64_t first = static_cast<int64_t>(g * granule_) - static_cast<int64_t>(pad_);
  const int64_t last = first + static_cast<int64_t>(granule_);
  auto it = released_.upper_bound(first);  // the merged range starting at or before `first`, if any
  if (it == released_.begin()) return false;
  --it;
  return it->second >= last;
}

void DeviceArena::unmap(size_t g) noexcept {
  if (!handles_[g]) return;
  d_.cuMemUnmap(reservation_ + g * granule_, granule_);  // tear-down: nothing to report a failure to
  d_.cuMemRelease(handles_[g]);
  handles_[g] = 0;
  mapped_ -= static_cast<int64_t>(granule_);
}

}  // namespace napkin::runtime::cuda
