#include "runtime/rng.h"

#include <cmath>
#include <stdexcept>
#include <string>

namespace napkin::runtime {

namespace {

void mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  uint64_t p = static_cast<uint64_t>(a) * b;
  hi = static_cast<uint32_t>(p >> 32);
  lo = static_cast<uint32_t>(p);
}

}  // namespace

std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> c, std::array<uint32_t, 2> k) {
  for (int round = 0; round < kPhiloxRounds; ++round) {
    if (round > 0) {  // the key schedule: a Weyl sequence, bumped before rounds 2..10
      k[0] += kPhiloxWeyl0;
      k[1] += kPhiloxWeyl1;
    }
    uint32_t hi0, lo0, hi1, lo1;
    mulhilo(kPhiloxMul0, c[0], hi0, lo0);
    mulhilo(kPhiloxMul1, c[2], hi1, lo1);
    c = {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
  }
  return c;
}

Rng::Rng(uint64_t seed, uint64_t stream)
    : key_{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)}, stream_(stream) {}

void Rng::seek(uint64_t block) {
  block_ = block;
  used_ = 4;
}

uint32_t Rng::next_u32() {
  if (used_ == 4) {
    buf_ = philox4x32_10({static_cast<uint32_t>(block_), static_cast<uint32_t>(block_ >> 32),
                          static_cast<uint32_t>(stream_), static_cast<uint32_t>(stream_ >> 32)},
                         key_);
    ++block_;
    used_ = 0;
  }
  return buf_[used_++];
}

double Rng::uniform01() {
  uint64_t a = next_u32();
  uint64_t b = next_u32();
  uint64_t k = (a << 20) | (b >> 12);  // 52 bits
  // k + 0.5 has at most 53 significant bits and 2^-52 is a power of two: both exact.
  return (static_cast<double>(k) + 0.5) * 0x1p-52;
}

double Rng::normal() {
  double u1 = uniform01();
  double u2 = uniform01();
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(kTwoPi * u2);
}

double Rng::trunc_normal(double mean, double std, double lo, double hi) {
  if (!(std > 0) || !(lo < hi))
    throw std::invalid_argument("trunc_normal needs std > 0 and lo < hi, got std " + std::to_string(std) +
                                ", [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  for (int attempt = 0; attempt < 100000; ++attempt) {
    double x = mean + std * normal();
    if (x >= lo && x <= hi) return x;
  }
  throw std::runtime_error("trunc_normal: no sample of N(" + std::to_string(mean) + ", " + std::to_string(std) +
                           "^2) fell in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                           "] in 100000 draws; the interval holds almost no probability");
}

std::array<int64_t, 4> rng_tensor_words(uint64_t seed, int64_t step, bool training) {
  return {static_cast<int64_t>(seed & 0xffffffffu), static_cast<int64_t>(seed >> 32), step, training ? 1 : 0};
}

uint64_t stream_for_name(std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV offset basis
  for (unsigned char c : name) {
    h ^= c;
    h *= 0x100000001b3ull;  // FNV prime
  }
  return h;
}

}  // namespace napkin::runtime
