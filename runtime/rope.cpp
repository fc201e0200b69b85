// Rotary position embeddings' frequencies, tables and rotation (runtime/rope.h).
#include "runtime/rope.h"

#include <cmath>
#include <numbers>
#include <string>

#include "runtime/error.h"
#include "runtime/float_formats.h"

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

void rope_cos_sin(const std::vector<float>& inv_freq, int64_t position, float* cos, float* sin) {
  for (size_t j = 0; j < inv_freq.size(); ++j) {
    const double a = rope_angle(inv_freq[j], position);
    cos[j] = static_cast<float>(std::cos(a));
    sin[j] = static_cast<float>(std::sin(a));
  }
}

RopeTable make_rope_table(const RopeDesc& d, int64_t positions) {
  RopeTable t;
  t.positions = positions;
  t.half = d.dim / 2;
  const std::vector<float> inv = rope_inv_freq(d);
  t.cos.resize(static_cast<size_t>(positions * t.half));
  t.sin.resize(t.cos.size());
  for (int64_t p = 0; p < positions; ++p) rope_cos_sin(inv, p, t.cos.data() + p * t.half, t.sin.data() + p * t.half);
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

namespace {

// How a row's elements are loaded into the arithmetic's type and stored back.
template <class T>
struct Same {
  static T load(T x) { return x; }
  static T store(T x) { return x; }
};
struct Bf16 {
  static float load(uint16_t x) { return bf16_bits_to_float(x); }
  static uint16_t store(float x) { return float_to_bf16_bits_inline(x); }
};
struct F16 {
  static float load(uint16_t x) { return f16_bits_to_float(x); }
  static uint16_t store(float x) { return float_to_f16_bits(x); }
};

// The rows [begin, end) of the tensor without its rotated axis, in row-major
// order: row r's x and y offsets and its index along seq_axis, by an odometer
// over the other axes.
template <class S, class A, class E>
void rotate_rows(const RopeKernelDesc& d, const std::vector<const float*>& cos, const std::vector<const float*>& sin,
                 const S* x, S* y, int64_t begin, int64_t end) {
  const int rank = static_cast<int>(d.sizes.size());
  std::vector<int64_t> y_strides(static_cast<size_t>(rank), 1), idx(static_cast<size_t>(rank), 0);
  for (int i = rank - 2; i >= 0; --i) y_strides[i] = y_strides[i + 1] * d.sizes[i + 1];
  int64_t rest = begin;
  for (int i = rank - 1; i >= 0; --i) {
    if (i == d.axis) continue;
    idx[i] = rest % d.sizes[i];
    rest /= d.sizes[i];
  }
  const int64_t dim = d.rope.dim, xs = d.x_strides[d.axis], ys = y_strides[d.axis];
  std::vector<A> row(static_cast<size_t>(dim));
  for (int64_t r = begin; r < end; ++r) {
    int64_t xo = 0, yo = 0;
    for (int i = 0; i < rank; ++i) xo += idx[i] * d.x_strides[i], yo += idx[i] * y_strides[i];
    for (int64_t j = 0; j < dim; ++j) row[j] = E::load(x[xo + j * xs]);
    const int64_t s = idx[d.seq_axis];
    rope_rotate_row(d.rope.style, dim, cos[s], sin[s], d.inverse, row.data());
    for (int64_t j = 0; j < dim; ++j) y[yo + j * ys] = E::store(row[j]);
    for (int i = rank - 1; i >= 0; --i) {
      if (i == d.axis) continue;
      if (++idx[i] < d.sizes[i]) break;
      idx[i] = 0;
    }
  }
}

}  // namespace

RopeKernel::RopeKernel(RopeKernelDesc desc, DType dtype) : d_(std::move(desc)), dtype_(dtype) {
  auto fail = [](const std::string& what) { throw Error("rope: " + what); };
  const int64_t rank = static_cast<int64_t>(d_.sizes.size());
  if (rank < 2 || d_.x_strides.size() != d_.sizes.size()) fail("needs at least 2 axes with one stride each");
  if (d_.axis < 0 || d_.axis >= rank || d_.seq_axis < 0 || d_.seq_axis >= rank || d_.axis == d_.seq_axis)
    fail("axis " + std::to_string(d_.axis) + " and seq_axis " + std::to_string(d_.seq_axis) + " must be distinct axes");
  if (d_.rope.dim != d_.sizes[d_.axis] || d_.rope.dim % 2 != 0 || d_.rope.dim <= 0)
    fail("the rotated axis has " + std::to_string(d_.sizes[d_.axis]) + " elements and dim is " +
         std::to_string(d_.rope.dim) + ": they must be equal and even");
  for (int64_t s : d_.sizes)
    if (s <= 0) fail("sizes must be positive");
  if (dtype_ != DType::F32 && dtype_ != DType::F64 && dtype_ != DType::BF16 && dtype_ != DType::F16)
    fail("rotates f32, f64, bf16 or f16, not " + std::string(dtype_name(dtype_)));
  if (!(d_.rope.theta > 0)) fail("theta must be positive");
  inv_freq_ = rope_inv_freq(d_.rope);
  table_ = make_rope_table(d_.rope, d_.sizes[d_.seq_axis]);
  for (int64_t p = 0; p < table_.positions; ++p) cos_rows_.push_back(table_.cos_row(p)), sin_rows_.push_back(table_.sin_row(p));
}

void RopeKernel::run(const void* x, const void* positions, void* y, ThreadPool& pool) const {
  // Explicit positions: each index along seq_axis takes its position's table
  // row, or a row of `extra` computed now for a position the table does not hold.
  std::vector<const float*> explicit_cos, explicit_sin;
  std::vector<float> extra;
  if (d_.explicit_positions) {
    const int64_t n = d_.sizes[d_.seq_axis], half = d_.rope.dim / 2;
    std::vector<int64_t> extra_at(static_cast<size_t>(n), -1);
    explicit_cos.resize(static_cast<size_t>(n)), explicit_sin.resize(static_cast<size_t>(n));
    for (int64_t s = 0; s < n; ++s) {
      const int64_t p =
          d_.positions_i64 ? static_cast<const int64_t*>(positions)[s] : static_cast<const int32_t*>(positions)[s];
      if (p >= 0 && p < table_.positions) {
        explicit_cos[s] = table_.cos_row(p), explicit_sin[s] = table_.sin_row(p);
        continue;
      }
      extra_at[s] = static_cast<int64_t>(extra.size());
      extra.resize(extra.size() + static_cast<size_t>(2 * half));
      rope_cos_sin(inv_freq_, p, extra.data() + extra_at[s], extra.data() + extra_at[s] + half);
    }
    for (int64_t s = 0; s < n; ++s)
      if (extra_at[s] >= 0) explicit_cos[s] = extra.data() + extra_at[s], explicit_sin[s] = extra.data() + extra_at[s] + half;
  }
  const std::vector<const float*>& cos = d_.explicit_positions ? explicit_cos : cos_rows_;
  const std::vector<const float*>& sin = d_.explicit_positions ? explicit_sin : sin_rows_;

  const int64_t rows = [&] {
    int64_t r = 1;
    for (int64_t s : d_.sizes) r *= s;
    return r / d_.rope.dim;
  }();
  auto run_as = [&]<class S, class A, class E>() {
    pool.parallel_for(rows, [&](int64_t begin, int64_t end) {
      rotate_rows<S, A, E>(d_, cos, sin, static_cast<const S*>(x), static_cast<S*>(y), begin, end);
    });
  };
  switch (dtype_) {
    case DType::F32: return run_as.operator()<float, float, Same<float>>();
    case DType::F64: return run_as.operator()<double, double, Same<double>>();
    case DType::BF16: return run_as.operator()<uint16_t, float, Bf16>();
    case DType::F16: return run_as.operator()<uint16_t, float, F16>();
    default: throw Error("rope: unsupported dtype");
  }
}

}  // namespace napkin::runtime
