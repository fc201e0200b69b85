// Static tensor types: a dtype and a shape whose dims carry the names the user
// gave them, plus the strided layout of a value inside its buffer.
//
// Names never affect semantics (two dims are compatible iff their sizes are
// equal); they exist so that a shape error can say "'hidden' (512) vs 'd' (784)"
// instead of "512 vs 784", and so the IR text reads like the model file.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ir/dtype.h"

namespace napkin::ir {

using ValueId = int32_t;
using NodeId = int32_t;
inline constexpr ValueId kNoValue = -1;
inline constexpr NodeId kNoNode = -1;

struct Dim {
  int64_t size = 1;
  std::string name;  // "d", "3*d", or "" when the size has no name
};

struct TensorType {
  DType dtype = DType::F32;
  std::vector<Dim> dims;  // empty: a scalar

  int rank() const { return static_cast<int>(dims.size()); }
  int64_t numel() const;
  int64_t bytes() const { return numel() * dtype_size(dtype); }
  std::vector<int64_t> sizes() const;
  bool same_shape(const TensorType& other) const;  // sizes only
};

// The largest tensor napkin will describe (2^50 elements): well past any device,
// and far enough below int64 overflow for every byte and FLOP count.
inline constexpr double kMaxElements = 1125899906842624.0;

// The number of elements of a shape, in double so that an absurd shape compares
// above kMaxElements instead of overflowing int64. Exact up to 2^53.
double element_count(const std::vector<Dim>& dims);

// "f32[batch=16, seq=128]" (named dims) or "f32[16, 3]"; scalars print "f32[]".
std::string to_string(const TensorType& t);
// "'d' (256)" or "256": how a dim is quoted in messages.
std::string describe_dim(const Dim& d);

// Where the elements of a value live inside its buffer, in elements.
// A contiguous row-major value has strides (prod of later sizes) and offset 0.
// Views (transpose, broadcast, slice, reshape where possible) share their
// source's buffer with other strides; a stride of 0 is a broadcast.
struct Layout {
  std::vector<int64_t> strides;
  int64_t offset = 0;
};

Layout contiguous_layout(const std::vector<int64_t>& sizes);
bool is_contiguous(const Layout& layout, const std::vector<int64_t>& sizes);
std::string to_string(const Layout& layout);

}  // namespace napkin::ir
