// The fake GPU's memory and streams (fake_cuda.h defines the terms).
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <string_view>

#include "fake_cuda/fake_cuda.h"

namespace napkin::fake_cuda {

namespace {

size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

Region region(char* base, size_t bytes, bool device, void* mapping, size_t mapping_bytes) {
  Region r;
  r.base = base;
  r.bytes = bytes;
  r.device = device;
  r.mapping = mapping;
  r.mapping_bytes = mapping_bytes;
  return r;
}

}  // namespace

Fake& Fake::get() {
  static Fake fake;
  return fake;
}

Fake::Fake() {
  if (const char* a = std::getenv("NAPKIN_FAKE_CUDA_ARCH"); a && std::string_view(a) == "sm_80") arch = 80;
  if (const char* d = std::getenv("NAPKIN_FAKE_CUDA_DEFER"); d && std::string_view(d) == "1") defer = true;
  if (const char* v = std::getenv("NAPKIN_FAKE_CUDA_VMM"); v && std::string_view(v) == "0") vmm = false;
}

Fake::~Fake() {
  const char* prefix = std::getenv("NAPKIN_FAKE_CUDA_REPORT");
  if (!prefix) return;
  const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
  std::ofstream out(std::string(prefix) + "." + (rank ? rank : "0") + ".json");
  out << "{\"mapped_bytes\": " << mapped_bytes << ", \"peak_mapped_bytes\": " << peak_mapped_bytes
      << ", \"allocated_bytes\": " << allocated_bytes << ", \"peak_allocated_bytes\": " << peak_allocated_bytes
      << "}\n";
}

double Fake::now_ms() const {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_).count();
}

CUresult Fake::alloc_device(size_t bytes, char** out) {
  if (bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t body = align_up(bytes, 256);
  const size_t mapped = align_up(body, page) + page;
  void* m = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  char* guard = static_cast<char*>(m) + mapped - page;
  mprotect(guard, page, PROT_NONE);
  char* base = guard - body;
  std::memset(base, 0xff, body);
  regions_[reinterpret_cast<uintptr_t>(base)] = region(base, bytes, true, m, mapped);
  allocated_bytes += static_cast<int64_t>(bytes);
  peak_allocated_bytes = std::max(peak_allocated_bytes, allocated_bytes);
  *out = base;
  return CUDA_SUCCESS;
}

CUresult Fake::alloc_pinned(size_t bytes, char** out) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t mapped = align_up(std::max<size_t>(bytes, 1), page);
  void* m = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  regions_[reinterpret_cast<uintptr_t>(m)] = region(static_cast<char*>(m), bytes, false, m, mapped);
  *out = static_cast<char*>(m);
  return CUDA_SUCCESS;
}

CUresult Fake::free_region(const void* base, bool device) {
  auto it = regions_.find(reinterpret_cast<uintptr_t>(base));
  if (it == regions_.end() || it->second.device != device || !it->second.mapping || it->second.reservation)
    return CUDA_ERROR_INVALID_VALUE;
  if (device) allocated_bytes -= static_cast<int64_t>(it->second.bytes);
  munmap(it->second.mapping, it->second.mapping_bytes);
  regions_.erase(it);
  return CUDA_SUCCESS;
}

void Fake::add_foreign_device_region(char* base, size_t bytes) {
  regions_[reinterpret_cast<uintptr_t>(base)] = region(base, bytes, true, nullptr, 0);
}

void Fake::remove_regions_in(const void* begin, const void* end) {
  auto it = regions_.lower_bound(reinterpret_cast<uintptr_t>(begin));
  while (it != regions_.end() && it->first < reinterpret_cast<uintptr_t>(end)) {
    if (it->second.mapping) {
      ++it;
      continue;
    }
    it = regions_.erase(it);
  }
}

