// The CPU fused attention (runtime/attention.h): FlashAttention-2 on tiles
// that fit the L1/L2 caches, f32 arithmetic (f64 for f64 operands).
//
// Tiling: a query block is kQueryBlock (64) rows of q (and of do, o, dq), a
// key block kKeyBlock (128) rows of k and v (and of dk, dv). Every product of a tile
// pair (S = scale Q Kᵀ, P V, dO Vᵀ, Pᵀ dO, dSᵀ Q, dS K) is one small GEMM:
// oneDNN's dnnl_sgemm for f32, run single-threaded on the calling pool thread
// like runtime/gemm.cpp does, reading f32 operands in place (their row stride
// is the leading dimension); a plain loop for f64. bf16 and f16 tiles are
// widened to f32 once per tile into per-thread scratch (exact), and outputs
// rounded to nearest even once, on store. Scores never exist beyond one
// kQueryBlock x kKeyBlock tile; the softmax's exp is a polynomial the
// compiler vectorizes (exp_poly, a few ulp, exp(-inf) = 0).
//
// Forward: one work item per (batch, query head, query block). It walks the
// key blocks left to right keeping, per query row, the running max m, the
// running sum l of exp(s - m) and the unnormalized output (online softmax);
// at the end o = acc / l and lse = m + log l.
//
// Backward: one work item per (batch, kv head), doing FA2's loop: for each
// key block, for each query head sharing the kv head (in head order), for
// each query block: recompute S and P = exp(S - lse) from the saved lse,
// dP = dO Vᵀ, dS = P (dP - D) with D = rowsum(dO ∘ O); accumulate dV and dK
// of the key block in f32 tiles and dQ of every query row of the group in an
// f32 per-item scratch ([group heads, q_len, head_dim], never q_len x
// kv_len); dK and dV are stored when their key block is done, dQ at the end.
// Nothing is shared between work items, so no atomics or locks.
//
// Causal (key j visible to query i iff j <= i + kv_len - q_len): key blocks
// wholly above the diagonal are never visited (the forward's key loop stops
// at the last key its last row sees; the backward's query loop starts at the
// first query block that sees the key block); only tiles crossing the
// diagonal are masked, by setting their hidden scores to -inf.
//
// Rotary embeddings (desc.rope): the q and k tiles are always copied into
// the per-thread scratch (widened) and their rows rotated there, with the
// cos / sin table built once when the kernel is set up (positions [0,
// kv_len)); the backward rotates its f32 dK tile and dQ rows back by the
// negated angles before storing them (the rotation is linear, so rotating
// the finished sums back is rotating every term back). A tile is rotated each
// time it is loaded: 3 FLOPs an element against the 2 cols FLOPs an element
// of the tile's products.
//
// Determinism: each output element is written by exactly one work item, and
// inside it every sum runs in an order fixed by the shape alone (block
// boundaries are multiples of the block sizes, loops run in index order,
// dnnl_sgemm is deterministic for a given shape). The pool's chunking only
// decides which thread runs an item, so results are bit-identical for any
// thread count, run to run.
#include "runtime/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "runtime/amx.h"
#include "runtime/attention_amx.h"
#include "runtime/error.h"
#include "runtime/float_formats.h"
#include "runtime/vector_math.h"

#include <oneapi/dnnl/dnnl.h>

namespace napkin::runtime {

namespace {

// A 64-row query block against a 128-key block: the f32 score tile is 32
// KiB, Q/dO and K/V tiles 16 and 32 KiB at head_dim 64, all within L2 while a
// key block is processed. Measured (bench/attention_cpu.cpp, one thread, CPU
// time): 64 x 128 and 128 x 128 about 9% faster than 64 x 64; 64 rows keep
// the causal diagonal tiles (half wasted) small for short sequences (T=128).
// The macros exist only to re-measure other sizes.
#ifndef NAPKIN_ATTENTION_QUERY_BLOCK
#define NAPKIN_ATTENTION_QUERY_BLOCK 64
#endif
#ifndef NAPKIN_ATTENTION_KEY_BLOCK
#define NAPKIN_ATTENTION_KEY_BLOCK 128
#endif
constexpr int64_t kQueryBlock = NAPKIN_ATTENTION_QUERY_BLOCK;
constexpr int64_t kKeyBlock = NAPKIN_ATTENTION_KEY_BLOCK;

// C (m x n) = alpha op(A) op(B) + beta C, row-major, op = transpose when the
// flag is set. beta is 0 or 1.
void tile_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
               const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  make_openmp_serial();
  dnnl_status_t st = dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  if (st != dnnl_success)
    throw Error("attention: dnnl_sgemm failed (status " + std::to_string(int(st)) + ") for m=" + std::to_string(m) +
                " n=" + std::to_string(n) + " k=" + std::to_string(k));
}

// f64 has no oneDNN path: plain loops (f64 attention is for checking, not
// speed), each C element summed over k in index order.
void tile_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a, int64_t lda,
               const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  const int64_t am = ta ? 1 : lda, ak = ta ? lda : 1;
  const int64_t bk = tb ? 1 : ldb, bn = tb ? ldb : 1;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int64_t p = 0; p < k; ++p) acc += a[i * am + p * ak] * b[p * bk + j * bn];
      c[i * ldc + j] = alpha * acc + (beta != 0 ? c[i * ldc + j] : 0.0);
    }
}

