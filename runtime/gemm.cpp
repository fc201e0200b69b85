#include "runtime/gemm.h"

#include <algorithm>
#include <cstring>
#include <sstream>

#include "runtime/error.h"

#include <dlfcn.h>
#include <oneapi/dnnl/dnnl.h>

namespace napkin::runtime {

namespace {

// Below this many FLOPs a matmul runs on the calling thread: a hot pool
// dispatch costs ~0.2-1 µs and one core does 32^3..48^3 (66-221 kFLOP) in
// 0.6-2 µs (bench/gemm_peak.cpp --pool, "small").
constexpr double kMinParallelFlops = 2.5e5;

// oneDNN (Debian's build) runs its own parallel regions on OpenMP. napkin's
// pool threads each call dnnl_sgemm single-threaded: OpenMP's nthreads ICV is
// per thread, so every thread that calls sgemm sets it to 1 once. libgomp is
// already loaded (libdnnl depends on it); looking the calls up at run time
// spares the trainer a -lgomp.
void make_openmp_serial() {
  thread_local bool done = false;
  if (done) return;
  done = true;
  using SetFn = void (*)(int);
  using GetFn = int (*)();
  static auto set = reinterpret_cast<SetFn>(dlsym(RTLD_DEFAULT, "omp_set_num_threads"));
  static auto get = reinterpret_cast<GetFn>(dlsym(RTLD_DEFAULT, "omp_get_max_threads"));
  if (set && (!get || get() != 1)) set(1);
}

void blas_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
               int64_t ldb, float* c, int64_t ldc) {
  make_openmp_serial();
  dnnl_status_t st = dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc);
  if (st != dnnl_success)
    throw Error("dnnl_sgemm failed (status " + std::to_string(int(st)) + ") for m=" + std::to_string(m) +
                " n=" + std::to_string(n) + " k=" + std::to_string(k));
}

// float64: no oneDNN path; a plain loop, correct and vectorizable, for the
// f64 models (checks, not speed). op(A), op(B) as for BLAS, row-major.
void blas_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const double* __restrict a, int64_t lda,
               const double* __restrict b, int64_t ldb, double* __restrict c, int64_t ldc) {
  const int64_t am = ta ? 1 : lda, ak = ta ? lda : 1;
  const int64_t bk = tb ? 1 : ldb, bn = tb ? ldb : 1;
  for (int64_t i = 0; i < m; ++i) {
    double* __restrict cr = c + i * ldc;
    const double* __restrict ar = a + i * am;
    if (bn == 1) {  // rows of B contiguous: C row += a_ip * B row p
      for (int64_t j = 0; j < n; ++j) cr[j] = 0.0;
      for (int64_t p = 0; p < k; ++p) {
        const double x = ar[p * ak];
        const double* __restrict br = b + p * bk;
        for (int64_t j = 0; j < n; ++j) cr[j] += x * br[j];
      }
    } else {  // B^T: columns of B contiguous, dot products
      for (int64_t j = 0; j < n; ++j) {
        const double* bc = b + j * bn;
        double acc = 0.0;
        for (int64_t p = 0; p < k; ++p) acc += ar[p * ak] * bc[p];
        cr[j] = acc;
      }
    }
  }
}

std::string dims_str(const std::vector<int64_t>& v) {
  std::string s = "(";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + ")";
}

// Per-thread scratch for operands whose strides BLAS cannot take (packed to
// row-major first).
template <class T>
T* scratch(int which, size_t count) {
  thread_local std::vector<T> buf[2];
  if (buf[which].size() < count) buf[which].resize(count);
  return buf[which].data();
}

}  // namespace

MatmulDesc MatmulDesc::plain(int64_t m, int64_t n, int64_t k, bool trans_a, bool trans_b) {
  MatmulDesc d;
  d.m = m, d.n = n, d.k = k;
  if (trans_a) d.a_m_stride = 1, d.a_k_stride = m;
  else d.a_m_stride = k, d.a_k_stride = 1;
  if (trans_b) d.b_k_stride = 1, d.b_n_stride = k;
  else d.b_k_stride = n, d.b_n_stride = 1;
  d.c_m_stride = n;
  return d;
}

