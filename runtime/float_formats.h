// Bit-exact software conversions between float32 and the low-precision formats
// napkin trains in: bfloat16, IEEE fp16, and the OCP 8-bit formats E4M3 ("fn":
// no infinities) and E5M2. The reference interpreter and the generated trainers
// use them to emulate low precision exactly, on any machine.
//
// float32 -> narrow rounds to nearest, ties to even, with subnormals, like
// torch's tensor.to(dtype). Values that round past the largest finite value:
//   bf16, f16, f8e5m2  -> +-inf          (torch, IEEE)
//   f8e4m3             -> NaN            (torch's float8_e4m3fn: the format has no inf)
// unless `saturate` is set (fp8 only), which clamps them, infinities included, to
// +-max (448 / 57344): CUDA's __NV_SATFINITE mode, used by fp8 training recipes
// that scale tensors into range. NaN always stays NaN: one quiet NaN per sign,
// payload dropped, as torch's converters do (torch itself is not consistent about
// NaN bits, so only NaN-ness is worth relying on):
//   f16    -> S.11111.1000000000  (torch 1.13: 0x7E00 / 0xFE00)
//   bf16   -> S.11111111.1000000  (c10::BFloat16's 0x7FC0, with the sign kept)
//   f8e4m3 -> S.1111.111, f8e5m2 -> S.11111.11  (c10's float8 converters)
// narrow -> float32 is exact (every value of these formats is a float32).
#pragma once

#include <bit>
#include <cstdint>

namespace napkin::runtime {

uint16_t float_to_bf16_bits(float x);
// bf16 is the top half of a float32, so widening is a shift (inline: kernels
// widen whole tiles with it).
inline float bf16_bits_to_float(uint16_t bits) { return std::bit_cast<float>(uint32_t(bits) << 16); }
float round_to_bf16(float x);
// float_to_bf16_bits inline, for kernels that narrow whole tensors element by
// element (the same bits, NaN included; float_formats_test compares them).
inline uint16_t float_to_bf16_bits_inline(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  if ((u & 0x7FFFFFFF) > 0x7F800000) return uint16_t((u >> 16 & 0x8000) | 0x7FC0);
  return uint16_t((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}

uint16_t float_to_f16_bits(float x);
float f16_bits_to_float(uint16_t bits);
float round_to_f16(float x);

uint8_t float_to_f8e4m3_bits(float x, bool saturate = false);
float f8e4m3_bits_to_float(uint8_t bits);
float round_to_f8e4m3(float x, bool saturate = false);

uint8_t float_to_f8e5m2_bits(float x, bool saturate = false);
float f8e5m2_bits_to_float(uint8_t bits);
float round_to_f8e5m2(float x, bool saturate = false);

}  // namespace napkin::runtime
