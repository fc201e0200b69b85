// runtime::Attention (the CPU fused attention) against attention written out
// in float64 here, score by score: every output (o, lse, dq, dk, dv) for
// f32, bf16, f16 and f64, on shapes that do not fill the kernel's tiles,
// grouped heads, causal and not, q/k/v as strided views of one fused qkv
// buffer; bit-identical results for any thread count; the descriptor's
// errors; and that the comparison catches a wrong kernel.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "runtime/attention.h"
#include "runtime/error.h"
#include "runtime/float_formats.h"
#include "support/typed_buffer.h"
#include "runtime/thread_pool.h"

using napkin::runtime::Attention;
using napkin::runtime::AttentionDesc;
using napkin::runtime::GemmType;
using napkin::runtime::ThreadPool;

namespace {

struct Shape {
  int64_t batch, heads, kv_heads, q_len, kv_len, head_dim;
  bool causal;
};

std::string describe(const Shape& s, GemmType t, bool fused) {
  return std::string(napkin::runtime::gemm_type_name(t)) + " B=" + std::to_string(s.batch) +
         " Hq=" + std::to_string(s.heads) + " Hk=" + std::to_string(s.kv_heads) + " T=" + std::to_string(s.q_len) +
         " S=" + std::to_string(s.kv_len) + " D=" + std::to_string(s.head_dim) + (s.causal ? " causal" : "") +
         (fused ? " fused-qkv" : "");
}

using Buffer = napkin::testing::TypedBuffer;

// Dense float64 tensors [batch, heads, rows, head_dim].
struct Dense {
  int64_t batch, heads, rows, dim;
  std::vector<double> v;
  Dense(int64_t b, int64_t h, int64_t r, int64_t d) : batch(b), heads(h), rows(r), dim(d), v(size_t(b * h * r * d)) {}
  double& at(int64_t b, int64_t h, int64_t r, int64_t c) { return v[size_t(((b * heads + h) * rows + r) * dim + c)]; }
  double at(int64_t b, int64_t h, int64_t r, int64_t c) const {
    return v[size_t(((b * heads + h) * rows + r) * dim + c)];
  }
};

// Where an operand lives in its buffer: offset and (batch, head, row) strides.
struct View {
  int64_t offset;
  AttentionDesc::Strides st;
  size_t index(int64_t b, int64_t h, int64_t r, int64_t c) const {
    return size_t(offset + b * st.batch + h * st.head + r * st.row + c);
  }
};

View contiguous(int64_t heads, int64_t rows, int64_t dim) { return {0, {heads * rows * dim, rows * dim, dim}}; }

struct Reference {
  Dense o, dq, dk, dv;
  std::vector<double> lse;  // [batch, heads, q_len]
};

// Attention by its definition, in float64. o_given: the o the backward's
// D_i = do_i . o_i reads (the kernel reads the o it is handed, not its own).
Reference reference(const Shape& s, double scale, const Dense& q, const Dense& k, const Dense& v, const Dense& d_o,
                    const Dense& o_given, const std::vector<float>* lse_given = nullptr) {
  Reference ref{Dense(s.batch, s.heads, s.q_len, s.head_dim), Dense(s.batch, s.heads, s.q_len, s.head_dim),
                Dense(s.batch, s.kv_heads, s.kv_len, s.head_dim), Dense(s.batch, s.kv_heads, s.kv_len, s.head_dim),
                std::vector<double>(size_t(s.batch * s.heads * s.q_len))};
  const int64_t group = s.heads / s.kv_heads, offset = s.kv_len - s.q_len;
  std::vector<double> p(size_t(s.kv_len));
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads; ++h) {
      const int64_t g = h / group;
      for (int64_t i = 0; i < s.q_len; ++i) {
        const int64_t visible = s.causal ? i + offset + 1 : s.kv_len;
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < visible; ++j) {
          double dot = 0;
          for (int64_t c = 0; c < s.head_dim; ++c) dot += q.at(b, h, i, c) * k.at(b, g, j, c);
          p[size_t(j)] = scale * dot;
          mx = std::max(mx, p[size_t(j)]);
        }
        double sum = 0;
        for (int64_t j = 0; j < visible; ++j) sum += std::exp(p[size_t(j)] - mx);
        const double lse = mx + std::log(sum);
        ref.lse[size_t((b * s.heads + h) * s.q_len + i)] = lse;
        for (int64_t j = 0; j < visible; ++j) p[size_t(j)] = std::exp(p[size_t(j)] - lse);
        for (int64_t c = 0; c < s.head_dim; ++c) {
          double acc = 0;
          for (int64_t j = 0; j < visible; ++j) acc += p[size_t(j)] * v.at(b, g, j, c);
          ref.o.at(b, h, i, c) = acc;
        }
        // Backward of row i, from the lse it is handed (f32) when given: the
        // kernel's p is exp(s - lse) by definition.
        if (lse_given) {
          const double l = (*lse_given)[size_t((b * s.heads + h) * s.q_len + i)];
          for (int64_t j = 0; j < visible; ++j) p[size_t(j)] *= std::exp(lse - l);
        }
        double di = 0;
        for (int64_t c = 0; c < s.head_dim; ++c) di += d_o.at(b, h, i, c) * o_given.at(b, h, i, c);
        for (int64_t j = 0; j < visible; ++j) {
          double dp = 0;
          for (int64_t c = 0; c < s.head_dim; ++c) dp += d_o.at(b, h, i, c) * v.at(b, g, j, c);
          const double ds = p[size_t(j)] * (dp - di);
          for (int64_t c = 0; c < s.head_dim; ++c) {
            ref.dq.at(b, h, i, c) += scale * ds * k.at(b, g, j, c);
            ref.dk.at(b, g, j, c) += scale * ds * q.at(b, h, i, c);
            ref.dv.at(b, g, j, c) += p[size_t(j)] * d_o.at(b, h, i, c);
          }
        }
      }
    }
  return ref;
}

