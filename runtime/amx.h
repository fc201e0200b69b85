// Intel AMX (Advanced Matrix Extensions) for the runtime's small bf16
// products: the fused attention's tiles (runtime/attention_amx.cpp), where a
// library GEMM call per 64 x 128 tile costs more than the arithmetic.
//
// One AMX instruction (tdpbf16ps) multiplies a 16 x 32 bf16 tile by a 32 x 16
// one into a 16 x 16 f32 tile: 16 KFLOP, about 8x an AVX-512 FMA's work per
// cycle. Its right operand must be in "VNNI" layout: pairs of consecutive k
// rows interleaved, so that row r of the tile holds (B[2r][n], B[2r+1][n]) for
// each column n. The packers below write operands in the layouts gemm()
// reads, zero-padded to whole tiles (padding is never read from the caller's
// tensors, which may have neighbours or NaN poison there).
//
// Availability is decided once per process: the CPU must report AMX-TILE and
// AMX-BF16, and Linux must grant the process the tile state
// (arch_prctl(ARCH_REQ_XCOMP_PERM)). NAPKIN_AMX=0 in the environment turns
// AMX off (to compare, or to test the other path on an AMX machine).
#pragma once

#include <cstdint>

namespace napkin::runtime::amx {

// True when the tile instructions may be used in this process.
bool available();

// Loads the tile configuration gemm() needs (eight 16-row x 64-byte tiles)
// on the calling thread, and releases the tile state when it goes. Other
// code (oneDNN's AMX kernels) configures tiles differently, so every run of
// gemm() calls sits inside one of these on its thread, with no foreign AMX
// code in between.
class TileScope {
 public:
  TileScope();
  ~TileScope();
  TileScope(const TileScope&) = delete;
  TileScope& operator=(const TileScope&) = delete;
};

// C (m x n, f32, row stride ldc floats) = or += A (m x k, bf16, row stride
// lda elements) times B (k x n, VNNI: k / 2 rows of 2n bf16, row stride ldb
// elements). m and n are multiples of 16, k of 32; A's and B's padding must
// hold zeros where it meets the other operand's real values.
void gemm(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, float* c,
          int64_t ldc, bool accumulate);

constexpr int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

// A operand: rows x cols of src (row stride ld) into dst (dst_rows x
// dst_cols, dense), zeros elsewhere.
void pack_a(const uint16_t* src, int64_t rows, int64_t cols, int64_t ld, uint16_t* dst, int64_t dst_rows,
            int64_t dst_cols);
// A operand of srcᵀ: dst (dst_rows x dst_cols, dense) holds src's column r
// as its row r (src: rows x cols, row stride ld), zeros elsewhere.
void pack_a_transposed(const uint16_t* src, int64_t rows, int64_t cols, int64_t ld, uint16_t* dst, int64_t dst_rows,
                       int64_t dst_cols);
// B operand of src itself (k = rows, n = cols, row stride ld): VNNI with k
// padded to k_pad (even) and n to n_pad; dst row stride 2 n_pad.
void pack_b(const uint16_t* src, int64_t rows, int64_t cols, int64_t ld, uint16_t* dst, int64_t k_pad, int64_t n_pad);
// B operand of srcᵀ (src: n = rows x k = cols, row stride ld): VNNI with k
// padded to k_pad (even) and n to n_pad; dst row stride 2 n_pad.
void pack_b_transposed(const uint16_t* src, int64_t rows, int64_t cols, int64_t ld, uint16_t* dst, int64_t k_pad,
                       int64_t n_pad);

}  // namespace napkin::runtime::amx