// One key block of the forward's online softmax on a rows x cols score tile
// (row stride lds), in place: scores become exp(s - m_new) where m_new is the
// row's new running max; l (running sum) and acc (unnormalized output, rows x
// D) are rescaled by exp(m_old - m_new). Every row sees key 0 (the offset
// kv_len - q_len is >= 0), so m is finite after the first block; m_old = -inf
// gives a factor of 0.
template <class A>
[[gnu::always_inline]] inline void online_softmax_body(A* s, int64_t lds, int64_t rows, int64_t cols, A* m, A* l, A* acc, int64_t D) {
  for (int64_t r = 0; r < rows; ++r) {
    A* sr = s + r * lds;
    const A m_new = std::max(m[r], row_max(sr, cols));
    for (int64_t c = 0; c < cols; ++c) sr[c] = exp_any(A(sr[c] - m_new));
    const A alpha = exp_any(A(m[r] - m_new));
    l[r] = l[r] * alpha + row_sum(sr, cols);
    m[r] = m_new;
    if (alpha != A(1)) {
      A* ar = acc + r * D;
      for (int64_t c = 0; c < D; ++c) ar[c] *= alpha;
    }
  }
}
NAPKIN_VECTOR_CLONES void online_softmax(float* s, int64_t lds, int64_t rows, int64_t cols, float* m, float* l,
                                         float* acc, int64_t D) {
  online_softmax_body(s, lds, rows, cols, m, l, acc, D);
}
void online_softmax(double* s, int64_t lds, int64_t rows, int64_t cols, double* m, double* l, double* acc,
                    int64_t D) {
  online_softmax_body(s, lds, rows, cols, m, l, acc, D);
}

// The backward's probabilities, in place: s = exp(s - lse of the row).
template <class A>
[[gnu::always_inline]] inline void probabilities_body(A* s, int64_t lds, int64_t rows, int64_t cols, const float* lse) {
  for (int64_t r = 0; r < rows; ++r) {
    A* sr = s + r * lds;
    const A shift = A(lse[r]);
    for (int64_t c = 0; c < cols; ++c) sr[c] = exp_any(A(sr[c] - shift));
  }
}
NAPKIN_VECTOR_CLONES void probabilities(float* s, int64_t lds, int64_t rows, int64_t cols, const float* lse) {
  probabilities_body(s, lds, rows, cols, lse);
}
void probabilities(double* s, int64_t lds, int64_t rows, int64_t cols, const float* lse) {
  probabilities_body(s, lds, rows, cols, lse);
}

// dS = P (dP - D_row), in place of dP.
template <class A>
[[gnu::always_inline]] inline void score_grads_body(const A* p, A* dp, int64_t ld, int64_t rows, int64_t cols, const A* row_dot) {
  for (int64_t r = 0; r < rows; ++r) {
    const A di = row_dot[r];
    const A* pr = p + r * ld;
    A* dpr = dp + r * ld;
    for (int64_t c = 0; c < cols; ++c) dpr[c] = pr[c] * (dpr[c] - di);
  }
}
NAPKIN_VECTOR_CLONES void score_grads(const float* p, float* dp, int64_t ld, int64_t rows, int64_t cols,
                                      const float* row_dot) {
  score_grads_body(p, dp, ld, rows, cols, row_dot);
}
void score_grads(const double* p, double* dp, int64_t ld, int64_t rows, int64_t cols, const double* row_dot) {
  score_grads_body(p, dp, ld, rows, cols, row_dot);
}

