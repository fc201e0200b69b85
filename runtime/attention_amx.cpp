// The bf16 fused attention on AMX tiles (runtime/attention_amx.h).
//
// Forward: one work item per (batch, query head). K is packed once as the B
// operand of S = Q Kᵀ and V as the B operand of O += P V (runtime/amx.h's VNNI
// layout); then each 64-row query block walks the key blocks of 128 as
// attention.cpp's forward does (online softmax, causal blocks past the
// diagonal skipped), its P rounded to bf16 as the A operand of P V.
//
// Backward: one work item per (batch, kv head), in the transposed
// orientation, so that every product reads its operands as they are packed
// once per item and none needs a transpose per tile: for each key block and
// each query block of each query head sharing the kv head,
//   Sᵀ = K Qᵀ, dPᵀ = V dOᵀ                 (A: K, V rows; B: Qᵀ, dOᵀ)
//   Pᵀ = exp(scale Sᵀ - lse), dSᵀ = Pᵀ (dPᵀ - D)   (f32; D = rowsum(dO ∘ O))
//   dV += Pᵀ dO, dK += dSᵀ Q                (A: Pᵀ, dSᵀ in bf16; B: dO, Q)
//   dQᵀ += Kᵀ dSᵀ                           (A: Kᵀ; B: dSᵀ in bf16, VNNI)
// dK and dV are stored when their key block is done, dQ (from the f32 dQᵀ
// of every query row of the group) at the end.
//
// Rotary embeddings: q and k rotated (f32, rounded to bf16) into scratch
// before they are packed, dK and dQ rotated back before they are rounded
// (attention_amx.h).
//
// Every sum runs in an order fixed by the shape (blocks in index order, the
// tile product's own fixed order), and each output element is written by one
// work item: bit-identical for any thread count, as attention.h promises.
#include "runtime/attention_amx.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "runtime/amx.h"
#include "runtime/float_formats.h"
#include "runtime/vector_math.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

