#include "runtime/gemm.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>

#include "runtime/error.h"
#include "runtime/float_formats.h"

#include <dlfcn.h>
#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl.hpp>

namespace napkin::runtime {

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

namespace {

// Below this many FLOPs a matmul runs on the calling thread: a hot pool
// dispatch costs ~0.2-1 µs and one core does 32^3..48^3 (66-221 kFLOP) in
// 0.6-2 µs (bench/gemm_peak.cpp --pool, "small").
constexpr double kMinParallelFlops = 2.5e5;
// The f32 sums of one panel of an epilogue's GEMM: small enough to stay in
// a core's L2 (2 MiB here) beside the A rows and B panel until the epilogue reads them.
constexpr int64_t kEpiloguePanelBytes = 1024 * 1024;

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

// Per-thread scratch for operands whose strides BLAS cannot take (packed to
// row-major first) and for low-precision items widened to fp32 (0: A, 1: B,
// 2: C before narrowing), and the panel of sums an epilogue reads (3).
template <class T>
T* scratch(int which, size_t count) {
  thread_local std::vector<T> buf[4];
  if (buf[which].size() < count) buf[which].resize(count);
  return buf[which].data();
}

// Widening is exact: bf16 is the top half of a float32; f16 goes through a
// table of all 65536 codes (float_formats' decoder, built once).
float f16_to_float(uint16_t h) {
  static const std::vector<float> table = [] {
    std::vector<float> t(65536);
    for (uint32_t i = 0; i < 65536; ++i) t[i] = f16_bits_to_float(uint16_t(i));
    return t;
  }();
  return table[h];
}

// dst (rows x cols, row-major fp32) = src (rows x cols at strides rs, cs).
void widen(GemmType t, const uint16_t* src, int64_t rows, int64_t cols, int64_t rs, int64_t cs, float* dst) {
  for (int64_t i = 0; i < rows; ++i) {
    const uint16_t* s = src + i * rs;
    float* d = dst + i * cols;
    if (t == GemmType::BF16)
      for (int64_t j = 0; j < cols; ++j) d[j] = bf16_bits_to_float(s[j * cs]);
    else
      for (int64_t j = 0; j < cols; ++j) d[j] = f16_to_float(s[j * cs]);
  }
}

dnnl::engine& cpu_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

}  // namespace


// The bf16 primitives of one Gemm, one per distinct panel shape (a split has
// at most two: the full panel and the last one), for every thread count
// prepared. An entry without a primitive means oneDNN has no fast kernel for
// that shape and layout: the item takes f32 panels.
struct Gemm::Primitives {
  struct Entry {
    std::optional<dnnl::matmul> prim;
    dnnl::memory::desc a, b, c, scratchpad;
  };
  std::mutex mu;
  std::map<std::pair<int64_t, int64_t>, Entry> by_shape;  // (rows, columns) of C's panel
  std::map<int, std::vector<const Entry*>> by_threads;      // thread count -> entry per panel index
};

// One run: operands, split, and for bf16 the entry of each panel index.
struct Gemm::Run {
  const char* a;
  const char* b;
  char* c;
  Split s;
  const std::vector<const Primitives::Entry*>* entries = nullptr;
  const RowsEpilogue* epilogue = nullptr;  // then C is not written: each panel's sums go to it
};

Gemm::Gemm(MatmulDesc desc, GemmTypes types, LowPrecisionKernel kernel, bool epilogue_panels)
    : d_(std::move(desc)), types_(types), kernel_(kernel), epilogue_panels_(epilogue_panels) {
  auto fail = [&](const std::string& what) { throw Error("matmul " + d_.to_string() + ": " + what); };
  bool low = types_.ab == GemmType::BF16 || types_.ab == GemmType::F16;
  if (types_.c != types_.ab && !(low && types_.c == GemmType::F32))
    fail(std::string("no CPU matmul of ") + gemm_type_name(types_.ab) + " operands into " + gemm_type_name(types_.c));
  if (types_.ab == GemmType::BF16) prims_ = std::make_unique<Primitives>();
  d_.check_sizes();
  for (size_t i = 0; i < d_.batch.size(); ++i)
    if (d_.batch[i] > 1 && d_.c_batch_stride[i] == 0 && d_.m > 0 && d_.n > 0)
      fail("C cannot broadcast over a batch dim (every entry is written)");
  if (d_.m > 1 && d_.n > 0 && d_.c_m_stride < d_.n) fail("c_m_stride must be >= n (rows of C may not overlap)");

  for (int64_t size : d_.batch) batch_count_ *= size;
  batch_ = d_.merged_batch();

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
  if (epilogue_panels_ && (types_.c != GemmType::F32 || batch_count_ != 1 || ldc_ != std::max<int64_t>(n, 1)))
    fail("an epilogue needs f32 sums of one [m, n] product with rows n apart");
}

Gemm::~Gemm() = default;
Gemm::Gemm(Gemm&&) noexcept = default;

void Gemm::batch_offsets(int64_t index, int64_t* oa, int64_t* ob, int64_t* oc) const {
  int64_t a = 0, b = 0, c = 0;
  for (size_t i = batch_.size(); i-- > 0;) {
    const MatmulDesc::BatchDim& x = batch_[i];
    int64_t j = index % x.size;
    index /= x.size;
    a += j * x.a, b += j * x.b, c += j * x.c;
  }
  *oa = a, *ob = b, *oc = c;
}

Gemm::Split Gemm::split_for(int threads) const {
  Split s;
  int64_t m = d_.m, n = d_.n;
  if (epilogue_panels_) {
    // Panels of whole rows whose sums fit in kEpiloguePanelBytes, so the
    // epilogue reads them from cache, as many as a multiple of the threads
    // (each thread gets as many rows), 16-row register blocks where m allows.
    const int64_t cap = std::max<int64_t>(16, kEpiloguePanelBytes / (4 * std::max<int64_t>(n, 1)));
    const int64_t t = std::max(threads, 1);
    int64_t parts = ((m + cap - 1) / cap + t - 1) / t * t;
    parts = std::max<int64_t>(1, std::min(parts, m));
    s.panel = (m + parts - 1) / parts;
    if (m >= 16 * parts) s.panel = (s.panel + 15) / 16 * 16;
    s.parts = (m + s.panel - 1) / s.panel;
    return s;
  }
  if (threads <= 1 || batch_count_ % threads == 0 || batch_count_ >= 8 * threads) return s;
  s.split_m = m >= n;
  int64_t dim = s.split_m ? m : n;
  if (dim < 2) return s;
  s.parts = std::min<int64_t>(threads, dim);
  s.panel = (dim + s.parts - 1) / s.parts;
  if (dim >= 64 * s.parts) s.panel = (s.panel + 15) / 16 * 16;  // whole 16-row register blocks
  return s;
}

Gemm::Panel Gemm::panel_of(const Split& s, int64_t p) const {
  Panel pn{0, d_.m, 0, d_.n};
  if (s.parts > 1) {
    int64_t dim = s.split_m ? d_.m : d_.n;
    int64_t lo = std::min(p * s.panel, dim), hi = std::min(lo + s.panel, dim);
    if (s.split_m) pn.r0 = lo, pn.r1 = hi;
    else pn.c0 = lo, pn.c1 = hi;
  }
  return pn;
}

int Gemm::threads_for(ThreadPool* pool) const {
  if (!pool || flops() < kMinParallelFlops) return 1;
  return pool->num_threads();
}

void Gemm::prepare(int threads) const {
  if (!prims_ || batch_count_ == 0 || d_.m == 0 || d_.n == 0) return;
  if (flops() < kMinParallelFlops) threads = 1;
  std::lock_guard<std::mutex> lock(prims_->mu);
  if (prims_->by_threads.count(threads)) return;
  Split s = split_for(threads);
  std::vector<const Primitives::Entry*> entries;
  for (int64_t p = 0; p < s.parts; ++p) {
    Panel pn = panel_of(s, p);
    int64_t rows = pn.r1 - pn.r0, cols = pn.c1 - pn.c0;
    auto [it, fresh] = prims_->by_shape.try_emplace({rows, cols});
    Primitives::Entry& e = it->second;
    entries.push_back(&e);
    if (!fresh || rows <= 0 || cols <= 0 || d_.k == 0 || kernel_ == LowPrecisionKernel::F32Panels ||
        !a_direct_ || !b_direct_)
      continue;
    using dnnl::memory;
    using dims = memory::dims;
    const int64_t k = d_.k;
    e.a = memory::desc({rows, k}, memory::data_type::bf16, trans_a_ ? dims{1, lda_} : dims{lda_, 1});
    e.b = memory::desc({k, cols}, memory::data_type::bf16, trans_b_ ? dims{1, ldb_} : dims{ldb_, 1});
    e.c = memory::desc({rows, cols}, types_.c == GemmType::F32 ? memory::data_type::f32 : memory::data_type::bf16,
                       dims{ldc_, 1});
    // The primitive fixes its thread count when it is created: create it
    // serial, as it will run.
    make_openmp_serial();
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    try {
      dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(e.a, e.b, e.c), attr, cpu_engine());
      if (std::string(pd.impl_info_str()).rfind("ref", 0) == 0) continue;  // a reference loop: slower than panels
      e.scratchpad = pd.scratchpad_desc();
      e.prim.emplace(pd);
    } catch (const dnnl::error&) {
      // No implementation for this layout: f32 panels.
    }
  }
  prims_->by_threads.emplace(threads, std::move(entries));
}