// bf16 rows (row stride ld) widened to dense f32 rows of cols.
NAPKIN_VECTOR_CLONES void widen_bf16(const uint16_t* src, int64_t rows, int64_t cols, int64_t ld, float* dst) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[r * cols + c] = bf16_bits_to_float(src[r * ld + c]);
}

// dst row r (stride ldd) = src row r (stride lds) * mul / div[r] (div may be
// null: 1), narrowed to the storage type.
template <class A, class S, class Narrow>
[[gnu::always_inline]] inline void store_rows_body(const A* src, int64_t lds, int64_t rows, int64_t cols, A mul, const A* div, S* dst, int64_t ldd,
                     Narrow narrow) {
  for (int64_t r = 0; r < rows; ++r) {
    const A* sr = src + r * lds;
    S* dr = dst + r * ldd;
    if (div) {
      const A dv = div[r];
      for (int64_t c = 0; c < cols; ++c) dr[c] = narrow(A(sr[c] * mul / dv));
    } else {
      for (int64_t c = 0; c < cols; ++c) dr[c] = narrow(A(sr[c] * mul));
    }
  }
}
NAPKIN_VECTOR_CLONES void store_rows(const float* src, int64_t lds, int64_t rows, int64_t cols, float mul,
                                     const float* div, float* dst, int64_t ldd) {
  store_rows_body(src, lds, rows, cols, mul, div, dst, ldd, [](float x) { return x; });
}
NAPKIN_VECTOR_CLONES void store_rows(const float* src, int64_t lds, int64_t rows, int64_t cols, float mul,
                                     const float* div, uint16_t* dst, int64_t ldd) {
  store_rows_body(src, lds, rows, cols, mul, div, dst, ldd, float_to_bf16_bits_inline);
}
void store_rows(const double* src, int64_t lds, int64_t rows, int64_t cols, double mul, const double* div,
                double* dst, int64_t ldd) {
  store_rows_body(src, lds, rows, cols, mul, div, dst, ldd, [](double x) { return x; });
}

// An element type: how it is stored, what it is computed in, and the exact
// widening / round-to-nearest-even narrowing between them.
template <class T>
struct SameElem {  // stored as computed: f32, f64
  using Storage = T;
  using Acc = T;
  static T widen(T x) { return x; }
  static void store(const T* src, int64_t lds, int64_t rows, int64_t cols, T mul, const T* div, T* dst, int64_t ldd) {
    store_rows(src, lds, rows, cols, mul, div, dst, ldd);
  }
};
using F32Elem = SameElem<float>;
using F64Elem = SameElem<double>;
struct BF16Elem {
  using Storage = uint16_t;
  using Acc = float;
  static float widen(uint16_t x) { return bf16_bits_to_float(x); }
  static void store(const float* src, int64_t lds, int64_t rows, int64_t cols, float mul, const float* div,
                    uint16_t* dst, int64_t ldd) {
    store_rows(src, lds, rows, cols, mul, div, dst, ldd);
  }
};
struct F16Elem {
  using Storage = uint16_t;
  using Acc = float;
  // All 65536 codes decoded once (float_formats' decoder is not inline).
  static float widen(uint16_t x) {
    static const std::vector<float> table = [] {
      std::vector<float> t(65536);
      for (uint32_t i = 0; i < 65536; ++i) t[i] = f16_bits_to_float(uint16_t(i));
      return t;
    }();
    return table[x];
  }
  static void store(const float* src, int64_t lds, int64_t rows, int64_t cols, float mul, const float* div,
                    uint16_t* dst, int64_t ldd) {
    store_rows_body(src, lds, rows, cols, mul, div, dst, ldd, float_to_f16_bits);
  }
};

// Per-thread tiles, grown on first use and kept (no allocation per step once
// warm). Sizes are tile-sized, except dq and row_dot: one (batch, kv head)'s
// query rows, [group, q_len, head_dim] and [group, q_len].
template <class A>
struct Scratch {
  std::vector<A> q, k, v, d_o, s, dp, acc, m, l, dq, row_dot;
  static Scratch& get() {
    thread_local Scratch s;
    return s;
  }
  static A* sized(std::vector<A>& v, int64_t n) {
    if (int64_t(v.size()) < n) v.resize(size_t(n));
    return v.data();
  }
};

