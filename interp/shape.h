// Index arithmetic over dense row-major tensors, the interpreter's only storage.
#pragma once

#include <cstdint>
#include <vector>

namespace napkin::interp::detail {

using Shape = std::vector<int64_t>;

inline int64_t numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

// Row-major strides of a dense tensor of shape s.
inline Shape dense_strides(const Shape& s) {
  Shape st(s.size(), 1);
  for (int i = static_cast<int>(s.size()) - 2; i >= 0; --i) st[i] = st[i + 1] * s[i + 1];
  return st;
}

// Strides that read a dense tensor of shape `in` as if broadcast (numpy rules,
// right-aligned) to `out`: one entry per axis of `out`, 0 where `in` repeats.
inline Shape broadcast_strides(const Shape& in, const Shape& out) {
  Shape dense = dense_strides(in);
  Shape st(out.size(), 0);
  int extra = static_cast<int>(out.size()) - static_cast<int>(in.size());
  for (int i = 0; i < static_cast<int>(in.size()); ++i)
    st[extra + i] = (in[i] == 1 && out[extra + i] != 1) ? 0 : dense[i];
  return st;
}

// Calls fn(index) for every multi-index of `shape` in row-major order; index
// is the running odometer (valid during the call only).
template <typename Fn>
void for_each_index(const Shape& shape, Fn&& fn) {
  int64_t n = numel(shape);
  Shape idx(shape.size(), 0);
  for (int64_t flat = 0; flat < n; ++flat) {
    fn(static_cast<const Shape&>(idx));
    for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
}

inline int64_t dot(const Shape& idx, const Shape& strides) {
  int64_t off = 0;
  for (size_t i = 0; i < idx.size(); ++i) off += idx[i] * strides[i];
  return off;
}

// A tensor seen as [outer, n, inner] around one axis: what softmax-like ops use.
struct AxisSplit {
  int64_t outer = 1, n = 1, inner = 1;
  int64_t at(int64_t o, int64_t k, int64_t i) const { return (o * n + k) * inner + i; }
};
inline AxisSplit split_at(const Shape& s, int64_t axis) {
  AxisSplit r;
  for (int64_t i = 0; i < static_cast<int64_t>(s.size()); ++i) {
    if (i < axis) r.outer *= s[i];
    else if (i == axis) r.n = s[i];
    else r.inner *= s[i];
  }
  return r;
}

}  // namespace napkin::interp::detail
