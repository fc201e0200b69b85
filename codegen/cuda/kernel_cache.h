// The on-disk cache of NVRTC's output (codegen/cuda/nvrtc_compile.h): a
// rebuild of an unchanged model skips NVRTC, which takes seconds for a
// transformer's kernels.
//
// Terms:
//  - key: the SHA-256 (codegen/cuda/sha256.h) of everything that decides
//    NVRTC's output: the cache format, NVRTC's version, the target arch, the
//    options in order, the translation unit's name and its source text.
//  - directory: $NAPKIN_CACHE_DIR if set, else $XDG_CACHE_HOME/napkin/cuda,
//    else ~/.cache/napkin/cuda.
//  - entry: one file per key, DIRECTORY/KEYHEX.nvrtc:
//        magic "NPKNVRC1" (8 bytes) | key (32) | cubin bytes (u64 LE) |
//        PTX bytes (u64 LE) | SHA-256 of cubin then PTX (32) | cubin | PTX
//    An entry is trusted only if the magic and key match, the file is exactly
//    as long as the header says, and the checksum matches; anything else
//    (truncated by a crash, corrupted, from another format) is a miss, and
//    the fresh compile overwrites it.
//  - store: written to a temporary file in the directory, then renamed over
//    the entry, so a reader sees a whole entry or none (two builds racing on
//    one key both write the same bytes).
// An unusable directory (unwritable, a file in the way) prints one warning
// per process and compiling goes on without the cache.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

namespace napkin::codegen::cuda {

using CacheKey = std::array<uint8_t, 32>;

struct CachedKernels {
  std::string cubin;
  std::string ptx;
};

std::filesystem::path default_kernel_cache_dir();

class KernelCache {
 public:
  explicit KernelCache(std::filesystem::path dir) : dir_(std::move(dir)) {}

  // The entry for `key` if it is present and whole, else nullopt.
  std::optional<CachedKernels> load(const CacheKey& key) const;
  // Writes the entry; on failure warns (once per process) and returns false.
  bool store(const CacheKey& key, const CachedKernels& kernels) const;

  std::filesystem::path entry_path(const CacheKey& key) const;

 private:
  std::filesystem::path dir_;
};

}  // namespace napkin::codegen::cuda