bool Gemm::uses_primitive(int threads) const {
  if (!prims_) return false;
  prepare(threads);
  if (flops() < kMinParallelFlops) threads = 1;
  std::lock_guard<std::mutex> lock(prims_->mu);
  const auto& entries = prims_->by_threads.at(threads);
  return !entries.empty() && std::all_of(entries.begin(), entries.end(), [](const auto* e) { return e->prim.has_value(); });
}

template <class T>
void Gemm::blas_item(const T* A, const T* B, T* Cp, const Panel& p) const {
  const int64_t k = d_.k, mm = p.r1 - p.r0, nn = p.c1 - p.c0;
  const T* Ap;
  if (a_direct_) {
    Ap = A + p.r0 * d_.a_m_stride;
  } else {
    T* buf = scratch<T>(0, size_t(mm * k));
    for (int64_t i = 0; i < mm; ++i)
      for (int64_t j = 0; j < k; ++j) buf[i * k + j] = A[(p.r0 + i) * d_.a_m_stride + j * d_.a_k_stride];
    Ap = buf;
  }
  const T* Bp;
  if (b_direct_) {
    Bp = B + p.c0 * d_.b_n_stride;
  } else {
    T* buf = scratch<T>(1, size_t(k * nn));
    for (int64_t i = 0; i < k; ++i)
      for (int64_t j = 0; j < nn; ++j) buf[i * nn + j] = B[i * d_.b_k_stride + (p.c0 + j) * d_.b_n_stride];
    Bp = buf;
  }
  int64_t ldb = b_direct_ ? ldb_ : std::max<int64_t>(nn, 1);
  blas_gemm(trans_a_, trans_b_, mm, nn, k, Ap, lda_, Bp, ldb, Cp, ldc_);
}

