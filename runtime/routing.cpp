#include "runtime/routing.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>

#include "runtime/error.h"
#include "runtime/float_formats.h"

namespace napkin::runtime {

namespace {

template <class S, class A>
struct Widen {
  static A load(S x) { return static_cast<A>(x); }
};
struct Bf16 {
  static float load(uint16_t x) { return bf16_bits_to_float(x); }
};
struct F16 {
  static float load(uint16_t x) { return f16_bits_to_float(x); }
};

// Rows [begin, end) of x (every axis but the last, row-major), each by an
// odometer over the leading axes: its k winners by a partial sort of the
// row's indices under "a beats b": a NaN beats a number, else the larger,
// and between equals (or two NaNs) the lower index.
template <class S, class A, class L>
void top_k_rows(const TopKDesc& d, const S* x, S* values, int32_t* indices, int64_t begin, int64_t end) {
  const int lead = static_cast<int>(d.sizes.size()) - 1;
  const int64_t n = d.sizes.back(), step = d.x_strides.back();
  std::vector<int64_t> idx(static_cast<size_t>(lead), 0);
  int64_t rest = begin;
  for (int i = lead - 1; i >= 0; --i) idx[i] = rest % d.sizes[i], rest /= d.sizes[i];
  std::vector<A> row(static_cast<size_t>(n));
  std::vector<int32_t> order(static_cast<size_t>(n));
  auto beats = [&](int32_t a, int32_t b) {
    const A va = row[a], vb = row[b];
    if (std::isnan(va) || std::isnan(vb)) return std::isnan(va) && (!std::isnan(vb) || a < b);
    return va > vb || (va == vb && a < b);
  };
  for (int64_t r = begin; r < end; ++r) {
    int64_t xo = 0;
    for (int i = 0; i < lead; ++i) xo += idx[i] * d.x_strides[i];
    for (int64_t j = 0; j < n; ++j) row[j] = L::load(x[xo + j * step]);
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + d.k, order.end(), beats);
    for (int64_t j = 0; j < d.k; ++j) {
      values[r * d.k + j] = x[xo + order[j] * step];
      indices[r * d.k + j] = order[j];
    }
    for (int i = lead - 1; i >= 0; --i) {
      if (++idx[i] < d.sizes[i]) break;
      idx[i] = 0;
    }
  }
}

}  // namespace

void check_top_k(const TopKDesc& d, DType dtype) {
  auto fail = [](const std::string& what) { throw Error("top_k: " + what); };
  if (d.sizes.empty() || d.x_strides.size() != d.sizes.size()) fail("needs at least one axis with one stride each");
  for (int64_t s : d.sizes)
    if (s <= 0) fail("sizes must be positive");
  if (d.k < 1 || d.k > d.sizes.back())
    fail("k " + std::to_string(d.k) + " is outside [1, " + std::to_string(d.sizes.back()) + "]");
  if (d.sizes.back() > std::numeric_limits<int32_t>::max()) fail("rows too long for i32 indices");
  if (dtype != DType::F32 && dtype != DType::F64 && dtype != DType::BF16 && dtype != DType::F16)
    fail("picks from f32, f64, bf16 or f16, not " + std::string(dtype_name(dtype)));
}

void top_k(const TopKDesc& d, DType dtype, const void* x, void* values, int32_t* indices, ThreadPool& pool) {
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < d.sizes.size(); ++i) rows *= d.sizes[i];
  auto run_as = [&]<class S, class A, class L>() {
    pool.parallel_for(rows, [&](int64_t begin, int64_t end) {
      top_k_rows<S, A, L>(d, static_cast<const S*>(x), static_cast<S*>(values), indices, begin, end);
    });
  };
  switch (dtype) {
    case DType::F32: return run_as.operator()<float, float, Widen<float, float>>();
    case DType::F64: return run_as.operator()<double, double, Widen<double, double>>();
    case DType::BF16: return run_as.operator()<uint16_t, float, Bf16>();
    case DType::F16: return run_as.operator()<uint16_t, float, F16>();
    default: throw Error("top_k: unsupported dtype " + std::string(dtype_name(dtype)));
  }
}

void check_moe_slots(const MoeSlotsDesc& d) {
  auto fail = [](const std::string& what) { throw Error("moe_slots: " + what); };
  if (d.tokens < 1 || d.k < 1 || d.experts < 1 || d.capacity < 1)
    fail("tokens, k, experts and capacity must be positive");
  if (d.index_strides.size() != 2) fail("the indices need one stride per axis, [tokens, k]");
  if (d.experts > std::numeric_limits<int32_t>::max() / d.capacity) fail("too many slots for i32 positions");
}

std::optional<int64_t> moe_slots(const MoeSlotsDesc& d, const int32_t* indices, int32_t* pos, int32_t* src,
                                 float* counts) {
  auto index = [&](int64_t t, int64_t j) { return indices[t * d.index_strides[0] + j * d.index_strides[1]]; };
  for (int64_t t = 0; t < d.tokens; ++t)
    for (int64_t j = 0; j < d.k; ++j)
      if (index(t, j) < 0 || index(t, j) >= d.experts) return index(t, j);
  // assigned[e]: the assignments to expert e so far, kept or dropped; the
  // first `capacity` take its slots in order. It ends as e's count (exact in
  // f32 up to 2^24).
  std::vector<int64_t> assigned(static_cast<size_t>(d.experts), 0);
  std::fill(src, src + d.experts * d.capacity, 0);
  for (int64_t j = 0; j < d.k; ++j)  // every token's j-th choice before any token's (j+1)-th
    for (int64_t t = 0; t < d.tokens; ++t) {
      const int64_t e = index(t, j), slot = assigned[e]++;
      if (slot >= d.capacity) {
        pos[t * d.k + j] = -1;  // dropped
        continue;
      }
      pos[t * d.k + j] = static_cast<int32_t>(e * d.capacity + slot);
      src[e * d.capacity + slot] = static_cast<int32_t>(t);
    }
  for (int64_t e = 0; e < d.experts; ++e) counts[e] = static_cast<float>(assigned[e]);
  return std::nullopt;
}

}  // namespace napkin::runtime
