// SHA-256 (FIPS 180-4) of a byte string, for the CUDA kernel cache's keys
// (codegen/cuda/kernel_cache.h) and its entries' checksums. A cryptographic
// hash because a key collision would silently run another program's kernels:
// with 256-bit digests the chance that any two of n entries collide is about
// n^2 / 2^257, i.e. never for any cache a person will have.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace napkin::codegen::cuda {

class Sha256 {
 public:
  Sha256();
  void update(std::string_view bytes);
  // The digest of everything updated so far; the object is spent afterwards.
  std::array<uint8_t, 32> finish();

 private:
  void compress(const uint8_t* block);
  std::array<uint32_t, 8> state_;
  std::array<uint8_t, 64> buffer_{};
  size_t buffered_ = 0;
  uint64_t length_ = 0;  // bytes
};

// The digest as 64 lowercase hex digits.
std::string hex(const std::array<uint8_t, 32>& digest);

}  // namespace napkin::codegen::cuda
