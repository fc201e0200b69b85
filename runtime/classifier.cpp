// The fused classifier on the CPU (runtime/classifier.h has the algorithm).
#include "runtime/classifier.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <mutex>
#include <tuple>
#include <string>
#include <type_traits>
#include <vector>

#include "runtime/error.h"
#include "runtime/float_formats.h"
#include "runtime/gemm_element.h"
#include "runtime/vector_math.h"

namespace napkin::runtime {

namespace {

constexpr int64_t kRowBlock = 128;   // rows per work item of the logits and dx products
constexpr int64_t kClassBlock = 64;  // classes per work item of the dw product

// The row math in f32, vectorized (runtime/vector_math.h; each clone
// computes the same bits). A row's logits are first widened into a float
// buffer, then:
//   fold    m = max(running max, row max); the row becomes exp(l - m);
//           sum = sum * exp(old max - m) + its sum (online log-sum-exp)
//   grad    the row becomes (exp(l - lse) - onehot) * scale
NAPKIN_VECTOR_CLONES void widen_bf16(const uint16_t* bits, int64_t n, float* out) {
  for (int64_t v = 0; v < n; ++v) out[v] = bf16_bits_to_float(bits[v]);
}
NAPKIN_VECTOR_CLONES void narrow_bf16(const float* in, int64_t n, uint16_t* bits) {
  for (int64_t v = 0; v < n; ++v) bits[v] = float_to_bf16_bits_inline(in[v]);
}
NAPKIN_VECTOR_CLONES void fold_row(float* l, int64_t n, float* max, float* sum) {
  const float m = std::max(*max, row_max(l, n));
  for (int64_t v = 0; v < n; ++v) l[v] = exp_poly(l[v] - m);
  *sum = *sum * exp_poly(*max - m) + row_sum(l, n);
  *max = m;
}
NAPKIN_VECTOR_CLONES void grad_row(float* l, int64_t n, float lse, int64_t target, float scale) {
  for (int64_t v = 0; v < n; ++v) l[v] = exp_poly(l[v] - lse);
  if (target >= 0) l[target] = l[target] - 1.0f;
  for (int64_t v = 0; v < n; ++v) l[v] = l[v] * scale;
}

template <class A>
A* sized(std::vector<A>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
  return v.data();
}

}  // namespace

// The products, built once per shape (a chunk or block at the end is
// narrower), and the buffers reused call to call (a Classifier runs one call
// at a time).
struct Classifier::Impl {
  enum class Product { Logits, Dx, Dw };
  std::mutex mu;
  std::map<std::tuple<Product, int64_t, int64_t>, std::unique_ptr<Gemm>> gemms;
  std::vector<char> g;             // the chunk's logits, then its gradient: [rows, kChunk] in x's type
  std::vector<float> max_f, sum_f, picked_f, dx_f;
  std::vector<double> max_d, sum_d, picked_d, dx_d;
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
  GemmType type, acc;
  ThreadPool& pool;
  Classifier::Impl& impl;
  std::vector<int64_t> targets;
  const char* x;
  const size_t es;
  char* g = nullptr;  // [rows, kChunk] in x's type

  Call(const ClassifierDesc& desc, GemmType t, ThreadPool& p, Classifier::Impl& i, const void* x_data,
       const void* target_data)
      : d(desc), type(t), acc(t == GemmType::F64 ? GemmType::F64 : GemmType::F32), pool(p), impl(i),
        x(static_cast<const char*>(x_data)), es(gemm_type_bytes(t)) {
    targets.resize(static_cast<size_t>(d.rows));
    for (int64_t r = 0; r < d.rows; ++r) {
      int64_t id = d.targets_i64 ? static_cast<const int64_t*>(target_data)[r] : static_cast<const int32_t*>(target_data)[r];
      if (id < 0 || id >= d.vocab)
        throw Error("classifier: target class " + std::to_string(id) + " of row " + std::to_string(r) +
                    " is out of range [0, " + std::to_string(d.vocab) + ")");
      targets[r] = id;
    }
    g = sized(impl.g, d.rows * Classifier::kChunk * static_cast<int64_t>(es));
  }

