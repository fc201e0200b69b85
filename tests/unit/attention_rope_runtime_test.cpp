// Rotary embeddings fused into the CPU attention kernels (AttentionDesc::rope,
// CachedAttentionDesc::rope): each kernel with rope equals the same kernel
// without it run on q and k rotated beforehand by runtime/rope.h (in
// float64, then rounded to the type), with the backward's dq and dk rotated
// back by the negated angles; both pairings, Llama 3.1's scaled frequencies,
// grouped heads, causal with q_len < kv_len (queries at positions i + S - T),
// f32, bf16 and f64. The names start "attention runtime" so that ctest runs
// them with AMX off too.
#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "runtime/attention.h"
#include "runtime/cached_attention.h"
#include "runtime/rope.h"
#include "runtime/thread_pool.h"
#include "support/typed_buffer.h"

using napkin::runtime::Attention;
using napkin::runtime::AttentionDesc;
using napkin::runtime::CachedAttention;
using napkin::runtime::CachedAttentionDesc;
using napkin::runtime::GemmType;
using napkin::runtime::RopeDesc;
using napkin::runtime::RopeStyle;
using napkin::runtime::RopeTable;
using napkin::runtime::ThreadPool;
using Buffer = napkin::testing::TypedBuffer;

namespace {

struct Shape {
  int64_t batch, heads, kv_heads, q_len, kv_len, head_dim;
  bool causal;
};

// Contiguous [batch, heads, rows, head_dim] strides.
AttentionDesc::Strides dense(int64_t heads, int64_t rows, int64_t dim) { return {heads * rows * dim, rows * dim, dim}; }

Buffer random_buffer(GemmType t, size_t n, std::mt19937& rng) {
  std::normal_distribution<double> normal(0.0, 1.0);
  Buffer b(t, n);
  for (size_t i = 0; i < n; ++i) b.set(i, 1.5 * normal(rng));
  return b;
}

// x ([batch * heads, rows, dim] contiguous) with row r of every head rotated
// at position first_pos + r in float64 by the table, rounded to the type.
Buffer rotated(const Buffer& x, int64_t rows, int64_t dim, const RopeDesc& r, const RopeTable& t, int64_t first_pos,
               bool inverse) {
  Buffer y = x;
  std::vector<double> row(static_cast<size_t>(dim));
  for (size_t base = 0; base < x.size(); base += size_t(dim)) {
    const int64_t p = first_pos + int64_t(base / size_t(dim)) % rows;
    for (int64_t c = 0; c < dim; ++c) row[size_t(c)] = x.get(base + size_t(c));
    napkin::runtime::rope_rotate_row(r.style, dim, t.cos_row(p), t.sin_row(p), inverse, row.data());
    for (int64_t c = 0; c < dim; ++c) y.set(base + size_t(c), row[size_t(c)]);
  }
  return y;
}

// Largest |a - b| relative to b's largest |value| (at least 0.01).
double rel_error(const Buffer& a, const Buffer& b) {
  double worst = 0, big = 0.01;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a.get(i))) return std::nan("");
    worst = std::max(worst, std::abs(a.get(i) - b.get(i)));
    big = std::max(big, std::abs(b.get(i)));
  }
  return worst / big;
}

const char* style_name(RopeStyle s) { return s == RopeStyle::Half ? "half" : "interleaved"; }

// The ropes checked: both pairings, plain and with Llama 3.1's scaling (an
// original context short enough that the shapes' positions reach every band).
std::vector<RopeDesc> ropes(int64_t dim) {
  std::vector<RopeDesc> out;
  for (RopeStyle style : {RopeStyle::Half, RopeStyle::Interleaved}) {
    out.push_back({style, dim, 10000, 0, 1, 4, 8192});
    out.push_back({style, dim, 500000, 8, 1, 4, 32});
  }
  return out;
}