// A low-precision item as fp32: the panel's A rows and B columns widened into
// scratch, each in the orientation that reads its source with unit stride
// (handed to sgemm transposed when that is the column-major one).
void Gemm::panels_item(const void* A, const void* B, void* Cp, const Panel& p) const {
  const int64_t k = d_.k, mm = p.r1 - p.r0, nn = p.c1 - p.c0;
  const GemmType t = types_.ab;
  const uint16_t* a = static_cast<const uint16_t*>(A) + p.r0 * d_.a_m_stride;
  const uint16_t* b = static_cast<const uint16_t*>(B) + p.c0 * d_.b_n_stride;
  float* ap = scratch<float>(0, size_t(mm * k));
  float* bp = scratch<float>(1, size_t(k * nn));
  const bool ta = d_.a_m_stride == 1 && d_.a_k_stride != 1 && mm > 1;
  const bool tb = d_.b_k_stride == 1 && d_.b_n_stride != 1 && k > 1;
  if (ta) widen(t, a, k, mm, d_.a_k_stride, d_.a_m_stride, ap);
  else widen(t, a, mm, k, d_.a_m_stride, d_.a_k_stride, ap);
  if (tb) widen(t, b, nn, k, d_.b_n_stride, d_.b_k_stride, bp);
  else widen(t, b, k, nn, d_.b_k_stride, d_.b_n_stride, bp);
  const int64_t lda = ta ? mm : k, ldb = tb ? k : nn;
  if (types_.c == GemmType::F32) {
    blas_gemm(ta, tb, mm, nn, k, ap, lda, bp, ldb, static_cast<float*>(Cp), ldc_);
    return;
  }
  float* cp = scratch<float>(2, size_t(mm * nn));
  blas_gemm(ta, tb, mm, nn, k, ap, lda, bp, ldb, cp, nn);
  for (int64_t i = 0; i < mm; ++i) {
    uint16_t* row = static_cast<uint16_t*>(Cp) + i * ldc_;
    const float* src = cp + i * nn;
    if (t == GemmType::BF16)
      for (int64_t j = 0; j < nn; ++j) row[j] = float_to_bf16_bits_inline(src[j]);
    else
      for (int64_t j = 0; j < nn; ++j) row[j] = float_to_f16_bits(src[j]);
  }
}