// Everything one run of the kernel needs and gives: typed buffers laid out
// as the case asks, the float64 values they hold, the kernel's outputs.
struct Run {
  Shape s;
  GemmType type;
  bool fused;  // q, k, v (and dq, dk, dv) as views of one [B, T, (Hq + 2 Hk) D] buffer; o, do as [B, T, Hq D]
  double scale;
  AttentionDesc desc;
  View qv, kv, vv, ov, dov, dqv, dkv, dvv;
  Buffer qkv, o_in, d_o, o, dqkv;     // inputs q/k/v (one buffer), o for the backward, do; outputs o, dq/dk/dv
  std::vector<float> lse_in, lse;     // lse for the backward, lse out
  Dense q, k, v, dO, o_given;         // the values the buffers hold, as float64
  Reference ref;

  Run(const Shape& shape, GemmType t, bool fuse, uint32_t seed)
      : s(shape), type(t), fused(fuse), scale(1.0 / std::sqrt(double(shape.head_dim))),
        qkv(t, 0), o_in(t, 0), d_o(t, 0), o(t, 0), dqkv(t, 0),
        q(s.batch, s.heads, s.q_len, s.head_dim), k(s.batch, s.kv_heads, s.kv_len, s.head_dim),
        v(s.batch, s.kv_heads, s.kv_len, s.head_dim), dO(s.batch, s.heads, s.q_len, s.head_dim),
        o_given(s.batch, s.heads, s.q_len, s.head_dim), ref{q, q, k, k, {}} {
    const int64_t B = s.batch, H = s.heads, Hk = s.kv_heads, T = s.q_len, S = s.kv_len, D = s.head_dim;
    size_t qkv_size, o_size = size_t(B * H * T * D);
    if (fused) {
      REQUIRE(T == S);
      const int64_t width = (H + 2 * Hk) * D;
      qv = {0, {T * width, D, width}};
      kv = {H * D, {T * width, D, width}};
      vv = {(H + Hk) * D, {T * width, D, width}};
      ov = dov = {0, {T * H * D, D, H * D}};
      qkv_size = size_t(B * T * width);
    } else {
      qv = contiguous(H, T, D);
      kv = contiguous(Hk, S, D);
      vv = kv;
      vv.offset = B * Hk * S * D;
      ov = dov = contiguous(H, T, D);
      qkv_size = size_t(B * (H * T + 2 * Hk * S) * D);
      // q after k and v, so a kernel that mixes the operands up reads other values.
      kv.offset = 0;
      vv.offset = B * Hk * S * D;
      qv.offset = 2 * B * Hk * S * D;
    }
    dqv = qv, dkv = kv, dvv = vv;
    qkv = Buffer(t, qkv_size), dqkv = Buffer(t, qkv_size);
    o_in = Buffer(t, o_size), d_o = Buffer(t, o_size), o = Buffer(t, o_size);

    std::mt19937 rng(seed);
    std::normal_distribution<double> normal(0.0, 1.0);
    // Poison every element first: gaps and the other operands' slots must not
    // be read, and every output element must be written.
    for (size_t i = 0; i < qkv.size(); ++i) qkv.set(i, std::nan("")), dqkv.set(i, std::nan(""));
    for (size_t i = 0; i < o.size(); ++i) o.set(i, std::nan(""));
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < T; ++i)
          for (int64_t c = 0; c < D; ++c) {
            q.at(b, h, i, c) = qkv.set(qv.index(b, h, i, c), 1.5 * normal(rng));
            dO.at(b, h, i, c) = d_o.set(dov.index(b, h, i, c), normal(rng));
          }
      for (int64_t h = 0; h < Hk; ++h)
        for (int64_t j = 0; j < S; ++j)
          for (int64_t c = 0; c < D; ++c) {
            k.at(b, h, j, c) = qkv.set(kv.index(b, h, j, c), 1.5 * normal(rng));
            v.at(b, h, j, c) = qkv.set(vv.index(b, h, j, c), normal(rng));
          }
    }
    // The backward is handed the true o rounded to the type and lse in f32,
    // so its check does not depend on the forward's.
    Reference exact = reference(s, scale, q, k, v, dO, dO);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < T; ++i)
          for (int64_t c = 0; c < D; ++c) o_given.at(b, h, i, c) = o_in.set(ov.index(b, h, i, c), exact.o.at(b, h, i, c));
    lse_in.assign(exact.lse.begin(), exact.lse.end());
    ref = reference(s, scale, q, k, v, dO, o_given, &lse_in);
    lse.assign(lse_in.size(), std::nanf(""));

    desc.batch = B, desc.heads = H, desc.kv_heads = Hk, desc.q_len = T, desc.kv_len = S, desc.head_dim = D;
    desc.causal = s.causal;
    desc.scale = scale;
    desc.q = qv.st, desc.k = kv.st, desc.v = vv.st, desc.o = ov.st, desc.d_o = dov.st;
    desc.dq = dqv.st, desc.dk = dkv.st, desc.dv = dvv.st;
  }

  unsigned char* qkv_at(const View& w) { return qkv.bytes.data() + size_t(w.offset) * napkin::runtime::gemm_type_bytes(type); }
  unsigned char* dqkv_at(const View& w) { return dqkv.bytes.data() + size_t(w.offset) * napkin::runtime::gemm_type_bytes(type); }

  void run(ThreadPool& pool) {
    Attention att(desc, type);
    att.forward(qkv_at(qv), qkv_at(kv), qkv_at(vv), o.data(), lse.data(), pool);
    att.backward(qkv_at(qv), qkv_at(kv), qkv_at(vv), o_in.data(), lse_in.data(), d_o.data(), dqkv_at(dqv),
                 dqkv_at(dkv), dqkv_at(dvv), pool);
  }

  // Largest |kernel - reference| over a tensor, relative to the tensor's
  // largest |reference| but at least 0.01 (T = S = 1 has dq = dk = 0 exactly,
  // while f32 rounding leaves ~1e-8; the inputs are O(1)), NaN when an
  // element was never written.
  static double error(const Buffer& got, const View& w, const Dense& want) {
    double worst = 0, big = 0;
    for (int64_t b = 0; b < want.batch; ++b)
      for (int64_t h = 0; h < want.heads; ++h)
        for (int64_t r = 0; r < want.rows; ++r)
          for (int64_t c = 0; c < want.dim; ++c) {
            const double x = got.get(w.index(b, h, r, c)), y = want.at(b, h, r, c);
            if (std::isnan(x)) return std::nan("");
            worst = std::max(worst, std::abs(x - y));
            big = std::max(big, std::abs(y));
          }
    return worst / std::max(big, 0.01);
  }
  // lse is f32 whatever the type: at best 2^-24 relative.
  double lse_error() const {
    double worst = 0;
    for (size_t i = 0; i < lse.size(); ++i) {
      if (std::isnan(lse[i])) return std::nan("");
      worst = std::max(worst, std::abs(double(lse[i]) - ref.lse[i]) / std::max(1.0, std::abs(ref.lse[i])));
    }
    return worst;
  }

  // Checks every output within tol (relative to the output's scale).
  void check(double tol) const {
    const double errs[] = {error(o, ov, ref.o), std::max(lse_error() - 1.2e-7, 0.0), error(dqkv, dqv, ref.dq), error(dqkv, dkv, ref.dk),
                           error(dqkv, dvv, ref.dv)};
    const std::string names[] = {"o", "lse", "dq", "dk", "dv"};
    for (int i = 0; i < 5; ++i) {
      INFO(describe(s, type, fused), ": ", names[i], " error ", errs[i], " (tolerance ", tol, ")");
      CHECK(errs[i] <= tol);  // false for NaN too
    }
  }
};