// Attention (forward and backward) with rope against attention without it
// on q and k rotated beforehand; dq and dk of the latter rotated back.
void check_attention(GemmType type, double tol) {
  const Shape shapes[] = {{2, 4, 2, 37, 53, 24, true}, {1, 2, 2, 70, 70, 16, false}, {1, 6, 3, 29, 150, 64, true},
                          {1, 2, 1, 1, 40, 8, true}};
  ThreadPool pool(2);
  std::mt19937 rng(7);
  for (const Shape& s : shapes)
    for (const RopeDesc& rope : ropes(s.head_dim)) {
      const int64_t B = s.batch, H = s.heads, Hk = s.kv_heads, T = s.q_len, S = s.kv_len, D = s.head_dim;
      INFO(napkin::runtime::gemm_type_name(type), " B=", B, " Hq=", H, " Hk=", Hk, " T=", T, " S=", S, " D=", D,
           s.causal ? " causal " : " ", style_name(rope.style), " factor ", rope.factor);
      AttentionDesc d;
      d.batch = B, d.heads = H, d.kv_heads = Hk, d.q_len = T, d.kv_len = S, d.head_dim = D, d.causal = s.causal;
      d.scale = 1.0 / std::sqrt(double(D));
      d.q = d.o = d.d_o = d.dq = dense(H, T, D);
      d.k = d.v = d.dk = d.dv = dense(Hk, S, D);
      const size_t nq = size_t(B * H * T * D), nk = size_t(B * Hk * S * D), nl = size_t(B * H * T);
      const Buffer q = random_buffer(type, nq, rng), k = random_buffer(type, nk, rng), v = random_buffer(type, nk, rng);
      const Buffer d_o = random_buffer(type, nq, rng);
      const RopeTable table = napkin::runtime::make_rope_table(rope, S);

      // Each run: forward, then backward from its own o and lse.
      struct Out {
        Buffer o, dq, dk, dv;
        std::vector<float> lse;
      };
      auto run = [&](const AttentionDesc& desc, const Buffer& qx, const Buffer& kx) {
        Out r{Buffer(type, nq), Buffer(type, nq), Buffer(type, nk), Buffer(type, nk), std::vector<float>(nl)};
        Attention att(desc, type);
        att.forward(qx.bytes.data(), kx.bytes.data(), v.bytes.data(), r.o.data(), r.lse.data(), pool);
        att.backward(qx.bytes.data(), kx.bytes.data(), v.bytes.data(), r.o.data(), r.lse.data(), d_o.bytes.data(),
                     r.dq.data(), r.dk.data(), r.dv.data(), pool);
        return r;
      };
      const Out plain = run(d, q, k);  // no rotation at all: the fused rope must change the result
      const Out want = run(d, rotated(q, T, D, rope, table, S - T, false), rotated(k, S, D, rope, table, 0, false));
      AttentionDesc dr = d;
      dr.rope = rope;
      const Out got = run(dr, q, k);
      const Buffer want_dq = rotated(want.dq, T, D, rope, table, S - T, true);
      const Buffer want_dk = rotated(want.dk, S, D, rope, table, 0, true);
      CHECK(rel_error(got.o, want.o) <= tol);
      CHECK(rel_error(got.dq, want_dq) <= tol);
      CHECK(rel_error(got.dk, want_dk) <= tol);
      CHECK(rel_error(got.dv, want.dv) <= tol);
      double lse_err = 0;
      for (size_t i = 0; i < nl; ++i) lse_err = std::max(lse_err, double(std::abs(got.lse[i] - want.lse[i])));
      CHECK(lse_err <= tol * 10);
      if (S > 1) CHECK(rel_error(plain.o, want.o) > 10 * tol);
    }
}

// Cached attention with rope: a prefill of P rows at positions 0 .. P - 1,
// then a decode step of one row at position P, against the same without
// rope on q and k rotated beforehand: the outputs and the caches (which
// hold the rotated keys) agree.
void check_cached(GemmType type, double tol) {
  ThreadPool pool(2);
  std::mt19937 rng(11);
  const int64_t B = 2, H = 4, Hk = 2, C = 24, D = 16, P = 9;
  for (const RopeDesc& rope : ropes(D)) {
    INFO(napkin::runtime::gemm_type_name(type), " ", style_name(rope.style), " factor ", rope.factor);
    const RopeTable table = napkin::runtime::make_rope_table(rope, C);
    auto desc = [&](int64_t rows, bool with_rope) {
      CachedAttentionDesc d;
      d.batch = B, d.heads = H, d.kv_heads = Hk, d.rows = rows, d.context = C, d.head_dim = D;
      d.scale = 1.0 / std::sqrt(double(D));
      d.q = d.o = dense(H, rows, D);
      d.k = d.v = dense(Hk, rows, D);
      d.k_cache = d.v_cache = dense(Hk, C, D);
      if (with_rope) d.rope = rope;
      return d;
    };
    Buffer kc_got(type, size_t(B * Hk * C * D)), vc_got = kc_got, kc_want = kc_got, vc_want = kc_got;
    for (int64_t rows : {P, int64_t{1}}) {
      const int64_t first = rows == P ? 0 : P;
      std::vector<int32_t> positions(static_cast<size_t>(rows));
      for (int64_t i = 0; i < rows; ++i) positions[size_t(i)] = int32_t(first + i);
      const size_t nq = size_t(B * H * rows * D), nk = size_t(B * Hk * rows * D);
      const Buffer q = random_buffer(type, nq, rng), k = random_buffer(type, nk, rng), v = random_buffer(type, nk, rng);
      Buffer o_got(type, nq), o_want(type, nq);
      CachedAttention(desc(rows, true), type)
          .run(q.bytes.data(), k.bytes.data(), v.bytes.data(), kc_got.data(), vc_got.data(), positions.data(),
               o_got.data(), pool);
      const Buffer qr = rotated(q, rows, D, rope, table, first, false), kr = rotated(k, rows, D, rope, table, first, false);
      CachedAttention(desc(rows, false), type)
          .run(qr.bytes.data(), kr.bytes.data(), v.bytes.data(), kc_want.data(), vc_want.data(), positions.data(),
               o_want.data(), pool);
      INFO((rows == P ? "prefill" : "decode"));
      CHECK(rel_error(o_got, o_want) <= tol);
      CHECK(rel_error(kc_got, kc_want) <= tol);
      CHECK(rel_error(vc_got, vc_want) == 0);
    }
  }
}

}  // namespace

TEST_CASE("attention runtime: rope fused into f32 attention equals attention on q, k rotated beforehand") {
  check_attention(GemmType::F32, 2e-5);
}
TEST_CASE("attention runtime: rope fused into bf16 attention equals attention on q, k rotated beforehand") {
  check_attention(GemmType::BF16, 3e-2);
}
TEST_CASE("attention runtime: rope fused into f64 attention equals attention on q, k rotated beforehand") {
  check_attention(GemmType::F64, 1e-12);
}
TEST_CASE("attention runtime: cached attention with rope rotates q and the cached k at the rows' positions") {
  check_cached(GemmType::F32, 2e-5);
  check_cached(GemmType::BF16, 3e-2);
  check_cached(GemmType::F64, 1e-12);
}