namespace napkin::runtime::attention_amx {

namespace {

using amx::round_up;

// Query and key blocks as attention.cpp's (64 x 128 tiles of scores).
constexpr int64_t kQueryBlock = 64;
constexpr int64_t kKeyBlock = 128;
// A visible_end (below) beyond any tile: no key hidden (not causal).
constexpr int64_t kEveryKey = int64_t(1) << 40;

template <class T>
T* at(T* base, const AttentionDesc::Strides& st, int64_t b, int64_t h, int64_t row) {
  return base + b * st.batch + h * st.head + row * st.row;
}

// Per-thread buffers, grown on first use and kept.
struct Scratch {
  std::vector<uint16_t> k_a, v_a, kt_a, k_b, v_b, q_b, qt_b, do_b, dot_b, p_a, ds_a, ds_b, q_a, k_rot, q_rot;
  std::vector<float> s, dp, acc, dk, dv, dqt, m, l, row_dot, row;
  static Scratch& get() {
    thread_local Scratch s;
    return s;
  }
  template <class T>
  static T* sized(std::vector<T>& v, int64_t n) {
    if (int64_t(v.size()) < n) v.resize(size_t(n));
    return v.data();
  }
};

// max over x[0, n) and the sum over x[0, n), 16 lanes at a time (a fixed
// order: the sums are the same bits run to run).
NAPKIN_AVX512 inline float scaled_max16(const float* x, int64_t n, float scale) {
  const __m512 s = _mm512_set1_ps(scale);
  __m512 m = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  int64_t c = 0;
  for (; c + 16 <= n; c += 16) m = _mm512_max_ps(m, _mm512_mul_ps(_mm512_loadu_ps(x + c), s));
  if (c < n) {
    const __mmask16 tail = __mmask16((1u << (n - c)) - 1);
    m = _mm512_mask_max_ps(m, tail, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(tail, x + c), s));
  }
  return _mm512_reduce_max_ps(m);
}
NAPKIN_AVX512 inline float sum16(const float* x, int64_t n) {
  __m512 acc = _mm512_setzero_ps();
  int64_t c = 0;
  for (; c + 16 <= n; c += 16) acc = _mm512_add_ps(acc, _mm512_loadu_ps(x + c));
  if (c < n) acc = _mm512_add_ps(acc, _mm512_maskz_loadu_ps(__mmask16((1u << (n - c)) - 1), x + c));
  return _mm512_reduce_add_ps(acc);
}

// One query block's scores against one key block (rows x cols of s, row
// stride kKeyBlock), in place: the online softmax's step on the scaled,
// masked scores (running max m, sum l, the f32 accumulator acc of acc_cols
// columns rescaled); the probabilities go out as bf16 rows of p (row stride
// kKeyBlock), zero up to p_cols columns and p_rows rows.
NAPKIN_AVX512 void softmax_block(float* s, int64_t rows, int64_t cols, float scale, int64_t visible_end, float* m,
                                 float* l, float* acc, int64_t acc_cols, uint16_t* p, int64_t p_rows, int64_t p_cols) {
  for (int64_t r = 0; r < rows; ++r) {
    float* sr = s + r * kKeyBlock;
    // Keys from column visible_end + r on are hidden from row r (causal):
    // a suffix, left out of the max and given probability 0.
    const int64_t visible = std::min(cols, std::max<int64_t>(visible_end + r, 0));
    const float m_new = std::max(m[r], scaled_max16(sr, visible, scale));
    uint16_t* pr = p + r * kKeyBlock;
    for (int64_t c = 0; c < cols; ++c) {
      const float e = c < visible ? exp_poly(sr[c] * scale - m_new) : 0.0f;
      sr[c] = e;
      pr[c] = float_to_bf16_bits_inline(e);
    }
    for (int64_t c = cols; c < p_cols; ++c) pr[c] = 0;
    const float alpha = exp_poly(m[r] - m_new);
    l[r] = l[r] * alpha + sum16(sr, cols);
    m[r] = m_new;
    if (alpha != 1.0f) {
      float* ar = acc + r * acc_cols;
      for (int64_t c = 0; c < acc_cols; ++c) ar[c] *= alpha;
    }
  }
  for (int64_t r = rows; r < p_rows; ++r) std::memset(p + r * kKeyBlock, 0, size_t(p_cols) * 2);
}

// The backward's tile in the transposed orientation: st and dpt hold
// Sᵀ and dPᵀ (key rows x query columns, row stride kQueryBlock). Writes
// Pᵀ and dSᵀ as bf16 A operands (row stride kQueryBlock) and dSᵀ as a VNNI
// B operand over key pairs (kQueryBlock words a row: word i of row j / 2 is
// keys j and j + 1 of query i), for key rows up to key_rows (even) and query
// columns up to cols, zero past keys and queries.
NAPKIN_AVX512 void grad_block(const float* st, const float* dpt, int64_t keys, int64_t queries, float scale,
                              int64_t visible_end, const float* lse, const float* row_dot, uint16_t* pt_a,
                              uint16_t* dst_a, uint32_t* dst_b, int64_t key_rows, int64_t cols) {
  for (int64_t j = 0; j < key_rows; j += 2) {
    // Key j is visible to query columns i >= j - visible_end (causal); a
    // padding row past the keys to none.
    const int64_t visible0 = j < keys ? std::max<int64_t>(j - visible_end, 0) : kEveryKey;
    const int64_t visible1 = j + 1 < keys ? std::max<int64_t>(j + 1 - visible_end, 0) : kEveryKey;
    const float *s0 = st + j * kQueryBlock, *s1 = s0 + kQueryBlock;
    const float *dp0 = dpt + j * kQueryBlock, *dp1 = dp0 + kQueryBlock;
    uint16_t *p0 = pt_a + j * kQueryBlock, *p1 = p0 + kQueryBlock;
    uint16_t *g0 = dst_a + j * kQueryBlock, *g1 = g0 + kQueryBlock;
    uint32_t* pair = dst_b + (j / 2) * kQueryBlock;
    for (int64_t i = 0; i < queries; ++i) {
      const float e0 = exp_poly(s0[i] * scale - lse[i]), e1 = exp_poly(s1[i] * scale - lse[i]);
      // Selects, not products with 0: a padding row of st and dpt (past the
      // k16 rows the products wrote) holds an earlier tile's values, which
      // may be inf or NaN, and 0 * NaN would carry them into dQ.
      const bool v0 = i >= visible0, v1 = i >= visible1;
      const float q0 = v0 ? e0 : 0.0f, q1 = v1 ? e1 : 0.0f;
      const uint16_t ds0 = float_to_bf16_bits_inline(v0 ? q0 * (dp0[i] - row_dot[i]) : 0.0f);
      const uint16_t ds1 = float_to_bf16_bits_inline(v1 ? q1 * (dp1[i] - row_dot[i]) : 0.0f);
      p0[i] = float_to_bf16_bits_inline(q0), p1[i] = float_to_bf16_bits_inline(q1);
      g0[i] = ds0, g1[i] = ds1;
      pair[i] = uint32_t(ds0) | uint32_t(ds1) << 16;
    }
    for (int64_t i = queries; i < cols; ++i) p0[i] = p1[i] = g0[i] = g1[i] = 0, pair[i] = 0;
  }
}

// rows x cols of the f32 src (row stride lds) times mul, divided by div[r]
// when div is given, rounded to bf16 into dst (row stride ldd).
NAPKIN_AVX512 void store_bf16(const float* src, int64_t lds, int64_t rows, int64_t cols, float mul,
                                     const float* div, uint16_t* dst, int64_t ldd) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* sr = src + r * lds;
    uint16_t* dr = dst + r * ldd;
    const float dv = div ? div[r] : 1.0f;
    for (int64_t c = 0; c < cols; ++c) dr[c] = float_to_bf16_bits_inline(div ? sr[c] * mul / dv : sr[c] * mul);
  }
}

