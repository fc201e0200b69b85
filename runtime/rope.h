// Rotary position embeddings (RoPE, Su et al. 2021): the one place their
// arithmetic is written for the runtime's kernels and the interpreter (the
// CUDA backend renders the same formulas as device code, codegen/cuda).
//
// A row x of `dim` elements (dim even, half = dim / 2) at position p is turned
// by the angles a_j = p * inv_freq_j, j in [0, half), in one of two pairings:
//   Half         (Hugging Face's rotate_half, GPT-NeoX): element j pairs with j + half
//   Interleaved  (Meta's original Llama code, GPT-J):     element 2j pairs with 2j + 1
// For a pair (x1, x2) and its angle a:
//   y1 = x1 cos a - x2 sin a        y2 = x2 cos a + x1 sin a
// and the inverse (the vector-Jacobian product: a rotation's transpose is the
// rotation by -a) flips the sign of sin a.
//
// inv_freq_j = 1 / theta^(2j / dim), computed in f32 as transformers does
// (so that imported weights give its logits), optionally rescaled as Llama
// 3.1 does: wavelengths beyond original_context / low_freq_factor are divided
// by `factor`, those below original_context / high_freq_factor are kept, and
// those between are interpolated smoothly. The angle is the f32 product
// float(p) * inv_freq_j (one rounding, as transformers' f32 matmul of
// positions and frequencies); its cosine and sine are rounded to f32 once.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/tensor_types.h"
#include "runtime/thread_pool.h"

namespace napkin::runtime {

enum class RopeStyle : uint8_t { Half, Interleaved };

struct RopeDesc {
  RopeStyle style = RopeStyle::Half;
  int64_t dim = 2;      // elements rotated per row (even)
  double theta = 10000;  // the frequencies' base
  // Llama 3.1's frequency scaling; factor 0: none.
  double factor = 0, low_freq_factor = 1, high_freq_factor = 4;
  int64_t original_context = 8192;
  bool operator==(const RopeDesc&) const = default;
};

// The half = dim / 2 inverse frequencies, f32 as transformers computes them.
std::vector<float> rope_inv_freq(const RopeDesc& d);

// cos and sin of every (position, frequency) angle for positions [0, n):
// computed once per program (a kernel's setup), never per step. Row p holds
// half values each.
struct RopeTable {
  int64_t positions = 0, half = 0;
  std::vector<float> cos, sin;  // [positions, half]
  const float* cos_row(int64_t p) const { return cos.data() + p * half; }
  const float* sin_row(int64_t p) const { return sin.data() + p * half; }
};
RopeTable make_rope_table(const RopeDesc& d, int64_t positions);

// The angle of position p and frequency j (f32, one rounding) and its cosine
// and sine: for positions the table does not hold (explicit positions).
float rope_angle(float inv_freq, int64_t position);
// cos and sin of position p's half = inv_freq.size() angles, each rounded to
// f32 once, as a table's row p holds them.
void rope_cos_sin(const std::vector<float>& inv_freq, int64_t position, float* cos, float* sin);

// Rotates one row of d.dim f32 values in place by the angles whose cosines
// and sines are cos[0, half) and sin[0, half); inverse: by the negated angles.
void rope_rotate_row(RopeStyle style, int64_t dim, const float* cos, const float* sin, bool inverse, float* row);
// The same in f64 (the interpreter's reference), angles from f32 tables.
void rope_rotate_row(RopeStyle style, int64_t dim, const float* cos, const float* sin, bool inverse, double* row);

// The standalone rope kernel (a Rope plan kernel, codegen/plan.h; the op is
// ir/rope.h's): y = x with every row along `axis` rotated by the angles of its
// position, the index along `seq_axis` or, with explicit positions, the
// i32/i64 positions[index]. x has any element strides; y is contiguous
// (row-major in `sizes`). f32, bf16 and f16 rows are rotated in f32, f64 rows
// in f64, and each result rounded to the dtype once.
struct RopeKernelDesc {
  RopeDesc rope;             // rope.dim == sizes[axis]
  bool inverse = false;      // by the negated angles (the VJP)
  std::vector<int64_t> sizes, x_strides;
  int64_t axis = 0, seq_axis = 0;
  bool explicit_positions = false, positions_i64 = false;
  bool operator==(const RopeKernelDesc&) const = default;
};

class RopeKernel {
 public:
  // Validates the descriptor (throws runtime::Error naming the problem) and
  // builds the table of positions [0, sizes[seq_axis]), once.
  RopeKernel(RopeKernelDesc desc, DType dtype);
  RopeKernel(const RopeKernel&) = delete;  // it points into its own table
  RopeKernel& operator=(const RopeKernel&) = delete;
  RopeKernel(RopeKernel&&) = default;  // the table's buffers move along
  // positions: null unless explicit; one outside the table has its cosines
  // and sines computed for this call. Rows are split across the pool.
  void run(const void* x, const void* positions, void* y, ThreadPool& pool) const;
  const RopeKernelDesc& desc() const { return d_; }

 private:
  RopeKernelDesc d_;
  DType dtype_;
  RopeTable table_;
  std::vector<const float*> cos_rows_, sin_rows_;  // the table's row of each index along seq_axis
  std::vector<float> inv_freq_;
};

}  // namespace napkin::runtime