const Region* Fake::device_region(const void* p, size_t bytes, bool mapped_only) const {
  auto at = reinterpret_cast<uintptr_t>(p);
  auto it = regions_.upper_bound(at);
  if (it == regions_.begin()) return nullptr;
  --it;
  const Region& r = it->second;
  if (!r.device || at < it->first || at + bytes > it->first + r.bytes || at + bytes < at) return nullptr;
  if (!r.reservation || !mapped_only) return &r;
  // Every byte in accessible mappings: walk them from the one holding the first byte.
  size_t from = at - it->first, to = from + std::max<size_t>(bytes, 1);
  auto m = r.mappings.upper_bound(from);
  if (m == r.mappings.begin()) return nullptr;
  --m;
  for (size_t covered = m->first; covered < to; ++m) {
    if (m == r.mappings.end() || m->first != covered || !m->second.accessible) return nullptr;
    covered += m->second.bytes;
  }
  return &r;
}

Region* Fake::reservation_at(const void* at, size_t* offset) {
  auto a = reinterpret_cast<uintptr_t>(at);
  auto it = regions_.upper_bound(a);
  if (it == regions_.begin()) return nullptr;
  --it;
  if (!it->second.reservation || a >= it->first + it->second.bytes) return nullptr;
  *offset = a - it->first;
  return &it->second;
}

