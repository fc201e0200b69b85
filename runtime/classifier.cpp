// The fused classifier on the CPU (runtime/classifier.h has the algorithm).
#include "runtime/classifier.h"

#include <dnnl.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "runtime/error.h"
#include "runtime/float_formats.h"

namespace napkin::runtime {

namespace {

constexpr int64_t kRowBlock = 64;  // rows per work item: a 64 x kChunk f32 tile is 128 KiB

// C = alpha op(A) op(B) + beta C, row-major: oneDNN's sgemm on this pool
// thread for f32, a plain loop for f64 (f64 trainers are for checking).
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b,
          int64_t ldb, float beta, float* c, int64_t ldc) {
  make_openmp_serial();
  dnnl_status_t st = dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  if (st != dnnl_success) throw Error("classifier: dnnl_sgemm failed (status " + std::to_string(int(st)) + ")");
}
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a, int64_t lda,
          const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t p = 0; p < k; ++p) s += (ta ? a[p * lda + i] : a[i * lda + p]) * (tb ? b[j * ldb + p] : b[p * ldb + j]);
      c[i * ldc + j] = alpha * s + (beta == 0 ? 0.0 : beta * c[i * ldc + j]);
    }
}

// Element i of a tensor of type t, widened exactly to A.
template <class A>
A load(GemmType t, const void* p, int64_t i) {
  switch (t) {
    case GemmType::F32: return static_cast<const float*>(p)[i];
    case GemmType::F64: return static_cast<A>(static_cast<const double*>(p)[i]);
    case GemmType::BF16: return bf16_bits_to_float(static_cast<const uint16_t*>(p)[i]);
    case GemmType::F16: return f16_bits_to_float(static_cast<const uint16_t*>(p)[i]);
  }
  return 0;
}

// v rounded to nearest even in type t, and stored as element i.
template <class A>
void store(GemmType t, void* p, int64_t i, A v) {
  switch (t) {
    case GemmType::F32: static_cast<float*>(p)[i] = static_cast<float>(v); return;
    case GemmType::F64: static_cast<double*>(p)[i] = static_cast<double>(v); return;
    case GemmType::BF16: static_cast<uint16_t*>(p)[i] = float_to_bf16_bits(static_cast<float>(v)); return;
    case GemmType::F16: static_cast<uint16_t*>(p)[i] = float_to_f16_bits(static_cast<float>(v)); return;
  }
}

// v as type t stores it (ir/loop.h: the logits and their gradient are rounded).
template <class A>
A round_as(GemmType t, A v) {
  switch (t) {
    case GemmType::F32:
    case GemmType::F64: return v;
    case GemmType::BF16: return round_to_bf16(static_cast<float>(v));
    case GemmType::F16: return round_to_f16(static_cast<float>(v));
  }
  return v;
}

template <class A>
A* sized(std::vector<A>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
  return v.data();
}

// Reused call to call (a Classifier runs one call at a time): x as dense
// Acc rows, a chunk of w, the chunk's gradient [rows, kChunk], dx's f32
// sums, and the running max and sum per row.
template <class A>
struct Buffers {
  std::vector<A> x, w, g, dx, max, sum, picked;
};

}  // namespace

struct Classifier::Impl {
  Buffers<float> f;
  Buffers<double> d;
  template <class A>
  Buffers<A>& buffers() {
    if constexpr (std::is_same_v<A, float>) return f;
    else return d;
  }
};

Classifier::Classifier(ClassifierDesc desc, GemmType type) : d_(desc), type_(type), impl_(std::make_unique<Impl>()) {
  if (d_.rows < 1 || d_.vocab < 1 || d_.d < 1)
    throw Error("classifier: rows, vocab and d must be positive (" + std::to_string(d_.rows) + ", " +
                std::to_string(d_.vocab) + ", " + std::to_string(d_.d) + ")");
  if (d_.x_row_stride < d_.d && d_.rows > 1) throw Error("classifier: rows of x overlap");
  if (d_.w_d_stride != 1 && d_.w_v_stride != 1) throw Error("classifier: w is contiguous along neither axis");
}
Classifier::~Classifier() = default;
Classifier::Classifier(Classifier&&) noexcept = default;