// The rows [0, rows) of an operand (row stride ld) to pack: src itself, or,
// with a rope table, the rows rotated at positions first_pos, first_pos + 1,
// ... in f32 and rounded to bf16 into buf (then *ld = head_dim).
const uint16_t* operand_rows(const AttentionDesc& d, const RopeTable* rope, int64_t first_pos, const uint16_t* src,
                             int64_t rows, int64_t* ld, std::vector<uint16_t>& buf) {
  if (!rope) return src;
  const int64_t D = d.head_dim;
  uint16_t* dst = Scratch::sized(buf, rows * D);
  float* row = Scratch::sized(Scratch::get().row, D);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < D; ++c) row[c] = bf16_bits_to_float(src[r * *ld + c]);
    rope_rotate_row(d.rope->style, D, rope->cos_row(first_pos + r), rope->sin_row(first_pos + r), false, row);
    for (int64_t c = 0; c < D; ++c) dst[r * D + c] = float_to_bf16_bits_inline(row[c]);
  }
  *ld = D;
  return dst;
}

void forward_head(const AttentionDesc& d, const RopeTable* rope, const uint16_t* q, const uint16_t* k,
                  const uint16_t* v, uint16_t* o, float* lse, int64_t b, int64_t h) {
  Scratch& sc = Scratch::get();
  const int64_t D = d.head_dim, T = d.q_len, S = d.kv_len, offset = S - T;
  const int64_t g = h / (d.heads / d.kv_heads);
  const int64_t d16 = round_up(D, 16), d32 = round_up(D, 32), s16 = round_up(S, 16), s32 = round_up(S, 32);
  uint16_t* kt_b = Scratch::sized(sc.k_b, d32 * s16);  // Kᵀ: k = head dim, n = keys
  uint16_t* v_b = Scratch::sized(sc.v_b, s32 * d16);   // V: k = keys, n = head dim
  int64_t k_ld = d.k.row;
  const uint16_t* kh = operand_rows(d, rope, 0, at(k, d.k, b, g, 0), S, &k_ld, sc.k_rot);
  amx::pack_b_transposed(kh, S, D, k_ld, kt_b, d32, s16);
  amx::pack_b(at(v, d.v, b, g, 0), S, D, d.v.row, v_b, s32, d16);
  uint16_t* q_a = Scratch::sized(sc.q_a, kQueryBlock * d32);
  uint16_t* p_a = Scratch::sized(sc.p_a, kQueryBlock * kKeyBlock);
  float* s = Scratch::sized(sc.s, kQueryBlock * kKeyBlock);
  float* acc = Scratch::sized(sc.acc, kQueryBlock * d16);
  float* m = Scratch::sized(sc.m, kQueryBlock);
  float* l = Scratch::sized(sc.l, kQueryBlock);
  amx::TileScope tiles;
  for (int64_t i0 = 0; i0 < T; i0 += kQueryBlock) {
    const int64_t rows = std::min(kQueryBlock, T - i0), r16 = round_up(rows, 16);
    int64_t q_ld = d.q.row;
    const uint16_t* qb = operand_rows(d, rope, i0 + offset, at(q, d.q, b, h, i0), rows, &q_ld, sc.q_rot);
    amx::pack_a(qb, rows, D, q_ld, q_a, r16, d32);
    std::fill(acc, acc + r16 * d16, 0.0f);
    std::fill(m, m + rows, -std::numeric_limits<float>::infinity());
    std::fill(l, l + rows, 0.0f);
    // The last row sees keys up to i0 + rows - 1 + offset.
    const int64_t key_end = d.causal ? std::min(S, i0 + rows + offset) : S;
    for (int64_t j0 = 0; j0 < key_end; j0 += kKeyBlock) {
      const int64_t cols = std::min(kKeyBlock, key_end - j0), c16 = round_up(cols, 16), c32 = round_up(cols, 32);
      amx::gemm(r16, c16, d32, q_a, d32, kt_b + 2 * j0, 2 * s16, s, kKeyBlock, false);
      // Row r (query i0 + r) sees keys up to i0 + r + offset: columns below
      // i0 + offset + 1 - j0 + r.
      const int64_t visible_end = d.causal ? i0 + offset + 1 - j0 : kEveryKey;
      softmax_block(s, rows, cols, float(d.scale), visible_end, m, l, acc, d16, p_a, r16, c32);
      amx::gemm(r16, d16, c32, p_a, kKeyBlock, v_b + (j0 / 2) * 2 * d16, 2 * d16, acc, d16, true);
    }
    store_bf16(acc, d16, rows, D, 1.0f, l, at(o, d.o, b, h, i0), d.o.row);
    float* lse_out = lse + (b * d.heads + h) * T + i0;
    for (int64_t r = 0; r < rows; ++r) lse_out[r] = m[r] + std::log(l[r]);
  }
}