// rows x cols of `src` (row stride ld) as Acc: in place when no conversion is
// needed and the rows do not overlap, else widened into buf (row stride cols).
template <class E>
const typename E::Acc* load_rows(const typename E::Storage* src, int64_t rows, int64_t cols, int64_t ld,
                                 std::vector<typename E::Acc>& buf, int64_t* out_ld) {
  using A = typename E::Acc;
  if constexpr (std::is_same_v<typename E::Storage, A>) {
    if (ld >= cols) {
      *out_ld = ld;
      return src;
    }
  }
  A* dst = Scratch<A>::sized(buf, rows * cols);
  if constexpr (std::is_same_v<E, BF16Elem>) {
    widen_bf16(src, rows, cols, ld, dst);
  } else {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) dst[r * cols + c] = E::widen(src[r * ld + c]);
  }
  *out_ld = cols;
  return dst;
}

// Rows [0, rows) of x (row stride ld) rotated by the table's rows
// first_pos, first_pos + 1, ...; inverse: by the negated angles.
template <class A>
void rotate_rows(const RopeDesc& r, const RopeTable& t, int64_t first_pos, bool inverse, A* x, int64_t rows,
                 int64_t ld) {
  for (int64_t i = 0; i < rows; ++i)
    rope_rotate_row(r.style, r.dim, t.cos_row(first_pos + i), t.sin_row(first_pos + i), inverse, x + i * ld);
}

// load_rows of q or k rows whose first is at position first_pos, rotated
// when there is a table (then always a copy: the operand stays as it is).
template <class E>
const typename E::Acc* load_operand(const AttentionDesc& d, const RopeTable* rope, int64_t first_pos,
                                    const typename E::Storage* src, int64_t rows, int64_t cols, int64_t ld,
                                    std::vector<typename E::Acc>& buf, int64_t* out_ld) {
  using A = typename E::Acc;
  if (!rope) return load_rows<E>(src, rows, cols, ld, buf, out_ld);
  A* dst = Scratch<A>::sized(buf, rows * cols);
  if constexpr (std::is_same_v<E, BF16Elem>) {
    widen_bf16(src, rows, cols, ld, dst);
  } else {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) dst[r * cols + c] = E::widen(src[r * ld + c]);
  }
  rotate_rows(*d.rope, *rope, first_pos, false, dst, rows, cols);
  *out_ld = cols;
  return dst;
}

// Scores of the key columns a query row may not see, in a tile of a causal
// attention that crosses the diagonal, set to -inf (exp gives 0).
template <class A>
void mask_tile(A* s, int64_t lds, int64_t rows, int64_t cols, int64_t i0, int64_t j0, int64_t offset) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t first_hidden = std::max<int64_t>(i0 + r + offset + 1 - j0, 0);  // column of key i + offset + 1
    for (int64_t c = first_hidden; c < cols; ++c) s[r * lds + c] = -std::numeric_limits<A>::infinity();
  }
}

template <class T>
T* at(T* base, const AttentionDesc::Strides& st, int64_t b, int64_t h, int64_t row) {
  return base + b * st.batch + h * st.head + row * st.row;
}

template <class E>
struct Kernels {
  using S = typename E::Storage;
  using A = typename E::Acc;

