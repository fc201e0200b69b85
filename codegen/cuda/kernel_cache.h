// The on-disk cache of NVRTC's output (codegen/cuda/nvrtc_compile.h): a
// rebuild of an unchanged model skips NVRTC, which takes seconds for a
// transformer's kernels.
//
// Terms:
//  - key: the SHA-256 (codegen/cuda/sha256.h) of everything that decides
//    NVRTC's output: the cache format, NVRTC's version, the target arch, the
//    options in order, the translation unit's name and its source text.
//  - directory: $NAPKIN_CACHE_DIR if set, else cuda/ in the user's cache
//    root (codegen/host/private_cache.h): $XDG_CACHE_HOME/napkin/cuda, else
//    ~/.cache/napkin/cuda, else $TMPDIR/napkin-cache-UID/cuda.
//  - trust: a cubin in the cache is loaded into the trainer, so the cache
//    follows codegen/host/private_cache.h like the trainer cache: the
//    directory is made mode 0700, and one another user owns, others can
//    write, or that cannot be made is the user's error (std::runtime_error
//    naming it); an entry that is not a regular file of the user's that no
//    one else can write is a miss, rebuilt and replaced.
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
// An entry that cannot be written (a full disk) prints one warning per
// process and compiling goes on without storing it.
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

  // The entry for `key` if it is present, trusted and whole, else nullopt.
  // Throws std::runtime_error when the directory is not the user's own or
  // cannot be made (see "trust").
  std::optional<CachedKernels> load(const CacheKey& key) const;
  // Writes the entry; throws like load for the directory, and on another
  // failure warns (once per process) and returns false.
  bool store(const CacheKey& key, const CachedKernels& kernels) const;

  std::filesystem::path entry_path(const CacheKey& key) const;

 private:
  // Throws std::runtime_error when dir_ is not a private directory (made when
  // missing); checked once per KernelCache.
  void require_private_directory() const;

  std::filesystem::path dir_;
  mutable bool private_ = false;
};

}  // namespace napkin::codegen::cuda