void Gemm::run_items(const Run& r, int64_t begin, int64_t end) const {
  const size_t ab = gemm_type_bytes(types_.ab), cb = gemm_type_bytes(types_.c);
  for (int64_t item = begin; item < end; ++item) {
    int64_t bi = item / r.s.parts, p = item % r.s.parts;
    Panel pn = panel_of(r.s, p);
    int64_t mm = pn.r1 - pn.r0, nn = pn.c1 - pn.c0;
    if (mm <= 0 || nn <= 0) continue;
    int64_t oa, ob, oc;
    batch_offsets(bi, &oa, &ob, &oc);
    const char* A = r.a + oa * int64_t(ab);
    const char* B = r.b + ob * int64_t(ab);
    // The panel's first element of C, or of the per-thread panel of sums an epilogue reads.
    char* Cp = r.epilogue ? reinterpret_cast<char*>(scratch<float>(3, size_t(mm * ldc_)))
                          : r.c + (oc + pn.r0 * ldc_ + pn.c0) * int64_t(cb);
    run_panel(r, p, A, B, Cp, pn);
    if (r.epilogue) r.epilogue->fn(r.epilogue->ctx, pn.r0, pn.r1, reinterpret_cast<const float*>(Cp));
  }
}

void Gemm::run_panel(const Run& r, int64_t p, const char* A, const char* B, char* Cp, const Panel& pn) const {
  const size_t ab = gemm_type_bytes(types_.ab), cb = gemm_type_bytes(types_.c);
  const int64_t nn = pn.c1 - pn.c0;
  if (d_.k == 0) {  // all-zero bits are +0 in every type
    for (int64_t i = 0; i < pn.r1 - pn.r0; ++i) std::memset(Cp + i * ldc_ * int64_t(cb), 0, size_t(nn) * cb);
    return;
  }
  switch (types_.ab) {
    case GemmType::F32:
      blas_item(reinterpret_cast<const float*>(A), reinterpret_cast<const float*>(B), reinterpret_cast<float*>(Cp), pn);
      break;
    case GemmType::F64:
      blas_item(reinterpret_cast<const double*>(A), reinterpret_cast<const double*>(B), reinterpret_cast<double*>(Cp),
                pn);
      break;
    case GemmType::BF16:
    case GemmType::F16: {
      const Primitives::Entry* e = r.entries ? (*r.entries)[size_t(p)] : nullptr;
      if (!e || !e->prim) {
        panels_item(A, B, Cp, pn);
        break;
      }
      make_openmp_serial();
      const dnnl::engine& eng = cpu_engine();
      thread_local dnnl::stream stream(cpu_engine());
      thread_local std::vector<char> pad;
      if (pad.size() < e->scratchpad.get_size()) pad.resize(e->scratchpad.get_size());
      dnnl::memory am(e->a, eng, const_cast<char*>(A + pn.r0 * d_.a_m_stride * int64_t(ab)));
      dnnl::memory bm(e->b, eng, const_cast<char*>(B + pn.c0 * d_.b_n_stride * int64_t(ab)));
      dnnl::memory cm(e->c, eng, Cp);
      dnnl::memory sm(e->scratchpad, eng, pad.data());
      e->prim->execute(stream, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}, {DNNL_ARG_SCRATCHPAD, sm}});
      stream.wait();
      break;
    }
  }
}