namespace {

// The work of one call, on accumulator type A (float, or double for f64).
template <class A>
struct Call {
  const ClassifierDesc& d;
  GemmType type;
  ThreadPool& pool;
  Buffers<A>& buf;
  std::vector<int64_t> targets;
  const A* x = nullptr;  // [rows, d], row stride ldx
  int64_t ldx = 0;

  Call(const ClassifierDesc& desc, GemmType t, ThreadPool& p, Buffers<A>& b, const void* x_data,
       const void* target_data)
      : d(desc), type(t), pool(p), buf(b) {
    targets.resize(static_cast<size_t>(d.rows));
    for (int64_t r = 0; r < d.rows; ++r) {
      int64_t id = d.targets_i64 ? static_cast<const int64_t*>(target_data)[r] : static_cast<const int32_t*>(target_data)[r];
      if (id < 0 || id >= d.vocab)
        throw Error("classifier: target class " + std::to_string(id) + " of row " + std::to_string(r) +
                    " is out of range [0, " + std::to_string(d.vocab) + ")");
      targets[r] = id;
    }
    if ((std::is_same_v<A, float> && type == GemmType::F32) || (std::is_same_v<A, double> && type == GemmType::F64)) {
      x = static_cast<const A*>(x_data);
      ldx = d.x_row_stride;
    } else {
      A* dense = sized(buf.x, d.rows * d.d);
      pool.parallel_for(d.rows, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r)
          for (int64_t k = 0; k < d.d; ++k) dense[r * d.d + k] = load<A>(type, x_data, r * d.x_row_stride + k);
      });
      x = dense;
      ldx = d.d;
    }
  }

  // Classes [c0, c0 + n) of w as dense A rows [n, d].
  const A* w_chunk(const void* w, int64_t c0, int64_t n) {
    A* dst = sized(buf.w, n * d.d);
    pool.parallel_for(n, [&](int64_t v0, int64_t v1) {
      for (int64_t v = v0; v < v1; ++v)
        for (int64_t k = 0; k < d.d; ++k) dst[v * d.d + k] = load<A>(type, w, (c0 + v) * d.w_v_stride + k * d.w_d_stride);
    });
    return dst;
  }

  // The logits of rows [r0, r1) x the chunk (n classes at wc), rounded as x's type stores them.
  A* logits(int64_t r0, int64_t r1, const A* wc, int64_t n) const {
    thread_local std::vector<A> tile;
    A* t = sized(tile, (r1 - r0) * n);
    gemm(false, true, r1 - r0, n, d.d, A(1), x + r0 * ldx, ldx, wc, d.d, A(0), t, n);
    if (type == GemmType::BF16 || type == GemmType::F16)
      for (int64_t i = 0; i < (r1 - r0) * n; ++i) t[i] = round_as(type, t[i]);
    return t;
  }

  int64_t row_blocks() const { return (d.rows + kRowBlock - 1) / kRowBlock; }

  void forward(const void* w, void* loss, void* lse) {
    A* mx = sized(buf.max, d.rows);
    A* sum = sized(buf.sum, d.rows);
    A* picked = sized(buf.picked, d.rows);
    std::fill(mx, mx + d.rows, -std::numeric_limits<A>::infinity());
    std::fill(sum, sum + d.rows, A(0));
    for (int64_t c0 = 0; c0 < d.vocab; c0 += Classifier::kChunk) {
      const int64_t n = std::min(Classifier::kChunk, d.vocab - c0);
      const A* wc = w_chunk(w, c0, n);
      pool.parallel_for(row_blocks(), [&](int64_t b0, int64_t b1) {
        for (int64_t b = b0; b < b1; ++b) {
          const int64_t r0 = b * kRowBlock, r1 = std::min(d.rows, r0 + kRowBlock);
          const A* l = logits(r0, r1, wc, n);
          for (int64_t r = r0; r < r1; ++r) {
            const A* row = l + (r - r0) * n;
            A m = mx[r];
            for (int64_t v = 0; v < n; ++v) m = std::max(m, row[v]);
            A s = sum[r] * std::exp(mx[r] - m);  // exp(-inf) = 0 on the first chunk
            for (int64_t v = 0; v < n; ++v) s += std::exp(row[v] - m);
            mx[r] = m;
            sum[r] = s;
            if (targets[r] >= c0 && targets[r] < c0 + n) picked[r] = row[targets[r] - c0];
          }
        }
      });
    }
    double total = 0;  // in row order: the same sum for any thread count
    for (int64_t r = 0; r < d.rows; ++r) {
      const A l = mx[r] + std::log(sum[r]);
      store<A>(type == GemmType::F64 ? GemmType::F64 : GemmType::F32, lse, r, l);
      total += static_cast<double>(l - picked[r]);
    }
    store<A>(type == GemmType::F64 ? GemmType::F64 : GemmType::F32, loss, 0, static_cast<A>(total / static_cast<double>(d.rows)));
  }

  void backward(const void* w, const void* lse_data, const void* dloss, void* dx, void* dw) {
    const GemmType acc_type = type == GemmType::F64 ? GemmType::F64 : GemmType::F32;
    const A scale = load<A>(acc_type, dloss, 0) / static_cast<A>(d.rows);
    A* lse = sized(buf.max, d.rows);
    for (int64_t r = 0; r < d.rows; ++r) lse[r] = load<A>(acc_type, lse_data, r);
    A* dxa = sized(buf.dx, d.rows * d.d);
    std::fill(dxa, dxa + d.rows * d.d, A(0));
    A* g = sized(buf.g, d.rows * Classifier::kChunk);
    const int64_t ldg = Classifier::kChunk;
    for (int64_t c0 = 0; c0 < d.vocab; c0 += Classifier::kChunk) {
      const int64_t n = std::min(Classifier::kChunk, d.vocab - c0);
      const A* wc = w_chunk(w, c0, n);
      // g of the chunk, and its share of dx, row block by row block.
      pool.parallel_for(row_blocks(), [&](int64_t b0, int64_t b1) {
        for (int64_t b = b0; b < b1; ++b) {
          const int64_t r0 = b * kRowBlock, r1 = std::min(d.rows, r0 + kRowBlock);
          const A* l = logits(r0, r1, wc, n);
          for (int64_t r = r0; r < r1; ++r) {
            const A* row = l + (r - r0) * n;
            A* gr = g + r * ldg;
            for (int64_t v = 0; v < n; ++v) {
              const A onehot = targets[r] == c0 + v ? A(1) : A(0);
              gr[v] = round_as(type, (std::exp(row[v] - lse[r]) - onehot) * scale);
            }
          }
          gemm(false, false, r1 - r0, d.d, n, A(1), g + r0 * ldg, ldg, wc, d.d, A(1), dxa + r0 * d.d, d.d);
        }
      });
      // The chunk's rows of dw: gᵀ x over every row, split by class.
      pool.parallel_for(n, [&](int64_t v0, int64_t v1) {
        thread_local std::vector<A> tile;
        A* t = sized(tile, (v1 - v0) * d.d);
        gemm(true, false, v1 - v0, d.d, d.rows, A(1), g + v0, ldg, x, ldx, A(0), t, d.d);
        for (int64_t i = 0; i < (v1 - v0) * d.d; ++i) store<A>(type, dw, (c0 + v0) * d.d + i, t[i]);
      });
    }
    pool.parallel_for(d.rows, [&](int64_t r0, int64_t r1) {
      for (int64_t i = r0 * d.d; i < r1 * d.d; ++i) store<A>(type, dx, i, dxa[i]);
    });
  }
};

}  // namespace

void Classifier::forward(const void* x, const void* w, const void* targets, void* loss, void* lse,
                         ThreadPool& pool) const {
  if (type_ == GemmType::F64) Call<double>(d_, type_, pool, impl_->buffers<double>(), x, targets).forward(w, loss, lse);
  else Call<float>(d_, type_, pool, impl_->buffers<float>(), x, targets).forward(w, loss, lse);
}

void Classifier::backward(const void* x, const void* w, const void* targets, const void* lse, const void* dloss,
                          void* dx, void* dw, ThreadPool& pool) const {
  if (type_ == GemmType::F64)
    Call<double>(d_, type_, pool, impl_->buffers<double>(), x, targets).backward(w, lse, dloss, dx, dw);
  else
    Call<float>(d_, type_, pool, impl_->buffers<float>(), x, targets).backward(w, lse, dloss, dx, dw);
}

}  // namespace napkin::runtime