const Shape kShapes[] = {
    // T and S off the 64 tiles, head_dim 24/40/64/80, 3 heads, grouped heads.
    {2, 3, 3, 37, 37, 24, true},   {2, 3, 3, 37, 37, 24, false}, {1, 2, 2, 20, 53, 40, true},
    {1, 2, 2, 20, 53, 40, false},  {1, 6, 2, 37, 37, 64, true},  {1, 6, 3, 29, 70, 80, true},
    {1, 6, 3, 29, 70, 80, false},  {2, 2, 1, 130, 200, 24, true}, {1, 2, 2, 150, 150, 80, false},
    {1, 1, 1, 1, 1, 8, true},      {1, 1, 1, 1, 70, 40, true},   {1, 2, 1, 1, 70, 40, false},
    {1, 1, 1, 64, 128, 64, true},  {1, 1, 1, 65, 65, 3, true},
};

// Runs every shape, contiguous and (where T == S) as fused qkv views.
void check_all(GemmType type, double tol) {
  ThreadPool pool(2);
  uint32_t seed = 1;
  for (const Shape& s : kShapes)
    for (bool fused : {false, true}) {
      if (fused && s.q_len != s.kv_len) continue;
      Run r(s, type, fused, seed++);
      r.run(pool);
      r.check(tol);
    }
}

}  // namespace

