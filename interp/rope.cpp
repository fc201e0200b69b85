// rope by its definition (ir/rope.h, runtime/rope.h): every row along the
// rotated axis turned in f64 by its position's angles, whose cosines and sines
// are the runtime's f32 ones (the kernels' table), so the interpreter and the
// compiled code differ only in the rotation's own rounding.
#include <cmath>

#include "interp/kernels.h"
#include "runtime/rope.h"

namespace napkin::interp::detail {

runtime::RopeDesc rope_desc(const ir::RopeParams& p, int64_t dim) {
  runtime::RopeDesc d;
  d.style = p.style == ir::RopeStyle::Interleaved ? runtime::RopeStyle::Interleaved : runtime::RopeStyle::Half;
  d.dim = dim;
  d.theta = p.theta;
  d.factor = p.factor;
  d.low_freq_factor = p.low_freq_factor;
  d.high_freq_factor = p.high_freq_factor;
  d.original_context = p.original_context;
  return d;
}

Data rope(const ir::RopeParams& p, const Arg& x, const Arg* positions) {
  const int64_t dim = x.shape[p.axis], half = dim / 2;
  const runtime::RopeDesc desc = rope_desc(p, dim);
  const std::vector<float> inv_freq = runtime::rope_inv_freq(desc);
  const Shape strides = dense_strides(x.shape);
  Shape rows = x.shape;  // every index but the rotated axis's
  rows[p.axis] = 1;
  Data y = x.data;
  std::vector<float> cos(half), sin(half);
  std::vector<double> row(dim);
  for_each_index(rows, [&](const Shape& idx) {
    const int64_t s = idx[p.seq_axis];
    const int64_t position = positions ? static_cast<int64_t>(positions->data[s]) : s;
    runtime::rope_cos_sin(inv_freq, position, cos.data(), sin.data());
    const int64_t base = dot(idx, strides), step = strides[p.axis];
    for (int64_t j = 0; j < dim; ++j) row[j] = y[base + j * step];
    runtime::rope_rotate_row(desc.style, dim, cos.data(), sin.data(), p.inverse, row.data());
    for (int64_t j = 0; j < dim; ++j) y[base + j * step] = row[j];
  });
  return y;
}

}  // namespace napkin::interp::detail