  // One forward work item: query rows [i0, i0 + rows) of head h in batch b.
  static void forward_item(const AttentionDesc& d, const RopeTable* rope, const S* q, const S* k, const S* v, S* o,
                           float* lse, int64_t b, int64_t h, int64_t i0) {
    Scratch<A>& sc = Scratch<A>::get();
    const int64_t D = d.head_dim, rows = std::min(kQueryBlock, d.q_len - i0);
    const int64_t g = h / (d.heads / d.kv_heads), offset = d.kv_len - d.q_len;
    const A scale = A(d.scale), ninf = -std::numeric_limits<A>::infinity();
    int64_t ldq, ldk, ldv;
    const A* qt = load_operand<E>(d, rope, i0 + offset, at(q, d.q, b, h, i0), rows, D, d.q.row, sc.q, &ldq);
    A* s = Scratch<A>::sized(sc.s, kQueryBlock * kKeyBlock);
    A* acc = Scratch<A>::sized(sc.acc, kQueryBlock * D);
    A* m = Scratch<A>::sized(sc.m, kQueryBlock);
    A* l = Scratch<A>::sized(sc.l, kQueryBlock);
    std::fill(acc, acc + rows * D, A(0));
    std::fill(m, m + rows, ninf);
    std::fill(l, l + rows, A(0));
    // The last row sees keys up to i0 + rows - 1 + offset; no later key block
    // has a visible score.
    const int64_t key_end = d.causal ? std::min(d.kv_len, i0 + rows + offset) : d.kv_len;
    for (int64_t j0 = 0; j0 < key_end; j0 += kKeyBlock) {
      const int64_t cols = std::min(kKeyBlock, key_end - j0);
      const A* kt = load_operand<E>(d, rope, j0, at(k, d.k, b, g, j0), cols, D, d.k.row, sc.k, &ldk);
      const A* vt = load_rows<E>(at(v, d.v, b, g, j0), cols, D, d.v.row, sc.v, &ldv);
      tile_gemm(false, true, rows, cols, D, scale, qt, ldq, kt, ldk, A(0), s, kKeyBlock);
      if (d.causal && j0 + cols - 1 > i0 + offset) mask_tile(s, kKeyBlock, rows, cols, i0, j0, offset);
      online_softmax(s, kKeyBlock, rows, cols, m, l, acc, D);
      tile_gemm(false, false, rows, D, cols, A(1), s, kKeyBlock, vt, ldv, A(1), acc, D);
    }
    E::store(acc, D, rows, D, A(1), l, at(o, d.o, b, h, i0), d.o.row);
    float* lse_out = lse + (b * d.heads + h) * d.q_len + i0;
    for (int64_t r = 0; r < rows; ++r) lse_out[r] = float(m[r] + std::log(l[r]));
  }

  static void forward(const AttentionDesc& d, const RopeTable* rope, const void* q, const void* k, const void* v, void* o, float* lse,
                      ThreadPool& pool) {
    const int64_t blocks = (d.q_len + kQueryBlock - 1) / kQueryBlock;
    const int64_t items = d.batch * d.heads * blocks;
    pool.parallel_for(items, [&](int64_t begin, int64_t end) {
      for (int64_t it = begin; it < end; ++it) {
        const int64_t qb = it % blocks, bh = it / blocks;
        forward_item(d, rope, static_cast<const S*>(q), static_cast<const S*>(k), static_cast<const S*>(v),
                     static_cast<S*>(o), lse, bh / d.heads, bh % d.heads, qb * kQueryBlock);
      }
    });
  }

