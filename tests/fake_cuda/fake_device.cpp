// The fake GPU's memory and streams (fake_cuda.h defines the terms).
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "fake_cuda/fake_cuda.h"

namespace napkin::fake_cuda {

namespace {

size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

}  // namespace

Fake& Fake::get() {
  static Fake fake;
  return fake;
}

Fake::Fake() {
  if (const char* a = std::getenv("NAPKIN_FAKE_CUDA_ARCH"); a && std::string_view(a) == "sm_80") arch = 80;
  if (const char* d = std::getenv("NAPKIN_FAKE_CUDA_DEFER"); d && std::string_view(d) == "1") defer = true;
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
  regions_[reinterpret_cast<uintptr_t>(base)] = {base, bytes, true, m, mapped};
  *out = base;
  return CUDA_SUCCESS;
}

CUresult Fake::alloc_pinned(size_t bytes, char** out) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t mapped = align_up(std::max<size_t>(bytes, 1), page);
  void* m = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  regions_[reinterpret_cast<uintptr_t>(m)] = {static_cast<char*>(m), bytes, false, m, mapped};
  *out = static_cast<char*>(m);
  return CUDA_SUCCESS;
}

CUresult Fake::free_region(const void* base, bool device) {
  auto it = regions_.find(reinterpret_cast<uintptr_t>(base));
  if (it == regions_.end() || it->second.device != device || !it->second.mapping) return CUDA_ERROR_INVALID_VALUE;
  munmap(it->second.mapping, it->second.mapping_bytes);
  regions_.erase(it);
  return CUDA_SUCCESS;
}

void Fake::add_foreign_device_region(char* base, size_t bytes) {
  regions_[reinterpret_cast<uintptr_t>(base)] = {base, bytes, true, nullptr, 0};
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

const Region* Fake::device_region(const void* p, size_t bytes) const {
  auto at = reinterpret_cast<uintptr_t>(p);
  auto it = regions_.upper_bound(at);
  if (it == regions_.begin()) return nullptr;
  --it;
  const Region& r = it->second;
  if (!r.device || at < it->first || at + bytes > it->first + r.bytes || at + bytes < at) return nullptr;
  return &r;
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