CUresult Fake::reserve(size_t bytes, size_t alignment, char** out) {
  if (bytes == 0 || bytes % kGranule != 0 || alignment % kGranule != 0) return CUDA_ERROR_INVALID_VALUE;
  alignment = std::max(alignment, kGranule);
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  // Enough to align, then the reservation, then at least a guard page; all PROT_NONE until mapped.
  const size_t mapped = bytes + alignment + page;
  void* m = mmap(nullptr, mapped, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  char* base = reinterpret_cast<char*>(align_up(reinterpret_cast<uintptr_t>(m), alignment));
  Region r = region(base, bytes, true, m, mapped);
  r.reservation = true;
  regions_[reinterpret_cast<uintptr_t>(base)] = std::move(r);
  *out = base;
  return CUDA_SUCCESS;
}

CUresult Fake::free_reservation(const void* base, size_t bytes) {
  auto it = regions_.find(reinterpret_cast<uintptr_t>(base));
  if (it == regions_.end() || !it->second.reservation || it->second.bytes != bytes) return CUDA_ERROR_INVALID_VALUE;
  if (!it->second.mappings.empty()) return CUDA_ERROR_INVALID_VALUE;  // unmap first
  munmap(it->second.mapping, it->second.mapping_bytes);
  regions_.erase(it);
  return CUDA_SUCCESS;
}

CUresult Fake::create(size_t bytes, CUmemGenericAllocationHandle* out) {
  if (bytes == 0 || bytes % kGranule != 0) return CUDA_ERROR_INVALID_VALUE;
  *out = next_handle_++;
  physical_[*out] = {bytes, false, false};
  return CUDA_SUCCESS;
}

CUresult Fake::release_physical(CUmemGenericAllocationHandle handle) {
  auto it = physical_.find(handle);
  if (it == physical_.end() || it->second.released) return CUDA_ERROR_INVALID_VALUE;
  if (it->second.mapped)
    it->second.released = true;  // freed when unmapped
  else
    physical_.erase(it);
  return CUDA_SUCCESS;
}

CUresult Fake::map(const void* at, size_t bytes, CUmemGenericAllocationHandle handle) {
  size_t offset = 0;
  Region* r = reservation_at(at, &offset);
  auto h = physical_.find(handle);
  if (!r || h == physical_.end() || h->second.released || offset % kGranule != 0 || bytes == 0 ||
      offset + bytes > r->bytes)
    return CUDA_ERROR_INVALID_VALUE;
  if (h->second.mapped || bytes != h->second.bytes) return CUDA_ERROR_NOT_SUPPORTED;  // the fake maps a whole allocation once
  auto next = r->mappings.lower_bound(offset);
  if (next != r->mappings.end() && next->first < offset + bytes) return CUDA_ERROR_INVALID_VALUE;  // already mapped
  if (next != r->mappings.begin() && std::prev(next)->first + std::prev(next)->second.bytes > offset)
    return CUDA_ERROR_INVALID_VALUE;
  r->mappings[offset] = {bytes, handle, false};
  h->second.mapped = true;
  mapped_bytes += static_cast<int64_t>(bytes);
  peak_mapped_bytes = std::max(peak_mapped_bytes, mapped_bytes);
  return CUDA_SUCCESS;
}

CUresult Fake::unmap(const void* at, size_t bytes) {
  size_t offset = 0;
  Region* r = reservation_at(at, &offset);
  if (!r || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  // Whole mappings only, as the driver requires.
  std::vector<std::map<size_t, Mapping>::iterator> whole;
  for (size_t covered = offset; covered < offset + bytes;) {
    auto m = r->mappings.find(covered);
    if (m == r->mappings.end()) return CUDA_ERROR_INVALID_VALUE;
    whole.push_back(m);
    covered += m->second.bytes;
  }
  if (whole.back()->first + whole.back()->second.bytes != offset + bytes) return CUDA_ERROR_INVALID_VALUE;
  for (auto m : whole) {
    char* p = r->base + m->first;
    madvise(p, m->second.bytes, MADV_DONTNEED);
    mprotect(p, m->second.bytes, PROT_NONE);
    auto h = physical_.find(m->second.handle);
    h->second.mapped = false;
    if (h->second.released) physical_.erase(h);
    mapped_bytes -= static_cast<int64_t>(m->second.bytes);
    r->mappings.erase(m);
  }
  return CUDA_SUCCESS;
}

CUresult Fake::set_access(const void* at, size_t bytes) {
  size_t offset = 0;
  Region* r = reservation_at(at, &offset);
  if (!r || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  for (size_t covered = offset; covered < offset + bytes;) {  // the range must be mapped, without holes
    auto m = r->mappings.upper_bound(covered);
    if (m == r->mappings.begin()) return CUDA_ERROR_INVALID_VALUE;
    --m;
    if (m->first + m->second.bytes <= covered) return CUDA_ERROR_INVALID_VALUE;
    covered = m->first + m->second.bytes;
  }
  for (auto& [o, m] : r->mappings) {
    if (m.accessible || o + m.bytes <= offset || o >= offset + bytes) continue;
    mprotect(r->base + o, m.bytes, PROT_READ | PROT_WRITE);
    std::memset(r->base + o, 0xff, m.bytes);  // a read before any write shows up
    m.accessible = true;
  }
  return CUDA_SUCCESS;
}

bool Fake::pinned(const void* p, size_t bytes) const {
  auto at = reinterpret_cast<uintptr_t>(p);
  auto it = regions_.upper_bound(at);
  if (it == regions_.begin()) return false;
  --it;
  return !it->second.device && at + bytes <= it->first + it->second.bytes;
}

Stream& Fake::stream(CUstream s) { return s ? s->stream : default_stream_; }

void Fake::remove_stream(Stream* s) { streams_.erase(std::remove(streams_.begin(), streams_.end(), s), streams_.end()); }

CUresult Fake::submit(CUstream s, Op op) {
  Stream& st = stream(s);
  if (st.capturing) {
    if (st.capture_invalidated) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    st.captured->push_back(std::move(op));
    return CUDA_SUCCESS;
  }
  if (defer) {
    st.pending.push_back(std::move(op));
    return CUDA_SUCCESS;
  }
  return op();
}

CUresult Fake::synchronize(CUstream s) {
  Stream& st = stream(s);
  std::vector<Op> work = std::move(st.pending);
  st.pending.clear();
  for (Op& op : work) {
    if (sticky != CUDA_SUCCESS) break;
    op();
  }
  return sticky;
}

CUresult Fake::forbid_during_capture() {
  // A relaxed capture allows what the others forbid.
  auto strict = [](const Stream& s) { return s.capturing && s.capture_mode != CU_STREAM_CAPTURE_MODE_RELAXED; };
  bool any = strict(default_stream_);
  for (Stream* s : streams_) any |= strict(*s);
  if (!any) return CUDA_SUCCESS;
  for (Stream* s : streams_)
    if (strict(*s)) s->capture_invalidated = true;
  return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
}

CUresult Fake::precondition(bool needs_context) const {
  if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (sticky != CUDA_SUCCESS) return sticky;
  if (needs_context && !context_current) return CUDA_ERROR_INVALID_CONTEXT;
  return CUDA_SUCCESS;
}

CUresult Fake::fail(CUresult error, const std::string& why) {
  std::fprintf(stderr, "napkin fake CUDA: %s\n", why.c_str());
  if (sticky == CUDA_SUCCESS) sticky = error;
  return error;
}

}  // namespace napkin::fake_cuda