  // One backward work item: kv head g of batch b, with the query heads
  // [g * group, (g + 1) * group) that read it.
  static void backward_item(const AttentionDesc& d, const RopeTable* rope, const S* q, const S* k, const S* v, const S* o, const float* lse,
                            const S* d_o, S* dq, S* dk, S* dv, int64_t b, int64_t g) {
    Scratch<A>& sc = Scratch<A>::get();
    const int64_t D = d.head_dim, T = d.q_len, group = d.heads / d.kv_heads, h0 = g * group;
    const int64_t offset = d.kv_len - d.q_len;
    const A scale = A(d.scale);
    A* dq_acc = Scratch<A>::sized(sc.dq, group * T * D);
    A* row_dot = Scratch<A>::sized(sc.row_dot, group * T);  // D_i = do_i . o_i
    A* s = Scratch<A>::sized(sc.s, kQueryBlock * kKeyBlock);
    A* dp = Scratch<A>::sized(sc.dp, kQueryBlock * kKeyBlock);
    A* dkv = Scratch<A>::sized(sc.acc, 2 * kKeyBlock * D);
    A* dk_acc = dkv;
    A* dv_acc = dkv + kKeyBlock * D;
    std::fill(dq_acc, dq_acc + group * T * D, A(0));
    for (int64_t hl = 0; hl < group; ++hl)
      for (int64_t i = 0; i < T; ++i) {
        const S* dor = at(d_o, d.d_o, b, h0 + hl, i);
        const S* orow = at(o, d.o, b, h0 + hl, i);
        A sum = 0;
        for (int64_t c = 0; c < D; ++c) sum += E::widen(dor[c]) * E::widen(orow[c]);
        row_dot[hl * T + i] = sum;
      }

    int64_t ldk, ldv, ldq, lddo;
    for (int64_t j0 = 0; j0 < d.kv_len; j0 += kKeyBlock) {
      const int64_t cols = std::min(kKeyBlock, d.kv_len - j0);
      const A* kt = load_operand<E>(d, rope, j0, at(k, d.k, b, g, j0), cols, D, d.k.row, sc.k, &ldk);
      const A* vt = load_rows<E>(at(v, d.v, b, g, j0), cols, D, d.v.row, sc.v, &ldv);
      std::fill(dkv, dkv + 2 * kKeyBlock * D, A(0));
      // The first query that sees key j0 is j0 - offset; earlier query blocks
      // see nothing of this key block.
      const int64_t first_block = d.causal ? std::max<int64_t>(j0 - offset, 0) / kQueryBlock : 0;
      for (int64_t hl = 0; hl < group; ++hl) {
        const float* lse_h = lse + (b * d.heads + h0 + hl) * T;
        for (int64_t i0 = first_block * kQueryBlock; i0 < T; i0 += kQueryBlock) {
          const int64_t rows = std::min(kQueryBlock, T - i0);
          // Causal: keys past the block's last row's horizon are hidden from
          // every row of it; the tile stops there (>= 1 key: see first_block).
          const int64_t tcols = d.causal ? std::min(cols, i0 + rows + offset - j0) : cols;
          const A* qt = load_operand<E>(d, rope, i0 + offset, at(q, d.q, b, h0 + hl, i0), rows, D, d.q.row, sc.q, &ldq);
          const A* dot = load_rows<E>(at(d_o, d.d_o, b, h0 + hl, i0), rows, D, d.d_o.row, sc.d_o, &lddo);
          // P = exp(scale Q Kᵀ - lse), the forward's probabilities.
          tile_gemm(false, true, rows, tcols, D, scale, qt, ldq, kt, ldk, A(0), s, kKeyBlock);
          if (d.causal && j0 + tcols - 1 > i0 + offset) mask_tile(s, kKeyBlock, rows, tcols, i0, j0, offset);
          probabilities(s, kKeyBlock, rows, tcols, lse_h + i0);
          // dV += Pᵀ dO
          tile_gemm(true, false, tcols, D, rows, A(1), s, kKeyBlock, dot, lddo, A(1), dv_acc, D);
          // dS = P (dO Vᵀ - D), in place of dP
          tile_gemm(false, true, rows, tcols, D, A(1), dot, lddo, vt, ldv, A(0), dp, kKeyBlock);
          score_grads(s, dp, kKeyBlock, rows, tcols, row_dot + hl * T + i0);
          // dK += dSᵀ Q, dQ += dS K (both scaled once, on store)
          tile_gemm(true, false, tcols, D, rows, A(1), dp, kKeyBlock, qt, ldq, A(1), dk_acc, D);
          tile_gemm(false, false, rows, D, tcols, A(1), dp, kKeyBlock, kt, ldk, A(1), dq_acc + (hl * T + i0) * D, D);
        }
      }
      if (rope) rotate_rows(*d.rope, *rope, j0, true, dk_acc, cols, D);
      E::store(dk_acc, D, cols, D, scale, nullptr, at(dk, d.dk, b, g, j0), d.dk.row);
      E::store(dv_acc, D, cols, D, A(1), nullptr, at(dv, d.dv, b, g, j0), d.dv.row);
    }
    for (int64_t hl = 0; hl < group; ++hl) {
      if (rope) rotate_rows(*d.rope, *rope, offset, true, dq_acc + hl * T * D, T, D);
      E::store(dq_acc + hl * T * D, D, T, D, scale, nullptr, at(dq, d.dq, b, h0 + hl, 0), d.dq.row);
    }
  }

  static void backward(const AttentionDesc& d, const RopeTable* rope, const void* q, const void* k, const void* v, const void* o,
                       const float* lse, const void* d_o, void* dq, void* dk, void* dv, ThreadPool& pool) {
    const int64_t items = d.batch * d.kv_heads;
    pool.parallel_for(items, [&](int64_t begin, int64_t end) {
      for (int64_t it = begin; it < end; ++it)
        backward_item(d, rope, static_cast<const S*>(q), static_cast<const S*>(k), static_cast<const S*>(v),
                      static_cast<const S*>(o), lse, static_cast<const S*>(d_o), static_cast<S*>(dq),
                      static_cast<S*>(dk), static_cast<S*>(dv), it / d.kv_heads, it % d.kv_heads);
    });
  }
};