  // The product `p` for a block of m rows (Logits, Dx) or classes (Dw) and a
  // chunk of n classes, made once: every run of it is one work item on the
  // calling pool thread, so a result never depends on the thread count.
  const Gemm& gemm(Classifier::Impl::Product p, int64_t m, int64_t n) {
    using P = Classifier::Impl::Product;
    std::lock_guard<std::mutex> lock(impl.mu);
    auto [it, fresh] = impl.gemms.try_emplace({p, m, n});
    if (fresh) {
      MatmulDesc md;
      GemmTypes types{type, type};
      if (p == P::Logits) {  // x block [m, d] · w_cᵀ [d, n] -> g rows [m, n], ld kChunk
        md.m = m, md.n = n, md.k = d.d;
        md.a_m_stride = d.x_row_stride, md.a_k_stride = 1;
        md.b_k_stride = d.w_d_stride, md.b_n_stride = d.w_v_stride;
        md.c_m_stride = Classifier::kChunk;
      } else if (p == P::Dx) {  // g block [m, n] · w_c [n, d] -> dx's sums [m, d]
        md.m = m, md.n = d.d, md.k = n;
        md.a_m_stride = Classifier::kChunk, md.a_k_stride = 1;
        md.b_k_stride = d.w_v_stride, md.b_n_stride = d.w_d_stride;
        md.c_m_stride = d.d;
        types.c = acc;
      } else {  // gᵀ [m classes, rows] · x [rows, d] -> dw rows [m, d]
        md.m = m, md.n = d.d, md.k = d.rows;
        md.a_m_stride = 1, md.a_k_stride = Classifier::kChunk;
        md.b_k_stride = d.x_row_stride, md.b_n_stride = 1;
        md.c_m_stride = d.d;
      }
      it->second = std::make_unique<Gemm>(md, types);
    }
    return *it->second;
  }

  int64_t row_blocks() const { return (d.rows + kRowBlock - 1) / kRowBlock; }

  // A row of n elements of x's type as floats, in this thread's buffer (f32 rows in place).
  float* widened(const char* row, int64_t n) {
    thread_local std::vector<float> buf;
    if (type == GemmType::F32) return const_cast<float*>(reinterpret_cast<const float*>(row));
    float* out = sized(buf, n);
    if (type == GemmType::BF16) widen_bf16(reinterpret_cast<const uint16_t*>(row), n, out);
    else
      for (int64_t v = 0; v < n; ++v) out[v] = load_element<float>(type, row, v);
    return out;
  }
  // n floats stored into a row of x's type, rounded to nearest even.
  void narrowed(const float* l, int64_t n, char* row) {
    if (type == GemmType::F32) return;  // computed in place
    if (type == GemmType::BF16) narrow_bf16(l, n, reinterpret_cast<uint16_t*>(row));
    else
      for (int64_t v = 0; v < n; ++v) store_element<float>(type, row, v, l[v]);
  }

  // The logits of rows [r0, r1) x classes [c0, c0 + n) into g (rounded to x's type).
  void logits(const void* w, int64_t r0, int64_t r1, int64_t c0, int64_t n) {
    gemm(Classifier::Impl::Product::Logits, r1 - r0, n)
        .run(x + r0 * d.x_row_stride * es, static_cast<const char*>(w) + c0 * d.w_v_stride * es,
             g + r0 * Classifier::kChunk * es);
  }

  // The buffer of accumulator type A of a float / double pair.
  static A* rows_of(std::vector<float>& f, std::vector<double>& dd, int64_t n) {
    if constexpr (std::is_same_v<A, float>) return sized(f, n);
    else return sized(dd, n);
  }

  void forward(const void* w, void* loss, void* lse) {
    A* mx = rows_of(impl.max_f, impl.max_d, d.rows);
    A* sum = rows_of(impl.sum_f, impl.sum_d, d.rows);
    A* picked = rows_of(impl.picked_f, impl.picked_d, d.rows);
    std::fill(mx, mx + d.rows, -std::numeric_limits<A>::infinity());
    std::fill(sum, sum + d.rows, A(0));
    for (int64_t c0 = 0; c0 < d.vocab; c0 += Classifier::kChunk) {
      const int64_t n = std::min(Classifier::kChunk, d.vocab - c0);
      pool.parallel_for(row_blocks(), [&](int64_t b0, int64_t b1) {
        for (int64_t b = b0; b < b1; ++b) {
          const int64_t r0 = b * kRowBlock, r1 = std::min(d.rows, r0 + kRowBlock);
          logits(w, r0, r1, c0, n);
          for (int64_t r = r0; r < r1; ++r) {
            const char* row = g + r * Classifier::kChunk * es;
            if (targets[r] >= c0 && targets[r] < c0 + n) picked[r] = load_element<A>(type, row, targets[r] - c0);
            if constexpr (std::is_same_v<A, float>) {
              fold_row(widened(row, n), n, &mx[r], &sum[r]);
            } else {
              A m = mx[r];
              for (int64_t v = 0; v < n; ++v) m = std::max(m, load_element<A>(type, row, v));
              A s = sum[r] * std::exp(mx[r] - m);  // exp(-inf) = 0 on the first chunk
              for (int64_t v = 0; v < n; ++v) s += std::exp(load_element<A>(type, row, v) - m);
              mx[r] = m;
              sum[r] = s;
            }
          }
        }
      });
    }
    double total = 0;  // in row order: the same sum for any thread count
    for (int64_t r = 0; r < d.rows; ++r) {
      const A l = mx[r] + std::log(sum[r]);
      store_element<A>(acc, lse, r, l);
      total += static_cast<double>(l - picked[r]);
    }
    store_element<A>(acc, loss, 0, static_cast<A>(total / static_cast<double>(d.rows)));
  }