void backward_group(const AttentionDesc& d, const RopeTable* rope, const uint16_t* q, const uint16_t* k, const uint16_t* v,
                    const uint16_t* o, const float* lse, const uint16_t* d_o, uint16_t* dq, uint16_t* dk,
                    uint16_t* dv, int64_t b, int64_t g) {
  Scratch& sc = Scratch::get();
  const int64_t D = d.head_dim, T = d.q_len, S = d.kv_len, offset = S - T;
  const int64_t group = d.heads / d.kv_heads, h0 = g * group;
  const int64_t d16 = round_up(D, 16), d32 = round_up(D, 32), s16 = round_up(S, 16), s32 = round_up(S, 32);
  const int64_t t16 = round_up(T, 16), t32 = round_up(T, 32);
  const float scale = float(d.scale);

  // The kv head's operands, once: K and V as A (key rows), Kᵀ as A.
  uint16_t* k_a = Scratch::sized(sc.k_a, s16 * d32);
  uint16_t* v_a = Scratch::sized(sc.v_a, s16 * d32);
  uint16_t* kt_a = Scratch::sized(sc.kt_a, d16 * s32);
  int64_t k_ld = d.k.row;
  const uint16_t* kh = operand_rows(d, rope, 0, at(k, d.k, b, g, 0), S, &k_ld, sc.k_rot);
  amx::pack_a(kh, S, D, k_ld, k_a, s16, d32);
  amx::pack_a(at(v, d.v, b, g, 0), S, D, d.v.row, v_a, s16, d32);
  amx::pack_a_transposed(kh, S, D, k_ld, kt_a, d16, s32);
  // Each query head's, once: Qᵀ and dOᵀ as B (k = head dim, n = queries),
  // Q and dO as B (k = queries, n = head dim); D_i = do_i . o_i.
  const int64_t nt = d32 * t16, nr = t32 * d16;
  uint16_t* qt_b = Scratch::sized(sc.qt_b, group * nt);
  uint16_t* dot_b = Scratch::sized(sc.dot_b, group * nt);
  uint16_t* q_b = Scratch::sized(sc.q_b, group * nr);
  uint16_t* do_b = Scratch::sized(sc.do_b, group * nr);
  float* row_dot = Scratch::sized(sc.row_dot, group * T);
  for (int64_t hl = 0; hl < group; ++hl) {
    const int64_t h = h0 + hl;
    int64_t q_ld = d.q.row;
    const uint16_t* qh = operand_rows(d, rope, offset, at(q, d.q, b, h, 0), T, &q_ld, sc.q_rot);
    amx::pack_b_transposed(qh, T, D, q_ld, qt_b + hl * nt, d32, t16);
    amx::pack_b_transposed(at(d_o, d.d_o, b, h, 0), T, D, d.d_o.row, dot_b + hl * nt, d32, t16);
    amx::pack_b(qh, T, D, q_ld, q_b + hl * nr, t32, d16);
    amx::pack_b(at(d_o, d.d_o, b, h, 0), T, D, d.d_o.row, do_b + hl * nr, t32, d16);
    for (int64_t i = 0; i < T; ++i) {
      const uint16_t* dor = at(d_o, d.d_o, b, h, i);
      const uint16_t* orow = at(o, d.o, b, h, i);
      float sum = 0;
      for (int64_t c = 0; c < D; ++c) sum += bf16_bits_to_float(dor[c]) * bf16_bits_to_float(orow[c]);
      row_dot[hl * T + i] = sum;
    }
  }
  float* dqt = Scratch::sized(sc.dqt, group * d16 * t16);  // dQᵀ per query head: head dim x queries
  std::fill(dqt, dqt + group * d16 * t16, 0.0f);
  float* st = Scratch::sized(sc.s, kKeyBlock * kQueryBlock);
  float* dpt = Scratch::sized(sc.dp, kKeyBlock * kQueryBlock);
  uint16_t* pt_a = Scratch::sized(sc.p_a, kKeyBlock * kQueryBlock);
  uint16_t* dst_a = Scratch::sized(sc.ds_a, kKeyBlock * kQueryBlock);
  uint16_t* dst_b = Scratch::sized(sc.ds_b, kKeyBlock * kQueryBlock);
  float* dk_acc = Scratch::sized(sc.dk, kKeyBlock * d16);
  float* dv_acc = Scratch::sized(sc.dv, kKeyBlock * d16);

  amx::TileScope tiles;
  for (int64_t j0 = 0; j0 < S; j0 += kKeyBlock) {
    const int64_t cols = std::min(kKeyBlock, S - j0), c16 = round_up(cols, 16);
    std::fill(dk_acc, dk_acc + c16 * d16, 0.0f);
    std::fill(dv_acc, dv_acc + c16 * d16, 0.0f);
    // The first query that sees key j0 is j0 - offset.
    const int64_t first_block = d.causal ? std::max<int64_t>(j0 - offset, 0) / kQueryBlock : 0;
    for (int64_t hl = 0; hl < group; ++hl) {
      const float* lse_h = lse + (b * d.heads + h0 + hl) * T;
      for (int64_t i0 = first_block * kQueryBlock; i0 < T; i0 += kQueryBlock) {
        const int64_t rows = std::min(kQueryBlock, T - i0), r16 = round_up(rows, 16), r32 = round_up(rows, 32);
        // Causal: keys past the block's last row's horizon are hidden from all of it.
        const int64_t keys = d.causal ? std::min(cols, i0 + rows + offset - j0) : cols;
        const int64_t k16 = round_up(keys, 16), k32 = round_up(keys, 32);
        amx::gemm(k16, r16, d32, k_a + j0 * d32, d32, qt_b + hl * nt + 2 * i0, 2 * t16, st, kQueryBlock, false);
        amx::gemm(k16, r16, d32, v_a + j0 * d32, d32, dot_b + hl * nt + 2 * i0, 2 * t16, dpt, kQueryBlock, false);
        // Key j0 + j is visible to query i0 + i iff j0 + j <= i0 + i + offset.
        const int64_t visible_end = d.causal ? i0 + offset - j0 : kEveryKey;
        grad_block(st, dpt, keys, rows, scale, visible_end, lse_h + i0, row_dot + hl * T + i0, pt_a, dst_a,
                   reinterpret_cast<uint32_t*>(dst_b), k32, r32);
        amx::gemm(k16, d16, r32, pt_a, kQueryBlock, do_b + hl * nr + (i0 / 2) * 2 * d16, 2 * d16, dv_acc, d16, true);
        amx::gemm(k16, d16, r32, dst_a, kQueryBlock, q_b + hl * nr + (i0 / 2) * 2 * d16, 2 * d16, dk_acc, d16, true);
        amx::gemm(d16, r16, k32, kt_a + j0, s32, dst_b, 2 * kQueryBlock, dqt + hl * d16 * t16 + i0, t16, true);
      }
    }
    if (rope)  // dK of the unrotated k
      for (int64_t j = 0; j < cols; ++j)
        rope_rotate_row(d.rope->style, D, rope->cos_row(j0 + j), rope->sin_row(j0 + j), true, dk_acc + j * d16);
    store_bf16(dk_acc, d16, cols, D, scale, nullptr, at(dk, d.dk, b, g, j0), d.dk.row);
    store_bf16(dv_acc, d16, cols, D, 1.0f, nullptr, at(dv, d.dv, b, g, j0), d.dv.row);
  }
  float* dq_row = Scratch::sized(sc.row, D);
  for (int64_t hl = 0; hl < group; ++hl) {
    const float* t = dqt + hl * d16 * t16;
    for (int64_t i = 0; i < T; ++i) {
      for (int64_t c = 0; c < D; ++c) dq_row[c] = t[c * t16 + i] * scale;
      if (rope)  // dQ of the unrotated q
        rope_rotate_row(d.rope->style, D, rope->cos_row(i + offset), rope->sin_row(i + offset), true, dq_row);
      uint16_t* row = at(dq, d.dq, b, h0 + hl, i);
      for (int64_t c = 0; c < D; ++c) row[c] = float_to_bf16_bits_inline(dq_row[c]);
    }
  }
}

}  // namespace

