// The runtime's random numbers: Philox4x32-10 (Salmon et al., SC11; the
// generator of Random123 and cuRAND), counter-based, so any draw can be
// recomputed from (seed, stream, position) alone. napkin's reference
// interpreter and the generated trainers (CPU, CUDA) initialize parameters with
// it, so a model starts from the same numbers on every backend.
//
// Layout of one generator Rng(seed, stream):
//   key     = {seed & 0xffffffff, seed >> 32}
//   counter = {block & 0xffffffff, block >> 32, stream & 0xffffffff, stream >> 32}
// where block = 0, 1, 2, ... Each block gives four 32-bit words, returned by
// next_u32() in order (word 0 first). This is cuRAND's arrangement: the stream
// plays the role of curand_init's subsequence.
//
// Derived draws, all consuming a fixed number of words except trunc_normal:
//   uniform01()  two words (a, b): k = a * 2^20 + (b >> 12), a 52-bit integer;
//                returns (k + 0.5) * 2^-52, an odd multiple of 2^-53 strictly
//                inside (0, 1). Both steps are exact in double, so the result
//                is bit-identical on every IEEE-754 machine.
//   normal()     four words (two uniforms u1, u2; one Philox block when
//                aligned): Box-Muller, sqrt(-2 ln u1) * cos(2 pi u2). The sine
//                half is discarded so every normal costs the same and the n-th
//                normal of a stream is its n-th block.
//   trunc_normal rejection: normal() draws until mean + std * z lies in
//                [lo, hi] (absolute bounds).
// The words and uniforms are exactly reproducible anywhere. normal() goes
// through log and cos, which libm and CUDA each compute to within an ulp but
// not always identically; a generated trainer that must match bit for bit
// initializes on the host with this code (an ulp of double rarely survives the
// rounding to f32 in any case).
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace napkin::runtime {

// Philox4x32's round multipliers and key schedule (Weyl) constants. The code
// generators emit the same rounds (codegen/cpu/scalar_ops.cpp, the CUDA
// prelude) for dropout's masks, which must match these bits.
inline constexpr uint32_t kPhiloxMul0 = 0xD2511F53u;
inline constexpr uint32_t kPhiloxMul1 = 0xCD9E8D57u;
inline constexpr uint32_t kPhiloxWeyl0 = 0x9E3779B9u;  // golden ratio
inline constexpr uint32_t kPhiloxWeyl1 = 0xBB67AE85u;  // sqrt(3) - 1
inline constexpr int kPhiloxRounds = 10;

// One Philox4x32-10 block: 10 rounds of the counter under the key (Random123's
// philox4x32_R(10, ctr, key)).
std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key);

class Rng {
 public:
  Rng(uint64_t seed, uint64_t stream);

  uint32_t next_u32();
  // The next word is word 0 of block `block` (the n-th normal() of a stream
  // starts at block n), so a range of normals can be drawn anywhere, e.g. in
  // parallel, with the same bits.
  void seek(uint64_t block);
  // In (0, 1): 52 random bits from two words, see above.
  double uniform01();
  // Standard normal, Box-Muller; four words per call.
  double normal();
  // mean + std * z resampled until it lies in [lo, hi] (absolute bounds, as
  // torch.nn.init.trunc_normal_). Throws std::invalid_argument unless std > 0
  // and lo < hi, and std::runtime_error after 100000 rejections in a row (an
  // interval with almost no probability mass, e.g. 50 std from the mean).
  double trunc_normal(double mean, double std, double lo, double hi);

 private:
  std::array<uint32_t, 2> key_;
  uint64_t stream_;
  uint64_t block_ = 0;           // the next block to compute
  std::array<uint32_t, 4> buf_{};
  int used_ = 4;                 // words of buf_ already returned
};

// FNV-1a, 64 bits: the stream of a parameter is stream_for_name(its name), so
// its initial values depend only on (seed, name): adding or reordering
// parameters does not change the others.
uint64_t stream_for_name(std::string_view name);

// The rng tensor's words (docs/runtime.md; ir/rng.h defines their use): the
// seed's low and high 32 bits, the step (0-based: the index the data loader
// gets), and 1 while training, 0 for an eval forward (dropout off).
std::array<int64_t, 4> rng_tensor_words(uint64_t seed, int64_t step, bool training);

}  // namespace napkin::runtime
