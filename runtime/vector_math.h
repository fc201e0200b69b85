// Vectorizable row math the runtime's fused kernels share (runtime/attention.cpp,
// runtime/classifier.cpp): a polynomial exp, row sums and maxima in a fixed
// lane order, and the function-multiversioning attribute their loops are
// compiled under. Header-only and always_inline, so that each multiversioned
// clone compiles its own copy for its target.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

namespace napkin::runtime {

// exp(x) in f32 for the softmax: Cody-Waite range reduction x = n ln2 + r,
// |r| <= ln2/2, Cephes' degree-7 polynomial for e^r (about 1 ulp), times
// 2^n built in the exponent bits. Branch-free so loops over it vectorize;
// below the smallest normal result (-87.34, -inf included) it is 0.
[[gnu::always_inline]] inline float exp_poly(float x) {
  float xc = x > -87.33654f ? x : -87.33654f;  // by value: std::min/max's references block vectorization
  xc = xc < 88.0f ? xc : 88.0f;
  const float round_magic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer in the low bits
  const float t = xc * 1.44269504088896341f + round_magic;
  const float n = t - round_magic;
  float r = xc - n * 0.693359375f;  // ln2's high part: n * it is exact
  r = r - n * -2.12194440e-4f;      // ln2's low part
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  const int32_t e = std::bit_cast<int32_t>(t) - std::bit_cast<int32_t>(round_magic);
  const float two_n = std::bit_cast<float>((e + 127) << 23);
  return x < -87.33654f ? 0.0f : p * two_n;
}

[[gnu::always_inline]] inline double exp_any(double x) { return std::exp(x); }
[[gnu::always_inline]] inline float exp_any(float x) { return exp_poly(x); }

// Sum and max of a row in eight interleaved lanes (a fixed order the
// compiler can keep in one vector register; a plain left-to-right float sum
// does not vectorize without -ffast-math).
template <class A>
[[gnu::always_inline]] inline A row_sum(const A* x, int64_t n) {
  A lane[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) lane[k] += x[i + k];
  for (int k = 0; i < n; ++i, ++k) lane[k] += x[i];
  return ((lane[0] + lane[4]) + (lane[1] + lane[5])) + ((lane[2] + lane[6]) + (lane[3] + lane[7]));
}
template <class A>
[[gnu::always_inline]] inline A row_max(const A* x, int64_t n) {
  const A ninf = -std::numeric_limits<A>::infinity();
  A lane[8] = {ninf, ninf, ninf, ninf, ninf, ninf, ninf, ninf};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) lane[k] = std::max(lane[k], x[i + k]);
  for (int k = 0; i < n; ++i, ++k) lane[k] = std::max(lane[k], x[i]);
  return std::max(std::max(std::max(lane[0], lane[4]), std::max(lane[1], lane[5])),
                  std::max(std::max(lane[2], lane[6]), std::max(lane[3], lane[7])));
}

// The element-wise tile loops (softmax, dS, widening, narrowing) are
// compiled for AVX-512 and AVX2 besides the baseline x86-64 (SSE2) and the
// best the CPU has is picked at load time (GCC function multiversioning), so
// the binary runs on any x86-64. The bodies are always_inline templates so
// that each clone compiles its own copy for its target. Each clone computes the same bits: no FMA
// contraction (-std=c++20 sets -ffp-contract=off) and fixed-order lanes.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define NAPKIN_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define NAPKIN_VECTOR_CLONES
#endif

// Loops that run only where AMX is (runtime/amx.cpp, attention_amx.cpp):
// every such CPU has AVX-512 F, BW, VL and DQ (amx::available() checks), so
// they are compiled for it alone, 512 bits wide (GCC's default tuning for
// AVX-512 targets prefers 256; Clang spells the width differently).
#if defined(__clang__)
#define NAPKIN_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq"), min_vector_width(512)))
#else
#define NAPKIN_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,prefer-vector-width=512")))
#endif

}  // namespace napkin::runtime