void forward(const AttentionDesc& d, const RopeTable* rope, const uint16_t* q, const uint16_t* k, const uint16_t* v,
             uint16_t* o, float* lse, ThreadPool& pool) {
  pool.parallel_for(d.batch * d.heads, [&](int64_t begin, int64_t end) {
    for (int64_t it = begin; it < end; ++it) forward_head(d, rope, q, k, v, o, lse, it / d.heads, it % d.heads);
  });
}

void backward(const AttentionDesc& d, const RopeTable* rope, const uint16_t* q, const uint16_t* k, const uint16_t* v,
              const uint16_t* o, const float* lse, const uint16_t* d_o, uint16_t* dq, uint16_t* dk, uint16_t* dv,
              ThreadPool& pool) {
  pool.parallel_for(d.batch * d.kv_heads, [&](int64_t begin, int64_t end) {
    for (int64_t it = begin; it < end; ++it)
      backward_group(d, rope, q, k, v, o, lse, d_o, dq, dk, dv, it / d.kv_heads, it % d.kv_heads);
  });
}

}  // namespace napkin::runtime::attention_amx

#else  // not x86-64: amx::available() is false, so runtime::Attention never calls these

namespace napkin::runtime::attention_amx {

void forward(const AttentionDesc&, const RopeTable*, const uint16_t*, const uint16_t*, const uint16_t*, uint16_t*, float*,
             ThreadPool&) {
  std::abort();
}
void backward(const AttentionDesc&, const RopeTable*, const uint16_t*, const uint16_t*, const uint16_t*, const uint16_t*,
              const float*, const uint16_t*, uint16_t*, uint16_t*, uint16_t*, ThreadPool&) {
  std::abort();
}

}  // namespace napkin::runtime::attention_amx

#endif
