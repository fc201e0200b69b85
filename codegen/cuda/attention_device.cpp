// The device side of fused attention: the templates every attention kernel
// instantiates (codegen/cuda/attention.cpp emits, per plan kernel, a config
// struct of compile-time shapes, strides and flags and __global__ wrappers
// that call these). Part of the prelude (codegen/cuda/prelude.cpp appends
// it), so the templates exist once per translation unit however many
// attention kernels share it; uninstantiated templates cost NVRTC a parse.
//
// The tiling, the launches, the fragment layouts and why the results are
// deterministic are described at the top of codegen/cuda/attention.cpp.
//
// Config C (the emitted struct): B, HQ, HK, T, S, D, TILE (the SIMT key or
// query tile), CAUSAL, SCALE, SCALE_LOG2 (= SCALE * log2 e), ROPE, ROPE_HALF
// and rope_inv(j) (the rotary frequencies, with ROPE), and per operand X
// of {Q, K, V, O, L (lse), DO, DQ, DK, DV}: X_B, X_H, X_T (element strides of
// batch, head, row) and X_VEC (rows load as 16-byte vectors).
// Traits X: napkin_attn_{bf16,f16} (tensor cores: St unsigned short, Acc
// float, pack, mma) and napkin_attn_{f32,f64} (SIMT: St == Acc).
#include "codegen/cuda/emit.h"