std::string MatmulDesc::to_string() const {
  std::ostringstream os;
  if (!batch.empty())
    os << "batch" << dims_str(batch) << " a" << dims_str(a_batch_stride) << " b" << dims_str(b_batch_stride) << " c"
       << dims_str(c_batch_stride) << " ";
  os << "m=" << m << " n=" << n << " k=" << k << " a(m " << a_m_stride << ", k " << a_k_stride << ") b(k "
     << b_k_stride << ", n " << b_n_stride << ") c(m " << c_m_stride << ")";
  return os.str();
}

Gemm::Gemm(MatmulDesc desc) : d_(std::move(desc)) {
  auto fail = [&](const std::string& what) { throw Error("matmul " + d_.to_string() + ": " + what); };
  size_t nb = d_.batch.size();
  if (d_.a_batch_stride.size() != nb || d_.b_batch_stride.size() != nb || d_.c_batch_stride.size() != nb)
    fail("need one a, b and c batch stride per batch dim");
  if (d_.m < 0 || d_.n < 0 || d_.k < 0) fail("negative size");
  for (size_t i = 0; i < nb; ++i) {
    if (d_.batch[i] < 0) fail("negative batch size");
    if (d_.batch[i] > 1 && d_.c_batch_stride[i] == 0 && d_.m > 0 && d_.n > 0)
      fail("C cannot broadcast over a batch dim (every entry is written)");
  }
  if (d_.m > 1 && d_.n > 0 && d_.c_m_stride < d_.n) fail("c_m_stride must be >= n (rows of C may not overlap)");

  // Batch dims: drop size 1, merge neighbours whose strides collapse.
  for (size_t i = 0; i < nb; ++i) {
    batch_count_ *= d_.batch[i];
    if (d_.batch[i] == 1) continue;
    if (!bsize_.empty()) {
      int64_t s = d_.batch[i];
      if (bsa_.back() == d_.a_batch_stride[i] * s && bsb_.back() == d_.b_batch_stride[i] * s &&
          bsc_.back() == d_.c_batch_stride[i] * s) {
        bsize_.back() *= s;
        bsa_.back() = d_.a_batch_stride[i];
        bsb_.back() = d_.b_batch_stride[i];
        bsc_.back() = d_.c_batch_stride[i];
        continue;
      }
    }
    bsize_.push_back(d_.batch[i]);
    bsa_.push_back(d_.a_batch_stride[i]);
    bsb_.push_back(d_.b_batch_stride[i]);
    bsc_.push_back(d_.c_batch_stride[i]);
  }

  // How BLAS sees A (m x k) and B (k x n), row-major. A dim of size 1 has a
  // meaningless stride, so only the other decides.
  int64_t m = d_.m, n = d_.n, k = d_.k;
  auto layout = [](int64_t rows, int64_t cols, int64_t rs, int64_t cs, bool* trans, int64_t* ld) {
    if ((cs == 1 || cols <= 1) && (rows <= 1 || rs >= std::max<int64_t>(cols, 1))) {
      *trans = false;
      *ld = rows <= 1 ? std::max<int64_t>(cols, 1) : rs;
      return true;
    }
    if ((rs == 1 || rows <= 1) && (cols <= 1 || cs >= std::max<int64_t>(rows, 1))) {
      *trans = true;
      *ld = cols <= 1 ? std::max<int64_t>(rows, 1) : cs;
      return true;
    }
    return false;  // packed to row-major per call
  };
  a_direct_ = layout(m, k, d_.a_m_stride, d_.a_k_stride, &trans_a_, &lda_);
  b_direct_ = layout(k, n, d_.b_k_stride, d_.b_n_stride, &trans_b_, &ldb_);
  if (!a_direct_) trans_a_ = false, lda_ = std::max<int64_t>(k, 1);
  if (!b_direct_) trans_b_ = false, ldb_ = std::max<int64_t>(n, 1);
  ldc_ = m <= 1 ? std::max<int64_t>(n, 1) : d_.c_m_stride;
}

void Gemm::batch_offsets(int64_t index, int64_t* oa, int64_t* ob, int64_t* oc) const {
  int64_t a = 0, b = 0, c = 0;
  for (size_t i = bsize_.size(); i-- > 0;) {
    int64_t s = bsize_[i];
    int64_t j = index % s;
    index /= s;
    a += j * bsa_[i], b += j * bsb_[i], c += j * bsc_[i];
  }
  *oa = a, *ob = b, *oc = c;
}