TEST_CASE("attention runtime: f32 forward and backward match float64 attention on odd, grouped, strided shapes") {
  check_all(GemmType::F32, 2e-5);
}

TEST_CASE("attention runtime: bf16 matches float64 attention on bf16 inputs within a few bf16 ulps") {
  check_all(GemmType::BF16, 1.0 / 128);
}

TEST_CASE("attention runtime: f16 matches float64 attention on f16 inputs") { check_all(GemmType::F16, 1.0 / 512); }

TEST_CASE("attention runtime: f64 matches float64 attention to 1e-12") { check_all(GemmType::F64, 1e-12); }

TEST_CASE("attention runtime: an earlier call's NaNs left in a thread's scratch do not reach a later call") {
  // Per-thread scratch outlives a call. A call whose dO is NaN leaves NaN
  // scores in it; a later, smaller call on the same thread (T = 48: its
  // tiles' padding rows are ones the NaN call wrote) must not read them.
  ThreadPool pool(1);
  for (GemmType t : {GemmType::F32, GemmType::BF16}) {
    Run poisoned(Shape{1, 1, 1, 64, 64, 64, true}, t, false, 11);
    for (size_t i = 0; i < poisoned.d_o.size(); ++i) poisoned.d_o.set(i, std::nan(""));
    poisoned.run(pool);
    Run clean(Shape{1, 1, 1, 48, 48, 64, true}, t, false, 12);
    clean.run(pool);
    clean.check(t == GemmType::F32 ? 2e-5 : 1.0 / 128);
  }
}