  void backward(const void* w, const void* lse_data, const void* dloss, void* dx, void* dw) {
    const A scale = load_element<A>(acc, dloss, 0) / static_cast<A>(d.rows);
    A* lse = rows_of(impl.max_f, impl.max_d, d.rows);
    for (int64_t r = 0; r < d.rows; ++r) lse[r] = load_element<A>(acc, lse_data, r);
    A* dxa = rows_of(impl.dx_f, impl.dx_d, d.rows * d.d);
    std::fill(dxa, dxa + d.rows * d.d, A(0));
    for (int64_t c0 = 0; c0 < d.vocab; c0 += Classifier::kChunk) {
      const int64_t n = std::min(Classifier::kChunk, d.vocab - c0);
      // g of the chunk, and its share of dx, row block by row block.
      pool.parallel_for(row_blocks(), [&](int64_t b0, int64_t b1) {
        thread_local std::vector<A> part;
        for (int64_t b = b0; b < b1; ++b) {
          const int64_t r0 = b * kRowBlock, r1 = std::min(d.rows, r0 + kRowBlock);
          logits(w, r0, r1, c0, n);
          for (int64_t r = r0; r < r1; ++r) {
            char* row = g + r * Classifier::kChunk * es;
            const int64_t target = targets[r] >= c0 && targets[r] < c0 + n ? targets[r] - c0 : -1;
            if constexpr (std::is_same_v<A, float>) {
              float* l = widened(row, n);
              grad_row(l, n, lse[r], target, scale);
              narrowed(l, n, row);
            } else {
              for (int64_t v = 0; v < n; ++v) {
                const A onehot = v == target ? A(1) : A(0);
                store_element<A>(type, row, v, (std::exp(load_element<A>(type, row, v) - lse[r]) - onehot) * scale);
              }
            }
          }
          A* p = sized(part, (r1 - r0) * d.d);
          gemm(Classifier::Impl::Product::Dx, r1 - r0, n)
              .run(g + r0 * Classifier::kChunk * es, static_cast<const char*>(w) + c0 * d.w_v_stride * es, p);
          A* to = dxa + r0 * d.d;
          for (int64_t i = 0; i < (r1 - r0) * d.d; ++i) to[i] += p[i];
        }
      });
      // The chunk's rows of dw: gᵀ x over every row, block of classes by block.
      const int64_t class_blocks = (n + kClassBlock - 1) / kClassBlock;
      pool.parallel_for(class_blocks, [&](int64_t k0, int64_t k1) {
        for (int64_t k = k0; k < k1; ++k) {
          const int64_t v0 = k * kClassBlock, v1 = std::min(n, v0 + kClassBlock);
          gemm(Classifier::Impl::Product::Dw, v1 - v0, 0)
              .run(g + v0 * es, x, static_cast<char*>(dw) + (c0 + v0) * d.d * es);
        }
      });
    }
    pool.parallel_for(d.rows, [&](int64_t r0, int64_t r1) {
      for (int64_t i = r0 * d.d; i < r1 * d.d; ++i) store_element<A>(type, dx, i, dxa[i]);
    });
  }
};

}  // namespace

void Classifier::forward(const void* x, const void* w, const void* targets, void* loss, void* lse,
                         ThreadPool& pool) const {
  if (type_ == GemmType::F64) Call<double>(d_, type_, pool, *impl_, x, targets).forward(w, loss, lse);
  else Call<float>(d_, type_, pool, *impl_, x, targets).forward(w, loss, lse);
}

void Classifier::backward(const void* x, const void* w, const void* targets, const void* lse, const void* dloss,
                          void* dx, void* dw, ThreadPool& pool) const {
  if (type_ == GemmType::F64)
    Call<double>(d_, type_, pool, *impl_, x, targets).backward(w, lse, dloss, dx, dw);
  else
    Call<float>(d_, type_, pool, *impl_, x, targets).backward(w, lse, dloss, dx, dw);
}

}  // namespace napkin::runtime