Gemm::Split Gemm::split_for(int threads) const {
  Split s;
  int64_t m = d_.m, n = d_.n;
  if (threads <= 1 || batch_count_ % threads == 0 || batch_count_ >= 8 * threads) return s;
  s.split_m = m >= n;
  int64_t dim = s.split_m ? m : n;
  if (dim < 2) return s;
  s.parts = std::min<int64_t>(threads, dim);
  s.panel = (dim + s.parts - 1) / s.parts;
  if (dim >= 64 * s.parts) s.panel = (s.panel + 15) / 16 * 16;  // whole 16-row register blocks
  return s;
}

template <class T>
void Gemm::run_items(const T* a, const T* b, T* c, const Split& s, int64_t begin, int64_t end) const {
  const int64_t m = d_.m, n = d_.n, k = d_.k;
  for (int64_t item = begin; item < end; ++item) {
    int64_t bi = item / s.parts, p = item % s.parts;
    int64_t oa, ob, oc;
    batch_offsets(bi, &oa, &ob, &oc);
    const T* A = a + oa;
    const T* B = b + ob;
    T* C = c + oc;
    // This item's panel: rows [r0, r1) x columns [c0, c1) of C.
    int64_t r0 = 0, r1 = m, c0 = 0, c1 = n;
    if (s.parts > 1) {
      int64_t lo = std::min(p * s.panel, s.split_m ? m : n), hi = std::min(lo + s.panel, s.split_m ? m : n);
      if (s.split_m) r0 = lo, r1 = hi;
      else c0 = lo, c1 = hi;
    }
    int64_t mm = r1 - r0, nn = c1 - c0;
    if (mm <= 0 || nn <= 0) continue;
    if (k == 0) {
      for (int64_t i = r0; i < r1; ++i) std::fill_n(C + i * d_.c_m_stride + c0, nn, T(0));
      continue;
    }
    const T* Ap;
    if (a_direct_) {
      Ap = A + r0 * d_.a_m_stride;
    } else {
      T* buf = scratch<T>(0, size_t(mm * k));
      for (int64_t i = 0; i < mm; ++i)
        for (int64_t j = 0; j < k; ++j) buf[i * k + j] = A[(r0 + i) * d_.a_m_stride + j * d_.a_k_stride];
      Ap = buf;
    }
    const T* Bp;
    if (b_direct_) {
      Bp = B + c0 * d_.b_n_stride;
    } else {
      T* buf = scratch<T>(1, size_t(k * nn));
      for (int64_t i = 0; i < k; ++i)
        for (int64_t j = 0; j < nn; ++j) buf[i * nn + j] = B[i * d_.b_k_stride + (c0 + j) * d_.b_n_stride];
      Bp = buf;
    }
    int64_t ldb = b_direct_ ? ldb_ : std::max<int64_t>(nn, 1);
    blas_gemm(trans_a_, trans_b_, mm, nn, k, Ap, lda_, Bp, ldb, C + r0 * ldc_ + c0, ldc_);
  }
}

template <class T>
void Gemm::run_t(const T* a, const T* b, T* c, ThreadPool* pool) const {
  if (batch_count_ == 0 || d_.m == 0 || d_.n == 0) return;
  int threads = pool ? pool->num_threads() : 1;
  if (flops() < kMinParallelFlops) threads = 1;
  Split s = split_for(threads);
  int64_t items = batch_count_ * s.parts;
  if (threads == 1) {
    run_items(a, b, c, s, 0, items);
    return;
  }
  struct Ctx {
    const Gemm* g;
    const T* a;
    const T* b;
    T* c;
    Split s;
  } ctx{this, a, b, c, s};
  pool->parallel_for(
      items,
      [](void* p, int64_t begin, int64_t end) {
        auto* x = static_cast<Ctx*>(p);
        x->g->run_items(x->a, x->b, x->c, x->s, begin, end);
      },
      &ctx);
}

void Gemm::run(const float* a, const float* b, float* c, ThreadPool& pool) const { run_t(a, b, c, &pool); }
void Gemm::run(const double* a, const double* b, double* c, ThreadPool& pool) const { run_t(a, b, c, &pool); }
void Gemm::run(const float* a, const float* b, float* c) const { run_t<float>(a, b, c, nullptr); }
void Gemm::run(const double* a, const double* b, double* c) const { run_t<double>(a, b, c, nullptr); }

}  // namespace napkin::runtime