// Calls f.template operator()<E>() with E the element type of t.
template <class F>
void with_elem(GemmType t, F&& f) {
  switch (t) {
    case GemmType::F32: return f.template operator()<F32Elem>();
    case GemmType::F64: return f.template operator()<F64Elem>();
    case GemmType::BF16: return f.template operator()<BF16Elem>();
    case GemmType::F16: return f.template operator()<F16Elem>();
  }
}

}  // namespace

struct Attention::Impl {
  std::optional<RopeTable> rope;  // positions [0, kv_len), when desc.rope
};

Attention::Attention(AttentionDesc desc, GemmType type) : d_(desc), type_(type), impl_(std::make_unique<Impl>()) {
  auto fail = [](const std::string& what) { throw Error("attention: " + what); };
  const std::pair<const char*, int64_t> dims[] = {{"batch", d_.batch},     {"heads", d_.heads},
                                                  {"kv_heads", d_.kv_heads}, {"q_len", d_.q_len},
                                                  {"kv_len", d_.kv_len},   {"head_dim", d_.head_dim}};
  for (const auto& [name, value] : dims)
    if (value <= 0) fail(std::string(name) + " must be positive, got " + std::to_string(value));
  if (d_.heads % d_.kv_heads != 0)
    fail("heads (" + std::to_string(d_.heads) + ") must be a multiple of kv_heads (" + std::to_string(d_.kv_heads) +
         ")");
  if (d_.causal && d_.q_len > d_.kv_len)
    fail("causal attention needs q_len <= kv_len, got q_len " + std::to_string(d_.q_len) + " and kv_len " +
         std::to_string(d_.kv_len));
  if (!std::isfinite(d_.scale)) fail("scale must be finite");
  if (d_.rope) {
    if (d_.rope->dim != d_.head_dim || d_.head_dim % 2 != 0)
      fail("rope rotates " + std::to_string(d_.rope->dim) + " elements of a row, head_dim is " +
           std::to_string(d_.head_dim) + " (they must be equal and even)");
    impl_->rope = make_rope_table(*d_.rope, d_.kv_len);
  }
  const std::pair<const char*, const AttentionDesc::Strides*> strides[] = {
      {"q", &d_.q}, {"k", &d_.k}, {"v", &d_.v}, {"o", &d_.o}, {"do", &d_.d_o}, {"dq", &d_.dq}, {"dk", &d_.dk},
      {"dv", &d_.dv}};
  for (const auto& [name, st] : strides)
    if (st->batch < 0 || st->head < 0 || st->row < 0)
      fail(std::string(name) + " strides must be non-negative, got (" + std::to_string(st->batch) + ", " +
           std::to_string(st->head) + ", " + std::to_string(st->row) + ")");
}

Attention::~Attention() = default;
Attention::Attention(Attention&&) noexcept = default;

void Attention::forward(const void* q, const void* k, const void* v, void* o, float* lse, ThreadPool& pool) const {
  const RopeTable* rope = impl_->rope ? &*impl_->rope : nullptr;
  if (type_ == GemmType::BF16 && amx::available())
    return attention_amx::forward(d_, rope, static_cast<const uint16_t*>(q), static_cast<const uint16_t*>(k),
                                  static_cast<const uint16_t*>(v), static_cast<uint16_t*>(o), lse, pool);
  with_elem(type_, [&]<class E>() { Kernels<E>::forward(d_, rope, q, k, v, o, lse, pool); });
}

void Attention::backward(const void* q, const void* k, const void* v, const void* o, const float* lse,
                         const void* d_o, void* dq, void* dk, void* dv, ThreadPool& pool) const {
  const RopeTable* rope = impl_->rope ? &*impl_->rope : nullptr;
  if (type_ == GemmType::BF16 && amx::available())
    return attention_amx::backward(d_, rope, static_cast<const uint16_t*>(q), static_cast<const uint16_t*>(k),
                                   static_cast<const uint16_t*>(v), static_cast<const uint16_t*>(o), lse,
                                   static_cast<const uint16_t*>(d_o), static_cast<uint16_t*>(dq),
                                   static_cast<uint16_t*>(dk), static_cast<uint16_t*>(dv), pool);
  with_elem(type_, [&]<class E>() { Kernels<E>::backward(d_, rope, q, k, v, o, lse, d_o, dq, dk, dv, pool); });
}

}  // namespace napkin::runtime
