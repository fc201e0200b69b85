#include "runtime/float_formats.h"

#include <algorithm>
#include <bit>
#include <cmath>

namespace napkin::runtime {

namespace {

// A narrow binary format, described by its field widths. One encoder and one
// decoder serve all four formats, so they cannot drift apart.
struct Format {
  int exponent_bits;
  int mantissa_bits;  // stored fraction bits, at most 10 (see round_magnitude)
  bool finite_only;   // OCP "fn": no inf; only S.1..1.1..1 is NaN
  uint32_t nan_mantissa;  // of the one NaN we produce (see the header)

  int bias() const { return (1 << (exponent_bits - 1)) - 1; }
  int min_exponent() const { return 1 - bias(); }
  uint32_t magnitude_bits() const { return uint32_t(exponent_bits + mantissa_bits); }
  uint32_t all_ones() const { return (1u << magnitude_bits()) - 1; }
  // All-ones exponent field: inf (zero mantissa) and NaNs in IEEE formats.
  uint32_t exponent_ones() const { return ((1u << exponent_bits) - 1) << mantissa_bits; }
  uint32_t max_finite_code() const { return finite_only ? all_ones() - 1 : exponent_ones() - 1; }
};

constexpr Format kBF16{8, 7, false, 0x40};
constexpr Format kF16{5, 10, false, 0x200};
constexpr Format kE4M3{4, 3, true, 0x7};
constexpr Format kE5M2{5, 2, false, 0x3};

constexpr uint32_t kF32Inf = 0x7F800000;
constexpr uint32_t kF32Fraction = 0x007FFFFF;
constexpr int kF32FractionBits = 23;

// What a value too large for the format becomes (see the header).
uint32_t overflow_code(const Format& f, bool saturate) {
  if (saturate) return f.max_finite_code();
  return f.finite_only ? f.all_ones() : f.exponent_ones();
}

// Rounds a finite float32 magnitude to the format (nearest, ties to even) and
// returns its code, which may exceed max_finite_code() when the value overflows.
// The code is (exponent steps above the subnormal range << mantissa_bits) plus the
// rounded significand, so a significand that rounds up to the next power of two
// carries into the exponent field by itself, subnormal -> normal included.
uint32_t round_magnitude(const Format& f, uint32_t magnitude) {
  const int biased = int(magnitude >> kF32FractionBits);
  const uint32_t significand = (magnitude & kF32Fraction) | (biased ? 1u << kF32FractionBits : 0);
  const int exponent = std::max(biased, 1) - 127;  // value = significand * 2^(exponent - 23)
  const int target = std::max(exponent, f.min_exponent());
  const int shift = target - exponent + kF32FractionBits - f.mantissa_bits;  // >= 13
  // significand < 2^24, so from shift 25 on it is below half the smallest step.
  if (shift >= 25) return 0;
  uint32_t q = significand >> shift;
  const uint32_t rest = significand & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  if (rest > half || (rest == half && (q & 1))) ++q;
  return (uint32_t(target - f.min_exponent()) << f.mantissa_bits) + q;
}

uint32_t encode(const Format& f, float x, bool saturate) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  const uint32_t sign = (u >> 31) << f.magnitude_bits();
  const uint32_t magnitude = u & 0x7FFFFFFF;
  if (magnitude > kF32Inf) return sign | f.exponent_ones() | f.nan_mantissa;
  if (magnitude == kF32Inf) return sign | overflow_code(f, saturate);
  const uint32_t code = round_magnitude(f, magnitude);
  return sign | (code > f.max_finite_code() ? overflow_code(f, saturate) : code);
}

float decode(const Format& f, uint32_t code) {
  const bool negative = (code >> f.magnitude_bits()) & 1;
  const uint32_t magnitude = code & f.all_ones();
  const uint32_t exponent_field = magnitude >> f.mantissa_bits;
  const uint32_t mantissa = magnitude & ((1u << f.mantissa_bits) - 1);
  const bool special = f.finite_only ? magnitude == f.all_ones() : magnitude >= f.exponent_ones();
  if (special) {  // inf, or NaN with its payload moved to the top of float32's fraction
    const uint32_t bits = kF32Inf | (mantissa << (kF32FractionBits - f.mantissa_bits));
    return std::bit_cast<float>((negative ? 0x80000000u : 0u) | bits);
  }
  const float value =
      exponent_field == 0
          ? std::ldexp(float(mantissa), f.min_exponent() - f.mantissa_bits)
          : std::ldexp(float(mantissa | (1u << f.mantissa_bits)),
                       int(exponent_field) - f.bias() - f.mantissa_bits);
  return negative ? -value : value;
}

}  // namespace

uint16_t float_to_bf16_bits(float x) { return uint16_t(encode(kBF16, x, false)); }
float round_to_bf16(float x) { return bf16_bits_to_float(float_to_bf16_bits(x)); }

uint16_t float_to_f16_bits(float x) { return uint16_t(encode(kF16, x, false)); }
float f16_bits_to_float(uint16_t bits) { return decode(kF16, bits); }
float round_to_f16(float x) { return f16_bits_to_float(float_to_f16_bits(x)); }

uint8_t float_to_f8e4m3_bits(float x, bool saturate) { return uint8_t(encode(kE4M3, x, saturate)); }
float f8e4m3_bits_to_float(uint8_t bits) { return decode(kE4M3, bits); }
float round_to_f8e4m3(float x, bool saturate) {
  return f8e4m3_bits_to_float(float_to_f8e4m3_bits(x, saturate));
}

uint8_t float_to_f8e5m2_bits(float x, bool saturate) { return uint8_t(encode(kE5M2, x, saturate)); }
float f8e5m2_bits_to_float(uint8_t bits) { return decode(kE5M2, bits); }
float round_to_f8e5m2(float x, bool saturate) {
  return f8e5m2_bits_to_float(float_to_f8e5m2_bits(x, saturate));
}

}  // namespace napkin::runtime
