// Rotary position embeddings' frequencies, tables and rotation (runtime/rope.h).
#include "runtime/rope.h"

#include <cmath>
#include <numbers>

namespace napkin::runtime {

std::vector<float> rope_inv_freq(const RopeDesc& d) {
  const int64_t half = d.dim / 2;
  std::vector<float> inv(static_cast<size_t>(half));
  for (int64_t j = 0; j < half; ++j) {
    // transformers: 1.0 / (base ** (arange(0, dim, 2).float() / dim)), each step in f32.
    const float exponent = static_cast<float>(2 * j) / static_cast<float>(d.dim);
    const float power = static_cast<float>(std::pow(static_cast<double>(static_cast<float>(d.theta)), static_cast<double>(exponent)));
    inv[static_cast<size_t>(j)] = 1.0f / power;
  }
  if (d.factor <= 0) return inv;
  // Llama 3.1 (transformers' _compute_llama3_parameters), in f32 as there.
  const float factor = static_cast<float>(d.factor);
  const float low = static_cast<float>(d.low_freq_factor), high = static_cast<float>(d.high_freq_factor);
  const float context = static_cast<float>(d.original_context);
  const float low_freq_wavelen = context / low, high_freq_wavelen = context / high;
  const float two_pi = static_cast<float>(2 * std::numbers::pi);
  for (float& f : inv) {
    const float wavelen = two_pi / f;
    if (wavelen < high_freq_wavelen) continue;  // high frequencies: kept
    if (wavelen > low_freq_wavelen) {  // low frequencies: divided by the factor
      f = f / factor;
      continue;
    }
    // Between: interpolated, with transformers' order of operations.
    const float smooth = (context / wavelen - low) / (high - low);
    f = (1 - smooth) * f / factor + smooth * f;
  }
  return inv;
}

float rope_angle(float inv_freq, int64_t position) { return static_cast<float>(position) * inv_freq; }

RopeTable make_rope_table(const RopeDesc& d, int64_t positions) {
  RopeTable t;
  t.positions = positions;
  t.half = d.dim / 2;
  const std::vector<float> inv = rope_inv_freq(d);
  t.cos.resize(static_cast<size_t>(positions * t.half));
  t.sin.resize(t.cos.size());
  for (int64_t p = 0; p < positions; ++p)
    for (int64_t j = 0; j < t.half; ++j) {
      const double a = rope_angle(inv[static_cast<size_t>(j)], p);
      t.cos[static_cast<size_t>(p * t.half + j)] = static_cast<float>(std::cos(a));
      t.sin[static_cast<size_t>(p * t.half + j)] = static_cast<float>(std::sin(a));
    }
  return t;
}

namespace {

template <class T>
void rotate(RopeStyle style, int64_t dim, const float* cos, const float* sin, bool inverse, T* row) {
  const int64_t half = dim / 2;
  for (int64_t j = 0; j < half; ++j) {
    const int64_t i1 = style == RopeStyle::Half ? j : 2 * j;
    const int64_t i2 = style == RopeStyle::Half ? j + half : 2 * j + 1;
    const T c = cos[j], s = inverse ? -static_cast<T>(sin[j]) : static_cast<T>(sin[j]);
    const T x1 = row[i1], x2 = row[i2];
    row[i1] = x1 * c - x2 * s;
    row[i2] = x2 * c + x1 * s;
  }
}

}  // namespace

void rope_rotate_row(RopeStyle style, int64_t dim, const float* cos, const float* sin, bool inverse, float* row) {
  rotate(style, dim, cos, sin, inverse, row);
}
void rope_rotate_row(RopeStyle style, int64_t dim, const float* cos, const float* sin, bool inverse, double* row) {
  rotate(style, dim, cos, sin, inverse, row);
}

}  // namespace napkin::runtime
