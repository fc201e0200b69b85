#include "codegen/cuda/kernel_cache.h"

#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string_view>
#include <system_error>
#include <vector>

#include "codegen/cuda/sha256.h"
#include "codegen/host/private_cache.h"

namespace napkin::codegen::cuda {

namespace {

constexpr std::string_view kMagic = "NPKNVRC1";
constexpr size_t kHeaderBytes = 8 + 32 + 8 + 8 + 32;

void put_u64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out += static_cast<char>(v >> (8 * i));
}

uint64_t get_u64(std::string_view in) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t(static_cast<uint8_t>(in[i])) << (8 * i);
  return v;
}

std::array<uint8_t, 32> checksum(const CachedKernels& k) {
  Sha256 h;
  h.update(k.cubin);
  h.update(k.ptx);
  return h.finish();
}

std::string_view bytes_of(const std::array<uint8_t, 32>& a) {
  return {reinterpret_cast<const char*>(a.data()), a.size()};
}

void warn_once(const std::string& message) {
  static std::atomic<bool> warned{false};
  if (!warned.exchange(true))
    std::cerr << "warning: " << message << "; compiling the CUDA kernels without the cache\n";
}

}  // namespace

std::filesystem::path default_kernel_cache_dir() {
  if (const char* d = std::getenv("NAPKIN_CACHE_DIR"); d && *d) return d;
  return host::user_cache_root() / "cuda";
}

void KernelCache::require_private_directory() const {
  if (private_) return;
  // In the user's cache root, the root first, as the trainer cache checks it:
  // a private cuda/ inside a directory others can write could be swapped.
  std::vector<std::filesystem::path> dirs;
  if (dir_ == host::user_cache_root() / "cuda") dirs.push_back(dir_.parent_path());
  dirs.push_back(dir_);
  for (const std::filesystem::path& d : dirs)
    if (std::string problem = host::private_directory_problem(d); !problem.empty())
      throw std::runtime_error(fmt::format("the CUDA kernel cache {}\n    hint: remove it, or set NAPKIN_CACHE_DIR "
                                           "to a directory of your own that only you can write (or --no-cache)",
                                           problem));
  private_ = true;
}

std::filesystem::path KernelCache::entry_path(const CacheKey& key) const { return dir_ / (hex(key) + ".nvrtc"); }

std::optional<CachedKernels> KernelCache::load(const CacheKey& key) const {
  require_private_directory();
  if (!host::untrusted_entry(entry_path(key)).empty()) return std::nullopt;  // absent, or not the user's own
  std::ifstream in(entry_path(key), std::ios::binary);
  if (!in) return std::nullopt;
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string file = ss.str();
  std::string_view f = file;
  if (f.size() < kHeaderBytes || f.substr(0, 8) != kMagic || f.substr(8, 32) != bytes_of(key)) return std::nullopt;
  uint64_t cubin_bytes = get_u64(f.substr(40)), ptx_bytes = get_u64(f.substr(48));
  // Compared without adding the sizes, which a corrupt header could overflow.
  uint64_t payload = f.size() - kHeaderBytes;
  if (cubin_bytes > payload || ptx_bytes != payload - cubin_bytes) return std::nullopt;
  CachedKernels k{std::string(f.substr(kHeaderBytes, cubin_bytes)), std::string(f.substr(kHeaderBytes + cubin_bytes))};
  if (bytes_of(checksum(k)) != f.substr(56, 32)) return std::nullopt;
  return k;
}

bool KernelCache::store(const CacheKey& key, const CachedKernels& kernels) const {
  require_private_directory();
  std::error_code ec;
  std::string header(kMagic);
  header += bytes_of(key);
  put_u64(header, kernels.cubin.size());
  put_u64(header, kernels.ptx.size());
  header += bytes_of(checksum(kernels));
  // A name no other writer uses, so racing builds never write one file.
  std::random_device rd;
  std::filesystem::path tmp = dir_ / (hex(key) + ".tmp." + std::to_string(getpid()) + "." + std::to_string(rd()));
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << header << kernels.cubin << kernels.ptx;
    out.close();
    if (!out) {
      std::string why = std::strerror(errno);
      std::filesystem::remove(tmp, ec);
      warn_once("cannot write the CUDA kernel cache entry " + tmp.string() + ": " + why);
      return false;
    }
  }
  std::filesystem::rename(tmp, entry_path(key), ec);
  if (ec) {
    std::string why = ec.message();
    std::filesystem::remove(tmp, ec);
    warn_once("cannot write the CUDA kernel cache entry " + entry_path(key).string() + ": " + why);
    return false;
  }
  return true;
}

}  // namespace napkin::codegen::cuda
