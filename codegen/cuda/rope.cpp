// The standalone rope kernel as CUDA C (ir/rope.h; the arithmetic is
// runtime/rope.h's): one thread per rotated pair, grid-stride.
//
//  NAME   pair t = (row r, frequency j): r's multi-index over x's axes but the
//         rotated one gives its x and y offsets and its position (the index
//         along seq_axis, or positions[index]); the angle is
//         float(position) * inv_freq[j] in f32, its cosine and sine are
//         computed in f64 and rounded to f32 once, as the CPU's table has
//         them, then the pair turns in f32 (f64 for f64) and is rounded to
//         y's dtype once.
// inv_freq is the runtime's (rope_inv_freq, f32 as transformers computes
// it), compiled in as the __device__ array NAME_inv_freq: no table in the
// arena, and no per-step recomputation of anything but the angles.
#include <fmt/format.h>

#include "codegen/cuda/emit.h"
#include "ir/internal_check.h"

namespace napkin::codegen::cuda::detail {

EmittedKernel emit_rope(const Kernel& k) {
  const ir::RopeParams& p = k.rope();
  const Operand &x = k.inputs[0], &y = k.output;
  const int rank = static_cast<int>(x.sizes.size());
  const int64_t dim = x.sizes[static_cast<size_t>(p.axis)], half = dim / 2;
  // The rows: every axis but the rotated one, with x's and y's strides.
  std::vector<int64_t> row_sizes, x_strides, y_strides;
  int seq = -1;
  for (int i = 0; i < rank; ++i) {
    if (i == p.axis) continue;
    if (i == p.seq_axis) seq = static_cast<int>(row_sizes.size());
    row_sizes.push_back(x.sizes[static_cast<size_t>(i)]);
    x_strides.push_back(x.strides[static_cast<size_t>(i)]);
    y_strides.push_back(y.strides[static_cast<size_t>(i)]);
  }
  NAPKIN_INTERNAL_CHECK(seq >= 0, "rope kernel {}: seq_axis {} is the rotated axis", k.name, p.seq_axis);
  const int64_t rows = product(row_sizes), items = rows * half;
  const int64_t xa = x.strides[static_cast<size_t>(p.axis)], ya = y.strides[static_cast<size_t>(p.axis)];
  const std::string it = index_type(std::max({items, max_offset(x.sizes, x.strides) + 1, y.numel()}));
  const char* ct = compute_type(x.dtype);
  const bool interleaved = p.style == ir::RopeStyle::Interleaved;

  Src s;
  emit_rope_frequencies(s, k.name + "_inv_freq", p, dim);
  const int block = 256;
  const int64_t grid = grid_for(items, block);
  begin_kernel(s, k.name, block);
  s.open("for ({0} t = ({0})blockIdx.x * blockDim.x + threadIdx.x; t < {1}u; t += ({0})gridDim.x * blockDim.x) {{", it,
         items);
  s.line("const {} j = t % {}u, row = t / {}u;", it, half, half);
  decompose(s, row_sizes, "row", "i", it);
  s.line("const {} xo = {}, yo = {};", it, dot("i", x_strides), dot("i", y_strides));
  if (p.explicit_positions)
    s.line("const long long position = (long long){};", load(k.inputs.at(1), fmt::format("i{}", seq)));
  else
    s.line("const long long position = (long long)i{};", seq);
  s.line("const float angle = (float)position * {}_inv_freq[j];", k.name);
  s.line("const float cf = (float)cos((double)angle), sf = (float)sin((double)angle);");
  s.line("const {0} c = ({0})cf, sn = ({0})({1}sf);", ct, p.inverse ? "-" : "");
  s.line("const {} e1 = {}, e2 = {};", it, interleaved ? "2u * j" : "j", interleaved ? "2u * j + 1u" : fmt::format("j + {}u", half));
  s.line("const {} x1 = {}, x2 = {};", ct, load(x, fmt::format("xo + e1 * {}u", xa)), load(x, fmt::format("xo + e2 * {}u", xa)));
  s.line("{}", store(y, fmt::format("yo + e1 * {}u", ya), "x1 * c - x2 * sn"));
  s.line("{}", store(y, fmt::format("yo + e2 * {}u", ya), "x2 * c + x1 * sn"));
  s.close();
  s.close();
  return {s.take(), {{k.name, grid, block, 0, {}}}, 0};
}

}  // namespace napkin::codegen::cuda::detail