namespace napkin::codegen::cuda::detail {

std::string_view attention_prelude() {
  static constexpr std::string_view text = R"ATTN(
// ---- fused attention (codegen/cuda/attention_device.cpp) ----
struct napkin_attn_f32 {
  typedef float St;
  typedef float Acc;
  static NAPKIN_DEVICE float load(float x) { return x; }
  static NAPKIN_DEVICE float store(float x) { return x; }
};
struct napkin_attn_f64 {
  typedef double St;
  typedef double Acc;
  static NAPKIN_DEVICE double load(double x) { return x; }
  static NAPKIN_DEVICE double store(double x) { return x; }
};
struct napkin_attn_bf16 {
  typedef unsigned short St;
  typedef float Acc;
  static NAPKIN_DEVICE float load(unsigned short x) { return napkin_bf16_to_f32(x); }
  static NAPKIN_DEVICE unsigned short store(float x) { return napkin_f32_to_bf16(x); }
  static NAPKIN_DEVICE unsigned pack(float lo, float hi) { return napkin_pack_bf16x2(lo, hi); }
  static NAPKIN_DEVICE void mma(float* d, const unsigned* a, const unsigned* b) { napkin_mma_m16n8k16_bf16(d, a, b); }
};
struct napkin_attn_f16 {
  typedef unsigned short St;
  typedef float Acc;
  static NAPKIN_DEVICE float load(unsigned short x) { return napkin_f16_to_f32(x); }
  static NAPKIN_DEVICE unsigned short store(float x) { return napkin_f32_to_f16(x); }
  static NAPKIN_DEVICE unsigned pack(float lo, float hi) { return napkin_pack_f16x2(lo, hi); }
  static NAPKIN_DEVICE void mma(float* d, const unsigned* a, const unsigned* b) { napkin_mma_m16n8k16_f16(d, a, b); }
};

// Two consecutive 16-bit elements (the lower index in the low half) as one
// fragment register; p is 4-byte aligned (an even column of a tile whose
// leading dimension is even).
NAPKIN_DEVICE unsigned napkin_attn_u32(const unsigned short* p) { return *(const unsigned*)p; }

// The m16n8k16 A fragment of one lane (lane = 4g + t) from a 16-bit tile in
// shared memory (leading dimension ld), p pointing at the lane's first
// element, (row g, column 2t) of the 16x16 block: rows g and g + 8, columns
// 2t, 2t + 1 and 2t + 8, 2t + 9 (PTX ISA, mma.m16n8k16 fragments).
NAPKIN_DEVICE void napkin_attn_a_frag(unsigned (&a)[4], const unsigned short* p, int ld) {
  a[0] = napkin_attn_u32(p);
  a[1] = napkin_attn_u32(p + 8 * ld);
  a[2] = napkin_attn_u32(p + 8);
  a[3] = napkin_attn_u32(p + 8 * ld + 8);
}

// The A fragment of a 16x16 block whose columns 0-7 and 8-15 are two f32
// accumulator fragments (C layout), rounded to X's 16-bit type: the C layout
// of an m16n8 tile is one half of the A layout, so P and dS feed the next
// product without going through shared memory.
template <class X>
NAPKIN_DEVICE void napkin_attn_a_from_acc(unsigned (&a)[4], const float (&lo)[4], const float (&hi)[4]) {
  a[0] = X::pack(lo[0], lo[1]);
  a[1] = X::pack(lo[2], lo[3]);
  a[2] = X::pack(hi[0], hi[1]);
  a[3] = X::pack(hi[2], hi[3]);
}

// B fragments of the m16n8k16 products, two 8-column blocks at once, by
// ldmatrix from row-major 16-bit tiles in shared memory (leading dimension ld,
// a multiple of 8 elements whose rows are 16 bytes apart modulo 128, so the
// 8 rows of a matrix fall in 8 different bank quads):
//  - napkin_attn_b_rows: B[k][n] = tile[n][k] (S = Q K^T: K's rows are B's
//    columns), columns n0 .. n0 + 15 over k0 .. k0 + 15;
//  - napkin_attn_b_cols: B[k][n] = tile[k][n] (O = P V: V itself is B),
//    rows k0 .. k0 + 15, columns n0 .. n0 + 15, by ldmatrix's transpose.
// b[0], b[1] are the B fragment of columns n0 .. n0 + 7, b[2], b[3] that of
// n0 + 8 .. n0 + 15. Lane l gives the address of row l % 8 of matrix l / 8.
NAPKIN_DEVICE void napkin_attn_b_rows(unsigned (&b)[4], const unsigned short* tile, int ld, int n0, int k0) {
  const int lane = (int)(threadIdx.x & 31u), m = lane >> 3;
  napkin_ldmatrix_x4(b, tile + (n0 + (m >> 1) * 8 + (lane & 7)) * ld + k0 + (m & 1) * 8);
}
NAPKIN_DEVICE void napkin_attn_b_cols(unsigned (&b)[4], const unsigned short* tile, int ld, int k0, int n0) {
  const int lane = (int)(threadIdx.x & 31u), m = lane >> 3;
  napkin_ldmatrix_x4_trans(b, tile + (k0 + (m & 1) * 8 + (lane & 7)) * ld + n0 + (m >> 1) * 8);
}

// Rows [0, ROWS) x columns [0, DP) of a tile whose row r starts at
// src + r * stride, rows >= valid and columns >= D as zeros (padding must be
// zero: a padded key's p is masked to 0, and 0 * garbage is not 0), into dst
// (row-major, leading dimension ld). All threads of the block take part,
// thread by thread along a row, so global reads coalesce.
template <class X, int D, int DP, int ROWS, bool VEC>
NAPKIN_DEVICE void napkin_attn_tile(typename X::St* dst, int ld, const typename X::St* __restrict__ src,
                                    long long stride, int valid) {
  typedef typename X::St St;
  constexpr int E = VEC ? 16 / (int)sizeof(St) : 1;  // elements per load
  constexpr int CH = DP / E;                         // loads per row
  for (int c = (int)threadIdx.x; c < ROWS * CH; c += (int)blockDim.x) {
    const int r = c / CH, col = (c % CH) * E;
    if constexpr (VEC) {
      uint4 raw = make_uint4(0u, 0u, 0u, 0u);
      if (r < valid && col < D) raw = *(const uint4*)(src + r * stride + col);
      *(uint4*)(dst + r * ld + col) = raw;
    } else {
      dst[r * ld + col] = (r < valid && col < D) ? src[r * stride + col] : St(0);
    }
  }
}

// napkin_attn_tile's load started without registers when rows load as
// 16-byte vectors (cp.async; complete after napkin_cp_async_wait and a
// barrier), else done at once by napkin_attn_tile. Padding rows and columns
// are zero-filled either way.
template <class X, int D, int DP, int ROWS, bool VEC>
NAPKIN_DEVICE void napkin_attn_tile_start(typename X::St* dst, int ld, const typename X::St* __restrict__ src,
                                          long long stride, int valid) {
  if constexpr (VEC) {
    constexpr int E = 16 / (int)sizeof(typename X::St), CH = DP / E;
    for (int c = (int)threadIdx.x; c < ROWS * CH; c += (int)blockDim.x) {
      const int r = c / CH, col = (c % CH) * E;
      const bool in = r < valid && col < D;
      napkin_cp_async16(dst + r * ld + col, in ? src + r * stride + col : src, in);
    }
  } else {
    napkin_attn_tile<X, D, DP, ROWS, false>(dst, ld, src, stride, valid);
  }
}

// The same tile load in two halves: fetch (global -> this thread's
// registers) and put (registers -> shared), so a block fetches the next tile
// while it computes on the current one (register double buffering: the
// global loads are in flight during the mma work). THREADS is the block size.
template <class X, int D, int DP, int ROWS, bool VEC, int THREADS>
struct napkin_attn_stage {
  typedef typename X::St St;
  static constexpr int E = VEC ? 16 / (int)sizeof(St) : 1, CH = DP / E, N = (ROWS * CH + THREADS - 1) / THREADS;
  uint4 raw[VEC ? N : 1];
  St val[VEC ? 1 : N];
  NAPKIN_DEVICE void fetch(const St* __restrict__ src, long long stride, int valid) {
    NAPKIN_UNROLL
    for (int n = 0; n < N; ++n) {
      const int c = (int)threadIdx.x + n * THREADS, r = c / CH, col = (c % CH) * E;
      const bool in = c < ROWS * CH && r < valid && col < D;
      if constexpr (VEC) {
        raw[n] = make_uint4(0u, 0u, 0u, 0u);
        if (in) raw[n] = *(const uint4*)(src + r * stride + col);
      } else {
        val[n] = in ? src[r * stride + col] : St(0);
      }
    }
  }
  NAPKIN_DEVICE void put(St* dst, int ld) const {
    NAPKIN_UNROLL
    for (int n = 0; n < N; ++n) {
      const int c = (int)threadIdx.x + n * THREADS, r = c / CH, col = (c % CH) * E;
      if (c >= ROWS * CH) continue;
      if constexpr (VEC) {
        *(uint4*)(dst + r * ld + col) = raw[n];
      } else {
        dst[r * ld + col] = val[n];
      }
    }
  }
};

// Backward, first launch: delta_i = do_i . o_i per query row (b, h, i),
// into scratch as Acc; 8 consecutive threads per row, thread p summing
// d = p, p + 8, ... in order, the 8 partial sums combined by an xor
// butterfly (so a warp's loads cover 4 rows' contiguous 16-byte runs, not 32
// rows' scattered elements). Every lane reaches the shuffles.
template <class C, class X>
NAPKIN_DEVICE void napkin_attn_delta(const typename X::St* __restrict__ o, const typename X::St* __restrict__ dout,
                                     typename X::Acc* __restrict__ delta) {
  typedef typename X::Acc A;
  const long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x, row = tid / 8;
  const int part = (int)(tid % 8);
  const bool in = row < (long long)C::B * C::HQ * C::T;
  A s = A(0);
  if (in) {
    const int i = (int)(row % C::T), h = (int)(row / C::T % C::HQ), b = (int)(row / C::T / C::HQ);
    const typename X::St* op = o + b * C::O_B + h * C::O_H + i * C::O_T;
    const typename X::St* dp = dout + b * C::DO_B + h * C::DO_H + i * C::DO_T;
    for (int d = part; d < C::D; d += 8) s += X::load(op[d]) * X::load(dp[d]);
  }
  s += napkin_shfl_xor(s, 1);
  s += napkin_shfl_xor(s, 2);
  s += napkin_shfl_xor(s, 4);
  if (in && part == 0) delta[row] = s;
}

// ---- rotary embeddings fused into the loads (C::ROPE; runtime/rope.h) ----
// q rows are rotated at position i + S - T, k rows at j, as they reach shared
// memory or registers; the backward rotates dq and dk back (inverse) before
// storing them. Pair j of a row: elements j and j + D/2 (C::ROPE_HALF) or 2j
// and 2j + 1; its angle at position p is the f32 product (float)p *
// inv_freq_j (C::rope_inv, the host's frequencies). Its cos and sin: cosf and
// sinf (within 2 ulp of the CPU's table) where the arithmetic A is f32; for
// f64 models in double, rounded to f32, the CPU table's values.
template <class C, class A>
NAPKIN_DEVICE void napkin_rope_pair(int p, int j, bool inverse, int& i1, int& i2, float& c, float& s) {
  i1 = C::ROPE_HALF ? j : 2 * j;
  i2 = C::ROPE_HALF ? j + C::D / 2 : 2 * j + 1;
  const A a = (A)((float)p * C::rope_inv(j));
  c = (float)napkin_cos(a);
  s = (float)napkin_sin(a);
  if (inverse) s = -s;
}

// Rows [0, valid) of a tile of ROWS rows (leading dimension ld, elements
// X::St), row r at position p0 + r, rotated in place by all threads of the
// block; the caller puts barriers around it.
template <class C, class X, int ROWS>
NAPKIN_DEVICE void napkin_attn_rope_tile(typename X::St* tile, int ld, int p0, int valid, bool inverse) {
  typedef typename X::Acc A;
  constexpr int H = C::D / 2;
  for (int c = (int)threadIdx.x; c < ROWS * H; c += (int)blockDim.x) {
    const int r = c / H;
    if (r >= valid) break;  // r grows with c
    int i1, i2;
    float cs, sn;
    napkin_rope_pair<C, A>(p0 + r, c % H, inverse, i1, i2, cs, sn);
    typename X::St* row = tile + r * ld;
    const A x1 = X::load(row[i1]), x2 = X::load(row[i2]);
    row[i1] = X::store(x1 * (A)cs - x2 * (A)sn);
    row[i2] = X::store(x2 * (A)cs + x1 * (A)sn);
  }
}

// With rope on tensor cores, a gradient of the unrotated q or k: each warp's
// mma accumulator fragments acc[ND][4] (rows r and r + 8 of the tile, columns
// 2t and 2t + 1 of every 8), times `scale`, into the f32 tile [ROWS][D] in
// shared memory, whose rows [0, valid), row i at position p0 + i, the block
// then rotates back by the negated angles. Barriers around, as the tile
// shares memory with buffers the warps read before.
template <class C, int ROWS, int ND>
NAPKIN_DEVICE void napkin_attn_unrotate_fragments(const float (*acc)[4], int r, int t, float scale, float* tile, int p0,
                                                  int valid) {
  __syncthreads();
  NAPKIN_UNROLL
  for (int hr = 0; hr < 2; ++hr)
    NAPKIN_UNROLL
    for (int nd = 0; nd < ND; ++nd)
      NAPKIN_UNROLL
      for (int e = 0; e < 2; ++e) {
        const int d = nd * 8 + 2 * t + e;
        if (d < C::D) tile[(r + 8 * hr) * C::D + d] = acc[nd][2 * hr + e] * scale;
      }
  __syncthreads();
  napkin_attn_rope_tile<C, napkin_attn_f32, ROWS>(tile, C::D, p0, valid, true);
  __syncthreads();
}

// A row of D values in a thread's registers (SIMT) rotated at position p.
template <class C, class A>
NAPKIN_DEVICE void napkin_attn_rope_row(A* x, int p, bool inverse) {
  for (int j = 0; j < C::D / 2; ++j) {
    int i1, i2;
    float cs, sn;
    napkin_rope_pair<C, A>(p, j, inverse, i1, i2, cs, sn);
    const A x1 = x[i1], x2 = x[i2];
    x[i1] = x1 * (A)cs - x2 * (A)sn;
    x[i2] = x2 * (A)cs + x1 * (A)sn;
  }
}

// ---- tensor cores (bf16, f16): 4 warps, 16 rows each ----

// Forward: block = (b, h, 64-query tile), heaviest (causal) tiles first.
template <class C, class X>
NAPKIN_DEVICE void napkin_attn_fwd_mma(const unsigned short* __restrict__ q, const unsigned short* __restrict__ k,
                                       const unsigned short* __restrict__ v, unsigned short* __restrict__ o,
                                       float* __restrict__ lse, unsigned short* smem) {
  constexpr int BM = 64, BN = 64, DP = (C::D + 15) / 16 * 16, LD = DP + 8, KC = DP / 16, ND = DP / 8;
  constexpr int QB = (C::T + BM - 1) / BM;
  const float SL = (float)C::SCALE_LOG2, NEG = -napkin_inf_f32();
  const int warp = (int)(threadIdx.x >> 5), lane = (int)(threadIdx.x & 31u), g = lane >> 2, t = lane & 3;
  const int qb = QB - 1 - (int)(blockIdx.x % QB), bh = (int)(blockIdx.x / QB);
  const int h = bh % C::HQ, b = bh / C::HQ, hk = h / (C::HQ / C::HK), row0 = qb * BM;
  unsigned short* Qs = smem;          // [BM][LD]
  unsigned short* Ks = Qs + BM * LD;  // [BN][LD]
  unsigned short* Vs = Ks + BN * LD;  // [BN][LD]
  const unsigned short* kg = k + b * C::K_B + hk * C::K_H;
  const unsigned short* vg = v + b * C::V_B + hk * C::V_H;
  napkin_attn_tile<X, C::D, DP, BM, C::Q_VEC>(Qs, LD, q + b * C::Q_B + h * C::Q_H + row0 * C::Q_T, C::Q_T,
                                              C::T - row0);
  __syncthreads();
  if constexpr (C::ROPE) {
    napkin_attn_rope_tile<C, X, BM>(Qs, LD, row0 + C::S - C::T, C::T - row0, false);
    __syncthreads();
  }
  const int r = warp * 16 + g;  // this thread's rows of the tile: r and r + 8
  unsigned qf[KC][4];
  NAPKIN_UNROLL
  for (int kc = 0; kc < KC; ++kc) {
    napkin_attn_a_frag(qf[kc], Qs + r * LD + kc * 16 + 2 * t, LD);
  }
  float acc[ND][4];
  NAPKIN_UNROLL
  for (int nd = 0; nd < ND; ++nd) acc[nd][0] = acc[nd][1] = acc[nd][2] = acc[nd][3] = 0.f;
  float m[2] = {NEG, NEG}, l[2] = {0.f, 0.f};
  // Keys past the last row's diagonal are never visible: not loaded at all.
  const int kend = C::CAUSAL ? min(C::S, row0 + BM + C::S - C::T) : C::S;
  napkin_attn_stage<X, C::D, DP, BN, C::K_VEC, 128> kn;
  napkin_attn_stage<X, C::D, DP, BN, C::V_VEC, 128> vn;
  kn.fetch(kg, C::K_T, C::S);
  vn.fetch(vg, C::V_T, C::S);
  for (int key0 = 0; key0 < kend; key0 += BN) {
    __syncthreads();  // the previous tile's readers are done
    kn.put(Ks, LD);
    vn.put(Vs, LD);
    __syncthreads();
    if constexpr (C::ROPE) {
      napkin_attn_rope_tile<C, X, BN>(Ks, LD, key0, C::S - key0, false);
      __syncthreads();
    }
    if (key0 + BN < kend) {  // the next tile's loads overlap this tile's products
      kn.fetch(kg + (key0 + BN) * C::K_T, C::K_T, C::S - key0 - BN);
      vn.fetch(vg + (key0 + BN) * C::V_T, C::V_T, C::S - key0 - BN);
    }
    float s[BN / 8][4];
    NAPKIN_UNROLL
    for (int nt = 0; nt < BN / 8; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
    NAPKIN_UNROLL
    for (int nt = 0; nt < BN / 8; nt += 2)
      NAPKIN_UNROLL
      for (int kc = 0; kc < KC; ++kc) {
        unsigned bf[4];
        napkin_attn_b_rows(bf, Ks, LD, nt * 8, kc * 16);
        X::mma(s[nt], qf[kc], bf);
        X::mma(s[nt + 1], qf[kc], bf + 2);
      }
    // Scores in log2 units; only a tile crossing the diagonal or the end of
    // the keys is masked.
    const bool edge = key0 + BN > C::S || (C::CAUSAL && key0 + BN - 1 > row0 + C::S - C::T);
    NAPKIN_UNROLL
    for (int nt = 0; nt < BN / 8; ++nt)
      NAPKIN_UNROLL
      for (int e = 0; e < 4; ++e) {
        s[nt][e] *= SL;
        const int j = key0 + nt * 8 + 2 * t + (e & 1), i = row0 + r + (e >> 1) * 8;
        if (edge && (j >= C::S || (C::CAUSAL && j > i + C::S - C::T))) s[nt][e] = NEG;
      }
    // Online softmax per row: the row's 64 scores sit in the 4 lanes of a quad.
    NAPKIN_UNROLL
    for (int hr = 0; hr < 2; ++hr) {
      float mx = m[hr];
      NAPKIN_UNROLL
      for (int nt = 0; nt < BN / 8; ++nt) mx = fmaxf(mx, fmaxf(s[nt][2 * hr], s[nt][2 * hr + 1]));
      mx = fmaxf(mx, napkin_shfl_xor(mx, 1));
      mx = fmaxf(mx, napkin_shfl_xor(mx, 2));
      const float base = mx == NEG ? 0.f : mx;  // a row with no visible key yet: p = 0, not NaN
      const float alpha = exp2f(m[hr] - base);
      m[hr] = mx;
      l[hr] *= alpha;
      NAPKIN_UNROLL
      for (int nd = 0; nd < ND; ++nd) {
        acc[nd][2 * hr] *= alpha;
        acc[nd][2 * hr + 1] *= alpha;
      }
      NAPKIN_UNROLL
      for (int nt = 0; nt < BN / 8; ++nt)
        NAPKIN_UNROLL
        for (int e = 2 * hr; e < 2 * hr + 2; ++e) {
          s[nt][e] = exp2f(s[nt][e] - base);
          l[hr] += s[nt][e];
        }
    }
    // O += P V: the S accumulators of key columns 16kk..16kk+15 are, packed,
    // exactly the A fragment of rows r, r+8 (C layout = A layout halves).
    NAPKIN_UNROLL
    for (int kk = 0; kk < BN / 16; ++kk) {
      unsigned af[4];
      napkin_attn_a_from_acc<X>(af, s[2 * kk], s[2 * kk + 1]);
      NAPKIN_UNROLL
      for (int nd = 0; nd < ND; nd += 2) {
        unsigned bf[4];
        napkin_attn_b_cols(bf, Vs, LD, kk * 16, nd * 8);
        X::mma(acc[nd], af, bf);
        X::mma(acc[nd + 1], af, bf + 2);
      }
    }
  }
  NAPKIN_UNROLL
  for (int hr = 0; hr < 2; ++hr) {
    l[hr] += napkin_shfl_xor(l[hr], 1);  // a butterfly: all 4 lanes get the same bits
    l[hr] += napkin_shfl_xor(l[hr], 2);
    const int i = row0 + r + 8 * hr;
    if (i >= C::T) continue;
    const float inv = 1.f / l[hr];
    unsigned short* orow = o + b * C::O_B + h * C::O_H + i * C::O_T;
    NAPKIN_UNROLL
    for (int nd = 0; nd < ND; ++nd)
      NAPKIN_UNROLL
      for (int e = 0; e < 2; ++e) {
        const int d = nd * 8 + 2 * t + e;
        if (d < C::D) orow[d] = X::store(acc[nd][2 * hr + e] * inv);
      }
    if (t == 0) lse[b * C::L_B + h * C::L_H + i * C::L_T] = (m[hr] + log2f(l[hr])) * 0x1.62e43p-1f;  // * ln 2
  }
}

// Backward dK, dV: block = (b, kv head, 64-key tile); each warp owns 16 keys
// and walks the query tiles of every query head of the group, in order.
template <class C, class X>
NAPKIN_DEVICE void napkin_attn_bwd_kv_mma(const unsigned short* __restrict__ q, const unsigned short* __restrict__ k,
                                          const unsigned short* __restrict__ v, const unsigned short* __restrict__ dout,
                                          const float* __restrict__ lse, const float* __restrict__ delta,
                                          unsigned short* __restrict__ dk, unsigned short* __restrict__ dv,
                                          unsigned short* smem) {
  constexpr int BM = 64, BN = 64, DP = (C::D + 15) / 16 * 16, LD = DP + 8, KC = DP / 16, ND = DP / 8;
  constexpr int KB = (C::S + BN - 1) / BN, G = C::HQ / C::HK;
  const float SL = (float)C::SCALE_LOG2, INF = napkin_inf_f32();
  const int warp = (int)(threadIdx.x >> 5), lane = (int)(threadIdx.x & 31u), g = lane >> 2, t = lane & 3;
  const int kb = (int)(blockIdx.x % KB), bh = (int)(blockIdx.x / KB), hk = bh % C::HK, b = bh / C::HK, key0 = kb * BN;
  unsigned short* Qbuf = smem;                 // [2][BM][LD]: the query tile computed on, the next one loading
  unsigned short* dObuf = Qbuf + 2 * BM * LD;  // [2][BM][LD]
  float* Ls = (float*)(dObuf + 2 * BM * LD);  // [BM]: lse in log2 units (+inf past the rows)
  float* Dl = Ls + BM;                        // [BM]: delta
  // K and V fragments (A operands) through the Q and dO tiles' space.
  napkin_attn_tile<X, C::D, DP, BN, C::K_VEC>(Qbuf, LD, k + b * C::K_B + hk * C::K_H + key0 * C::K_T, C::K_T,
                                              C::S - key0);
  napkin_attn_tile<X, C::D, DP, BN, C::V_VEC>(dObuf, LD, v + b * C::V_B + hk * C::V_H + key0 * C::V_T,
                                              C::V_T, C::S - key0);
  __syncthreads();
  if constexpr (C::ROPE) {
    napkin_attn_rope_tile<C, X, BN>(Qbuf, LD, key0, C::S - key0, false);
    __syncthreads();
  }
  const int r = warp * 16 + g;  // this thread's keys of the tile: r and r + 8
  unsigned kf[KC][4], vf[KC][4];
  NAPKIN_UNROLL
  for (int kc = 0; kc < KC; ++kc) {
    const int at = r * LD + kc * 16 + 2 * t;
    napkin_attn_a_frag(kf[kc], Qbuf + at, LD);
    napkin_attn_a_frag(vf[kc], dObuf + at, LD);
  }
  float dka[ND][4], dva[ND][4];
  NAPKIN_UNROLL
  for (int nd = 0; nd < ND; ++nd)
    NAPKIN_UNROLL
    for (int e = 0; e < 4; ++e) dka[nd][e] = dva[nd][e] = 0.f;
  // Query tiles wholly before the first key's diagonal see none of these keys.
  // The (head, query tile) pairs in order, each tile's q and do loading
  // while the block computes on the one before (two buffers).
  const int qfirst = C::CAUSAL ? max(0, key0 - (C::S - C::T)) / BM * BM : 0;
  const int tiles = (C::T - qfirst + BM - 1) / BM, n = G * tiles;
  auto start = [&](int it) {
    const int h = hk * G + it / tiles, q0 = qfirst + it % tiles * BM;
    napkin_attn_tile_start<X, C::D, DP, BM, C::Q_VEC>(Qbuf + (it & 1) * BM * LD, LD,
                                                      q + b * C::Q_B + h * C::Q_H + q0 * C::Q_T, C::Q_T, C::T - q0);
    napkin_attn_tile_start<X, C::D, DP, BM, C::DO_VEC>(dObuf + (it & 1) * BM * LD, LD,
                                                       dout + b * C::DO_B + h * C::DO_H + q0 * C::DO_T, C::DO_T,
                                                       C::T - q0);
    napkin_cp_async_commit();
  };
  __syncthreads();  // the fragment loads are done before buffer 0 is refilled
  if (n > 0) start(0);
  for (int it = 0; it < n; ++it) {
    {
      const int h = hk * G + it / tiles, q0 = qfirst + it % tiles * BM;
      unsigned short* Qs = Qbuf + (it & 1) * BM * LD;
      const unsigned short* dOs = dObuf + (it & 1) * BM * LD;
      // The other buffer's last readers finished at the previous iteration's
      // closing barrier.
      if (it + 1 < n) {
        start(it + 1);
        napkin_cp_async_wait<1>();
      } else {
        napkin_cp_async_wait<0>();
      }
      for (int i = (int)threadIdx.x; i < BM; i += (int)blockDim.x) {
        const bool in = q0 + i < C::T;
        Ls[i] = in ? lse[b * C::L_B + h * C::L_H + (q0 + i) * C::L_T] * 0x1.715476p+0f : INF;  // * log2 e
        Dl[i] = in ? delta[((long long)b * C::HQ + h) * C::T + q0 + i] : 0.f;
      }
      __syncthreads();
      if constexpr (C::ROPE) {
        napkin_attn_rope_tile<C, X, BM>(Qs, LD, q0 + C::S - C::T, C::T - q0, false);
        __syncthreads();
      }
      // P^T (keys x queries) = exp2(K Q^T scale log2e - lse log2e).
      float st[BM / 8][4];
      NAPKIN_UNROLL
      for (int nt = 0; nt < BM / 8; ++nt) st[nt][0] = st[nt][1] = st[nt][2] = st[nt][3] = 0.f;
      NAPKIN_UNROLL
      for (int nt = 0; nt < BM / 8; nt += 2)
        NAPKIN_UNROLL
        for (int kc = 0; kc < KC; ++kc) {
          unsigned bf[4];
          napkin_attn_b_rows(bf, Qs, LD, nt * 8, kc * 16);
          X::mma(st[nt], kf[kc], bf);
          X::mma(st[nt + 1], kf[kc], bf + 2);
        }
      const bool diag = C::CAUSAL && key0 + BN - 1 > q0 + C::S - C::T;
      NAPKIN_UNROLL
      for (int nt = 0; nt < BM / 8; ++nt)
        NAPKIN_UNROLL
        for (int e = 0; e < 4; ++e) {
          const int i = nt * 8 + 2 * t + (e & 1), j = key0 + r + (e >> 1) * 8;
          const float p = exp2f(st[nt][e] * SL - Ls[i]);
          st[nt][e] = diag && j > q0 + i + C::S - C::T ? 0.f : p;
        }
      // dV += P^T dO.
      NAPKIN_UNROLL
      for (int kk = 0; kk < BM / 16; ++kk) {
        unsigned af[4];
        napkin_attn_a_from_acc<X>(af, st[2 * kk], st[2 * kk + 1]);
        NAPKIN_UNROLL
        for (int nd = 0; nd < ND; nd += 2) {
          unsigned bf[4];
          napkin_attn_b_cols(bf, dOs, LD, kk * 16, nd * 8);
          X::mma(dva[nd], af, bf);
          X::mma(dva[nd + 1], af, bf + 2);
        }
      }
      // dP^T = V dO^T, then dS^T = P^T (dP^T - delta).
      float ds[BM / 8][4];
      NAPKIN_UNROLL
      for (int nt = 0; nt < BM / 8; ++nt) ds[nt][0] = ds[nt][1] = ds[nt][2] = ds[nt][3] = 0.f;
      NAPKIN_UNROLL
      for (int nt = 0; nt < BM / 8; nt += 2)
        NAPKIN_UNROLL
        for (int kc = 0; kc < KC; ++kc) {
          unsigned bf[4];
          napkin_attn_b_rows(bf, dOs, LD, nt * 8, kc * 16);
          X::mma(ds[nt], vf[kc], bf);
          X::mma(ds[nt + 1], vf[kc], bf + 2);
        }
      NAPKIN_UNROLL
      for (int nt = 0; nt < BM / 8; ++nt)
        NAPKIN_UNROLL
        for (int e = 0; e < 4; ++e) ds[nt][e] = st[nt][e] * (ds[nt][e] - Dl[nt * 8 + 2 * t + (e & 1)]);
      // dK += dS^T Q (scaled once at the end).
      NAPKIN_UNROLL
      for (int kk = 0; kk < BM / 16; ++kk) {
        unsigned af[4];
        napkin_attn_a_from_acc<X>(af, ds[2 * kk], ds[2 * kk + 1]);
        NAPKIN_UNROLL
        for (int nd = 0; nd < ND; nd += 2) {
          unsigned bf[4];
          napkin_attn_b_cols(bf, Qs, LD, kk * 16, nd * 8);
          X::mma(dka[nd], af, bf);
          X::mma(dka[nd + 1], af, bf + 2);
        }
      }
    }
    __syncthreads();  // this tile's readers are done: its buffer, Ls and Dl may be refilled
  }
  const float scale = (float)C::SCALE;
  // With rope, dK of the unrotated k: the scaled f32 tile [BN][D] through
  // shared memory (the q and do buffers are free), rotated back there.
  float* dKs = (float*)smem;
  if constexpr (C::ROPE) napkin_attn_unrotate_fragments<C, BN, ND>(dka, r, t, scale, dKs, key0, C::S - key0);
  NAPKIN_UNROLL
  for (int hr = 0; hr < 2; ++hr) {
    const int j = key0 + r + 8 * hr;
    if (j >= C::S) continue;
    unsigned short* dkrow = dk + b * C::DK_B + hk * C::DK_H + j * C::DK_T;
    unsigned short* dvrow = dv + b * C::DV_B + hk * C::DV_H + j * C::DV_T;
    NAPKIN_UNROLL
    for (int nd = 0; nd < ND; ++nd)
      NAPKIN_UNROLL
      for (int e = 0; e < 2; ++e) {
        const int d = nd * 8 + 2 * t + e;
        if (d < C::D) {
          dkrow[d] = X::store(C::ROPE ? dKs[(r + 8 * hr) * C::D + d] : dka[nd][2 * hr + e] * scale);
          dvrow[d] = X::store(dva[nd][2 * hr + e]);
        }
      }
  }
}

// Backward dQ: block = (b, h, 64-query tile); each warp owns 16 queries and
// walks the visible key tiles in order.
template <class C, class X>
NAPKIN_DEVICE void napkin_attn_bwd_q_mma(const unsigned short* __restrict__ q, const unsigned short* __restrict__ k,
                                         const unsigned short* __restrict__ v, const unsigned short* __restrict__ dout,
                                         const float* __restrict__ lse, const float* __restrict__ delta,
                                         unsigned short* __restrict__ dq, unsigned short* smem) {
  constexpr int BM = 64, BN = 64, DP = (C::D + 15) / 16 * 16, LD = DP + 8, KC = DP / 16, ND = DP / 8;
  constexpr int QB = (C::T + BM - 1) / BM;
  const float SL = (float)C::SCALE_LOG2, INF = napkin_inf_f32();
  const int warp = (int)(threadIdx.x >> 5), lane = (int)(threadIdx.x & 31u), g = lane >> 2, t = lane & 3;
  const int qb = QB - 1 - (int)(blockIdx.x % QB), bh = (int)(blockIdx.x / QB);
  const int h = bh % C::HQ, b = bh / C::HQ, hk = h / (C::HQ / C::HK), row0 = qb * BM;
  unsigned short* Kbuf = smem;                // [2][BN][LD]: the key tile computed on, the next one loading
  unsigned short* Vbuf = Kbuf + 2 * BN * LD;  // [2][BN][LD]
  const unsigned short* kg = k + b * C::K_B + hk * C::K_H;
  const unsigned short* vg = v + b * C::V_B + hk * C::V_H;
  // Q and dO fragments (A operands) through the K and V tiles' space.
  napkin_attn_tile<X, C::D, DP, BM, C::Q_VEC>(Kbuf, LD, q + b * C::Q_B + h * C::Q_H + row0 * C::Q_T, C::Q_T,
                                              C::T - row0);
  napkin_attn_tile<X, C::D, DP, BM, C::DO_VEC>(Vbuf, LD, dout + b * C::DO_B + h * C::DO_H + row0 * C::DO_T,
                                               C::DO_T, C::T - row0);
  __syncthreads();
  if constexpr (C::ROPE) {
    napkin_attn_rope_tile<C, X, BM>(Kbuf, LD, row0 + C::S - C::T, C::T - row0, false);
    __syncthreads();
  }
  const int r = warp * 16 + g;
  unsigned qf[KC][4], df[KC][4];
  NAPKIN_UNROLL
  for (int kc = 0; kc < KC; ++kc) {
    const int at = r * LD + kc * 16 + 2 * t;
    napkin_attn_a_frag(qf[kc], Kbuf + at, LD);
    napkin_attn_a_frag(df[kc], Vbuf + at, LD);
  }
  float L[2], Dd[2];
  NAPKIN_UNROLL
  for (int hr = 0; hr < 2; ++hr) {
    const int i = row0 + r + 8 * hr;
    L[hr] = i < C::T ? lse[b * C::L_B + h * C::L_H + i * C::L_T] * 0x1.715476p+0f : INF;
    Dd[hr] = i < C::T ? delta[((long long)b * C::HQ + h) * C::T + i] : 0.f;
  }
  float dqa[ND][4];
  NAPKIN_UNROLL
  for (int nd = 0; nd < ND; ++nd) dqa[nd][0] = dqa[nd][1] = dqa[nd][2] = dqa[nd][3] = 0.f;
  // The visible key tiles in order, each loading while the block computes on
  // the one before (two buffers).
  const int kend = C::CAUSAL ? min(C::S, row0 + BM + C::S - C::T) : C::S;
  auto start = [&](int key0) {
    const int buf = key0 / BN & 1;
    napkin_attn_tile_start<X, C::D, DP, BN, C::K_VEC>(Kbuf + buf * BN * LD, LD, kg + key0 * C::K_T, C::K_T,
                                                      C::S - key0);
    napkin_attn_tile_start<X, C::D, DP, BN, C::V_VEC>(Vbuf + buf * BN * LD, LD, vg + key0 * C::V_T, C::V_T,
                                                      C::S - key0);
    napkin_cp_async_commit();
  };
  __syncthreads();  // the fragment loads are done before buffer 0 is refilled
  if (kend > 0) start(0);
  for (int key0 = 0; key0 < kend; key0 += BN) {
    unsigned short* Ks = Kbuf + (key0 / BN & 1) * BN * LD;
    const unsigned short* Vs = Vbuf + (key0 / BN & 1) * BN * LD;
    // The other buffer's last readers finished at the previous iteration's
    // closing barrier.
    if (key0 + BN < kend) {
      start(key0 + BN);
      napkin_cp_async_wait<1>();
    } else {
      napkin_cp_async_wait<0>();
    }
    __syncthreads();
    if constexpr (C::ROPE) {
      napkin_attn_rope_tile<C, X, BN>(Ks, LD, key0, C::S - key0, false);
      __syncthreads();
    }
    float p[BN / 8][4], ds[BN / 8][4];
    NAPKIN_UNROLL
    for (int nt = 0; nt < BN / 8; ++nt)
      NAPKIN_UNROLL
      for (int e = 0; e < 4; ++e) p[nt][e] = ds[nt][e] = 0.f;
    NAPKIN_UNROLL
    for (int nt = 0; nt < BN / 8; nt += 2)
      NAPKIN_UNROLL
      for (int kc = 0; kc < KC; ++kc) {
        unsigned bk[4], bv[4];
        napkin_attn_b_rows(bk, Ks, LD, nt * 8, kc * 16);
        X::mma(p[nt], qf[kc], bk);
        X::mma(p[nt + 1], qf[kc], bk + 2);
        napkin_attn_b_rows(bv, Vs, LD, nt * 8, kc * 16);
        X::mma(ds[nt], df[kc], bv);
        X::mma(ds[nt + 1], df[kc], bv + 2);
      }
    const bool edge = key0 + BN > C::S || (C::CAUSAL && key0 + BN - 1 > row0 + C::S - C::T);
    NAPKIN_UNROLL
    for (int nt = 0; nt < BN / 8; ++nt)
      NAPKIN_UNROLL
      for (int e = 0; e < 4; ++e) {
        const int j = key0 + nt * 8 + 2 * t + (e & 1), i = row0 + r + (e >> 1) * 8;
        float pe = exp2f(p[nt][e] * SL - L[e >> 1]);
        if (edge && (j >= C::S || (C::CAUSAL && j > i + C::S - C::T))) pe = 0.f;
        ds[nt][e] = pe * (ds[nt][e] - Dd[e >> 1]);
      }
    // dQ += dS K.
    NAPKIN_UNROLL
    for (int kk = 0; kk < BN / 16; ++kk) {
      unsigned af[4];
      napkin_attn_a_from_acc<X>(af, ds[2 * kk], ds[2 * kk + 1]);
      NAPKIN_UNROLL
      for (int nd = 0; nd < ND; nd += 2) {
        unsigned bf[4];
        napkin_attn_b_cols(bf, Ks, LD, kk * 16, nd * 8);
        X::mma(dqa[nd], af, bf);
        X::mma(dqa[nd + 1], af, bf + 2);
      }
    }
    __syncthreads();  // this tile's readers are done: its buffer may be refilled
  }
  const float scale = (float)C::SCALE;
  // With rope, dQ of the unrotated q: as dK in napkin_attn_bwd_kv_mma.
  float* dQs = (float*)smem;
  if constexpr (C::ROPE) napkin_attn_unrotate_fragments<C, BM, ND>(dqa, r, t, scale, dQs, row0 + C::S - C::T, C::T - row0);
  NAPKIN_UNROLL
  for (int hr = 0; hr < 2; ++hr) {
    const int i = row0 + r + 8 * hr;
    if (i >= C::T) continue;
    unsigned short* row = dq + b * C::DQ_B + h * C::DQ_H + i * C::DQ_T;
    NAPKIN_UNROLL
    for (int nd = 0; nd < ND; ++nd)
      NAPKIN_UNROLL
      for (int e = 0; e < 2; ++e) {
        const int d = nd * 8 + 2 * t + e;
        if (d < C::D) row[d] = X::store(C::ROPE ? dQs[(r + 8 * hr) * C::D + d] : dqa[nd][2 * hr + e] * scale);
      }
  }
}

// ---- SIMT (f32, f64): 64 threads, one query (or key) row each ----

// Forward: block = (b, h, 64-query tile); key tiles of C::TILE rows in
// shared memory; the thread's q row and accumulator in registers.
template <class C, class X>
NAPKIN_DEVICE void napkin_attn_fwd_simt(const typename X::St* __restrict__ q, const typename X::St* __restrict__ k,
                                        const typename X::St* __restrict__ v, typename X::St* __restrict__ o,
                                        float* __restrict__ lse, typename X::St* smem) {
  typedef typename X::Acc A;
  constexpr int BM = 64, BN = C::TILE, QB = (C::T + BM - 1) / BM;
  const int qb = QB - 1 - (int)(blockIdx.x % QB), bh = (int)(blockIdx.x / QB);
  const int h = bh % C::HQ, b = bh / C::HQ, hk = h / (C::HQ / C::HK), row0 = qb * BM;
  const int i = row0 + (int)threadIdx.x;
  const bool valid = i < C::T;
  A* Ks = smem;          // [BN][D]
  A* Vs = Ks + BN * C::D;  // [BN][D]
  A qr[C::D], acc[C::D];
  for (int d = 0; d < C::D; ++d) {
    qr[d] = valid ? q[b * C::Q_B + h * C::Q_H + i * C::Q_T + d] : A(0);
    acc[d] = A(0);
  }
  if constexpr (C::ROPE) napkin_attn_rope_row<C>(qr, i + C::S - C::T, false);
  A m = -(A)napkin_inf_f32(), l = A(0);
  const int visible = C::CAUSAL ? i + C::S - C::T + 1 : C::S;
  const int kend = C::CAUSAL ? min(C::S, row0 + BM + C::S - C::T) : C::S;
  for (int key0 = 0; key0 < kend; key0 += BN) {
    __syncthreads();
    napkin_attn_tile<X, C::D, C::D, BN, false>(Ks, C::D, k + b * C::K_B + hk * C::K_H + key0 * C::K_T,
                                               C::K_T, C::S - key0);
    napkin_attn_tile<X, C::D, C::D, BN, false>(Vs, C::D, v + b * C::V_B + hk * C::V_H + key0 * C::V_T,
                                               C::V_T, C::S - key0);
    __syncthreads();
    if constexpr (C::ROPE) {
      napkin_attn_rope_tile<C, X, BN>(Ks, C::D, key0, C::S - key0, false);
      __syncthreads();
    }
    const int jn = min(BN, visible - key0);
    if (!valid || jn <= 0) continue;
    A s[BN];
    A mx = m;
    for (int jj = 0; jj < jn; ++jj) {
      A dot = A(0);
      for (int d = 0; d < C::D; ++d) dot += qr[d] * Ks[jj * C::D + d];
      s[jj] = dot * (A)C::SCALE;
      mx = napkin_maxnum(mx, s[jj]);
    }
    const A alpha = napkin_exp(m - mx);  // m = -inf: 0
    m = mx;
    l *= alpha;
    for (int d = 0; d < C::D; ++d) acc[d] *= alpha;
    for (int jj = 0; jj < jn; ++jj) {
      const A p = napkin_exp(s[jj] - m);
      l += p;
      for (int d = 0; d < C::D; ++d) acc[d] += p * Vs[jj * C::D + d];
    }
  }
  if (!valid) return;
  for (int d = 0; d < C::D; ++d) o[b * C::O_B + h * C::O_H + i * C::O_T + d] = acc[d] / l;
  lse[b * C::L_B + h * C::L_H + i * C::L_T] = (float)(m + napkin_log(l));
}

// Backward dK, dV: block = (b, kv head, 64-key tile), a thread per key;
// query tiles of C::TILE rows of every query head of the group, in order.
template <class C, class X>
NAPKIN_DEVICE void napkin_attn_bwd_kv_simt(const typename X::St* __restrict__ q, const typename X::St* __restrict__ k,
                                           const typename X::St* __restrict__ v,
                                           const typename X::St* __restrict__ dout, const float* __restrict__ lse,
                                           const typename X::Acc* __restrict__ delta, typename X::St* __restrict__ dk,
                                           typename X::St* __restrict__ dv, typename X::St* smem) {
  typedef typename X::Acc A;
  constexpr int BN = 64, BM = C::TILE, KB = (C::S + BN - 1) / BN, G = C::HQ / C::HK;
  const int kb = (int)(blockIdx.x % KB), bh = (int)(blockIdx.x / KB), hk = bh % C::HK, b = bh / C::HK, key0 = kb * BN;
  const int j = key0 + (int)threadIdx.x;
  const bool valid = j < C::S;
  A* Qs = smem;             // [BM][D]
  A* dOs = Qs + BM * C::D;  // [BM][D]
  A* Ls = dOs + BM * C::D;  // [BM]
  A* Dl = Ls + BM;          // [BM]
  A kr[C::D], vr[C::D], dka[C::D], dva[C::D];
  for (int d = 0; d < C::D; ++d) {
    kr[d] = valid ? k[b * C::K_B + hk * C::K_H + j * C::K_T + d] : A(0);
    vr[d] = valid ? v[b * C::V_B + hk * C::V_H + j * C::V_T + d] : A(0);
    dka[d] = dva[d] = A(0);
  }
  if constexpr (C::ROPE) napkin_attn_rope_row<C>(kr, j, false);
  const int qfirst = C::CAUSAL ? max(0, key0 - (C::S - C::T)) / BM * BM : 0;
  for (int hh = 0; hh < G; ++hh) {
    const int h = hk * G + hh;
    for (int q0 = qfirst; q0 < C::T; q0 += BM) {
      __syncthreads();
      napkin_attn_tile<X, C::D, C::D, BM, false>(Qs, C::D, q + b * C::Q_B + h * C::Q_H + q0 * C::Q_T,
                                                 C::Q_T, C::T - q0);
      napkin_attn_tile<X, C::D, C::D, BM, false>(dOs, C::D,
                                                 dout + b * C::DO_B + h * C::DO_H + q0 * C::DO_T, C::DO_T, C::T - q0);
      for (int i = (int)threadIdx.x; i < BM; i += (int)blockDim.x) {
        const bool in = q0 + i < C::T;
        Ls[i] = in ? (A)lse[b * C::L_B + h * C::L_H + (q0 + i) * C::L_T] : A(0);
        Dl[i] = in ? delta[((long long)b * C::HQ + h) * C::T + q0 + i] : A(0);
      }
      __syncthreads();
      if constexpr (C::ROPE) {
        napkin_attn_rope_tile<C, X, BM>(Qs, C::D, q0 + C::S - C::T, C::T - q0, false);
        __syncthreads();
      }
      if (!valid) continue;
      const int ilo = C::CAUSAL ? max(0, j - (C::S - C::T) - q0) : 0, ihi = min(BM, C::T - q0);
      for (int ii = ilo; ii < ihi; ++ii) {
        A s = A(0), dp = A(0);
        for (int d = 0; d < C::D; ++d) {
          s += kr[d] * Qs[ii * C::D + d];
          dp += vr[d] * dOs[ii * C::D + d];
        }
        const A p = napkin_exp(s * (A)C::SCALE - Ls[ii]), ds = p * (dp - Dl[ii]);
        for (int d = 0; d < C::D; ++d) {
          dva[d] += p * dOs[ii * C::D + d];
          dka[d] += ds * Qs[ii * C::D + d];
        }
      }
    }
  }
  if (!valid) return;
  if constexpr (C::ROPE) napkin_attn_rope_row<C>(dka, j, true);  // dK of the unrotated k
  for (int d = 0; d < C::D; ++d) {
    dk[b * C::DK_B + hk * C::DK_H + j * C::DK_T + d] = dka[d] * (A)C::SCALE;
    dv[b * C::DV_B + hk * C::DV_H + j * C::DV_T + d] = dva[d];
  }
}

// Backward dQ: block = (b, h, 64-query tile), a thread per query; key tiles
// of C::TILE rows in order.
template <class C, class X>
NAPKIN_DEVICE void napkin_attn_bwd_q_simt(const typename X::St* __restrict__ q, const typename X::St* __restrict__ k,
                                          const typename X::St* __restrict__ v, const typename X::St* __restrict__ dout,
                                          const float* __restrict__ lse, const typename X::Acc* __restrict__ delta,
                                          typename X::St* __restrict__ dq, typename X::St* smem) {
  typedef typename X::Acc A;
  constexpr int BM = 64, BN = C::TILE, QB = (C::T + BM - 1) / BM;
  const int qb = QB - 1 - (int)(blockIdx.x % QB), bh = (int)(blockIdx.x / QB);
  const int h = bh % C::HQ, b = bh / C::HQ, hk = h / (C::HQ / C::HK), row0 = qb * BM;
  const int i = row0 + (int)threadIdx.x;
  const bool valid = i < C::T;
  A* Ks = smem;            // [BN][D]
  A* Vs = Ks + BN * C::D;  // [BN][D]
  A qr[C::D], dr[C::D], dqa[C::D];
  for (int d = 0; d < C::D; ++d) {
    qr[d] = valid ? q[b * C::Q_B + h * C::Q_H + i * C::Q_T + d] : A(0);
    dr[d] = valid ? dout[b * C::DO_B + h * C::DO_H + i * C::DO_T + d] : A(0);
    dqa[d] = A(0);
  }
  if constexpr (C::ROPE) napkin_attn_rope_row<C>(qr, i + C::S - C::T, false);
  const A L = valid ? (A)lse[b * C::L_B + h * C::L_H + i * C::L_T] : A(0);
  const A Dd = valid ? delta[((long long)b * C::HQ + h) * C::T + i] : A(0);
  const int visible = C::CAUSAL ? i + C::S - C::T + 1 : C::S;
  const int kend = C::CAUSAL ? min(C::S, row0 + BM + C::S - C::T) : C::S;
  for (int key0 = 0; key0 < kend; key0 += BN) {
    __syncthreads();
    napkin_attn_tile<X, C::D, C::D, BN, false>(Ks, C::D, k + b * C::K_B + hk * C::K_H + key0 * C::K_T,
                                               C::K_T, C::S - key0);
    napkin_attn_tile<X, C::D, C::D, BN, false>(Vs, C::D, v + b * C::V_B + hk * C::V_H + key0 * C::V_T,
                                               C::V_T, C::S - key0);
    __syncthreads();
    if constexpr (C::ROPE) {
      napkin_attn_rope_tile<C, X, BN>(Ks, C::D, key0, C::S - key0, false);
      __syncthreads();
    }
    const int jn = valid ? min(BN, visible - key0) : 0;
    for (int jj = 0; jj < jn; ++jj) {
      A s = A(0), dp = A(0);
      for (int d = 0; d < C::D; ++d) {
        s += qr[d] * Ks[jj * C::D + d];
        dp += dr[d] * Vs[jj * C::D + d];
      }
      const A ds = napkin_exp(s * (A)C::SCALE - L) * (dp - Dd);
      for (int d = 0; d < C::D; ++d) dqa[d] += ds * Ks[jj * C::D + d];
    }
  }
  if (!valid) return;
  if constexpr (C::ROPE) napkin_attn_rope_row<C>(dqa, i + C::S - C::T, true);  // dQ of the unrotated q
  for (int d = 0; d < C::D; ++d) dq[b * C::DQ_B + h * C::DQ_H + i * C::DQ_T + d] = dqa[d] * (A)C::SCALE;
}
// ---- end of fused attention ----
)ATTN";
  return text;
}

}  // namespace napkin::codegen::cuda::detail