void Gemm::run_any(const void* a, const void* b, void* c, ThreadPool* pool, const RowsEpilogue* epilogue) const {
  if (batch_count_ == 0 || d_.m == 0 || d_.n == 0) return;
  if (epilogue_panels_ != (epilogue != nullptr))
    throw Error("matmul " + d_.to_string() + (epilogue ? ": an epilogue given to a Gemm built without one" : ": built for an epilogue, run without one"));
  int threads = threads_for(pool);
  Run r{static_cast<const char*>(a), static_cast<const char*>(b), static_cast<char*>(c), split_for(threads)};
  r.epilogue = epilogue;
  if (prims_) {
    prepare(threads);
    std::lock_guard<std::mutex> lock(prims_->mu);
    r.entries = &prims_->by_threads.at(threads);  // map nodes stay put as others are added
  }
  int64_t items = batch_count_ * r.s.parts;
  if (threads == 1) {
    run_items(r, 0, items);
    return;
  }
  struct Ctx {
    const Gemm* g;
    const Run* r;
  } ctx{this, &r};
  pool->parallel_for(
      items,
      [](void* p, int64_t begin, int64_t end) {
        auto* x = static_cast<Ctx*>(p);
        x->g->run_items(*x->r, begin, end);
      },
      &ctx);
}

void Gemm::run(const void* a, const void* b, void* c, ThreadPool& pool) const { run_any(a, b, c, &pool, nullptr); }
void Gemm::run(const void* a, const void* b, void* c) const { run_any(a, b, c, nullptr, nullptr); }
void Gemm::run_with_epilogue(const void* a, const void* b, const RowsEpilogue& epilogue, ThreadPool& pool) const {
  run_any(a, b, nullptr, &pool, &epilogue);
}

namespace {
void require(GemmTypes have, GemmType want) {
  if (have.ab != want || have.c != want)
    throw Error(std::string("a ") + gemm_type_name(have.ab) + " matmul run with " + gemm_type_name(want) + " operands");
}
}  // namespace

void Gemm::run(const float* a, const float* b, float* c, ThreadPool& pool) const {
  require(types_, GemmType::F32);
  run_any(a, b, c, &pool, nullptr);
}
void Gemm::run(const double* a, const double* b, double* c, ThreadPool& pool) const {
  require(types_, GemmType::F64);
  run_any(a, b, c, &pool, nullptr);
}
void Gemm::run(const float* a, const float* b, float* c) const {
  require(types_, GemmType::F32);
  run_any(a, b, c, nullptr, nullptr);
}
void Gemm::run(const double* a, const double* b, double* c) const {
  require(types_, GemmType::F64);
  run_any(a, b, c, nullptr, nullptr);
}

namespace {

template <class Load>
void sum_columns(const MatmulDesc& d, int64_t c0, int64_t c1, float* sums, Load load) {
  std::vector<double> acc(static_cast<size_t>(c1 - c0), 0.0);
  if (d.b_n_stride == 1 || d.n <= 1) {  // rows contiguous: the inner loop runs along a row
    for (int64_t k = 0; k < d.k; ++k) {
      const int64_t row = k * d.b_k_stride;
      for (int64_t j = c0; j < c1; ++j) acc[j - c0] += load(row + j);
    }
  } else {  // columns contiguous
    for (int64_t j = c0; j < c1; ++j)
      for (int64_t k = 0; k < d.k; ++k) acc[j - c0] += load(k * d.b_k_stride + j * d.b_n_stride);
  }
  for (int64_t j = c0; j < c1; ++j) sums[j] = static_cast<float>(acc[j - c0]);
}

}  // namespace

void sum_b_over_k(const MatmulDesc& d, GemmType type, const void* b, float* sums, ThreadPool& pool) {
  if (type == GemmType::F64) throw Error("a bias gradient of f64 operands is f64, not the f32 sums stored here");
  constexpr int64_t kColumns = 256;  // per work item
  const int64_t items = (d.n + kColumns - 1) / kColumns;
  pool.parallel_for(items, [&](int64_t begin, int64_t end) {
    const int64_t c0 = begin * kColumns, c1 = std::min(d.n, end * kColumns);
    switch (type) {
      case GemmType::F32: {
        const auto* x = static_cast<const float*>(b);
        sum_columns(d, c0, c1, sums, [x](int64_t i) { return static_cast<double>(x[i]); });
        break;
      }
      case GemmType::BF16: {
        const auto* x = static_cast<const uint16_t*>(b);
        sum_columns(d, c0, c1, sums, [x](int64_t i) { return double(bf16_bits_to_float(x[i])); });
        break;
      }
      case GemmType::F64: break;  // refused before the split
      case GemmType::F16: {
        const auto* x = static_cast<const uint16_t*>(b);
        sum_columns(d, c0, c1, sums, [x](int64_t i) { return static_cast<double>(f16_bits_to_float(x[i])); });
        break;
      }
    }
  });
}

}  // namespace napkin::runtime