TEST_CASE("attention runtime: results are bit-identical for 1, 2 and 3 threads and run to run") {
  for (GemmType t : {GemmType::F32, GemmType::BF16})
    for (const Shape& s : {Shape{2, 6, 2, 130, 130, 40, true}, Shape{3, 3, 3, 70, 100, 64, false}}) {
      std::vector<unsigned char> o1, d1;
      std::vector<float> l1;
      for (int threads : {1, 2, 3, 3}) {
        ThreadPool pool(threads);
        Run r(s, t, s.q_len == s.kv_len, 7);
        r.run(pool);
        r.check(t == GemmType::F32 ? 2e-5 : 1.0 / 128);
        if (o1.empty()) {
          o1 = r.o.bytes, d1 = r.dqkv.bytes, l1 = r.lse;
          continue;
        }
        INFO(describe(s, t, r.fused), " threads ", threads);
        CHECK(std::memcmp(o1.data(), r.o.bytes.data(), o1.size()) == 0);
        CHECK(std::memcmp(d1.data(), r.dqkv.bytes.data(), d1.size()) == 0);
        CHECK(std::memcmp(l1.data(), r.lse.data(), l1.size() * sizeof(float)) == 0);
      }
    }
}

TEST_CASE("attention runtime: the comparison catches a wrong mask, a wrong scale and one wrong element") {
  ThreadPool pool(2);
  const Shape s{1, 2, 1, 37, 53, 24, true};
  Run good(s, GemmType::F32, false, 3);
  good.run(pool);
  good.check(2e-5);
  // The kernel run non-causal against the causal reference.
  Run unmasked(s, GemmType::F32, false, 3);
  unmasked.desc.causal = false;
  unmasked.run(pool);
  CHECK(Run::error(unmasked.o, unmasked.ov, unmasked.ref.o) > 1e-2);
  CHECK(Run::error(unmasked.dqkv, unmasked.dkv, unmasked.ref.dk) > 1e-2);
  // A slightly wrong scale.
  Run scaled(s, GemmType::F32, false, 3);
  scaled.desc.scale *= 1.001;
  scaled.run(pool);
  CHECK(scaled.lse_error() > 2e-5);
  CHECK(Run::error(scaled.dqkv, scaled.dqv, scaled.ref.dq) > 2e-5);
  // One element of dv off by 1e-4 of dv's scale.
  const size_t last = good.dvv.index(0, 0, s.kv_len - 1, s.head_dim - 1);
  double dv_scale = 0;
  for (double x : good.ref.dv.v) dv_scale = std::max(dv_scale, std::abs(x));
  good.dqkv.set(last, good.dqkv.get(last) + 1e-4 * dv_scale);
  CHECK(Run::error(good.dqkv, good.dvv, good.ref.dv) > 2e-5);
  // An element never written (left NaN) fails.
  good.o.set(good.ov.index(0, 1, 36, 0), std::nan(""));
  CHECK_FALSE(Run::error(good.o, good.ov, good.ref.o) <= 2e-5);
}

TEST_CASE("attention runtime: bad descriptors are refused with a message naming the problem") {
  auto message = [](AttentionDesc d) {
    try {
      Attention a(d, GemmType::F32);
    } catch (const napkin::runtime::Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  AttentionDesc ok;
  ok.batch = 2, ok.heads = 4, ok.kv_heads = 2, ok.q_len = 8, ok.kv_len = 8, ok.head_dim = 16;
  CHECK(message(ok) == "(no error)");
  AttentionDesc d = ok;
  d.head_dim = 0;
  CHECK(message(d).find("head_dim must be positive") != std::string::npos);
  d = ok, d.batch = -1;
  CHECK(message(d).find("batch must be positive") != std::string::npos);
  d = ok, d.kv_heads = 3;
  CHECK(message(d).find("multiple of kv_heads") != std::string::npos);
  d = ok, d.q_len = 9;
  CHECK(message(d).find("causal attention needs q_len <= kv_len") != std::string::npos);
  d.causal = false;
  CHECK(message(d) == "(no error)");
  d = ok, d.k.row = -16;
  CHECK(message(d).find("k strides must be non-negative") != std::string::npos);
  d = ok, d.dv.batch = -1;
  CHECK(message(d).find("dv strides") != std::string::npos);
}
