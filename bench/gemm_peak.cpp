// GFLOP/s of the fp32 and bf16 matmul candidates on napkin's model shapes, plus
// the ThreadPool's dispatch latency and the BLAS-threads-vs-pool interference test.
// The winner is runtime/gemm.cpp's implementation; numbers in bench/README.md.
//
// Build and run (from the repository root; or configure with -DNAPKIN_GEMM_BENCH=ON):
//   g++ -O2 -std=c++20 -I. bench/gemm_peak.cpp runtime/gemm.cpp runtime/thread_pool.cpp runtime/float_formats.cpp -o /tmp/gemm_peak -lopenblas -ldnnl -lgomp -lpthread && /tmp/gemm_peak
//
// Each candidate runs in its own process (this binary re-executes itself with
// `--candidate NAME` and the environment that candidate needs), so the
// thread pools of OpenBLAS, OpenMP and napkin never meet unless a test means
// them to. Candidates:
//   napkin        runtime::Gemm as built (dnnl_sgemm single-threaded in napkin's ThreadPool)
//   openblas-mt   cblas_sgemm with OpenBLAS's own threads, one call per batch entry
//   openblas-pool cblas_sgemm single-threaded inside napkin's ThreadPool
//   dnnl-sgemm    dnnl_sgemm with oneDNN's OpenMP threads, one call per batch entry
//   dnnl-matmul   oneDNN matmul primitive (strided memory descriptors, batch native),
//                 created once, OpenMP threads
//   dnnl-pool     dnnl_sgemm single-threaded inside napkin's ThreadPool (same split as napkin)
// bf16 (A, B and C bf16, fp32 accumulation; the same shapes, inputs rounded to bf16):
//   bf16-napkin   runtime::Gemm bf16 as built (LowPrecisionKernel::Auto)
//   bf16-prim     forced: oneDNN's matmul primitive per work item, in the pool
//   bf16-panels   forced: items widened to fp32 panels, then sgemm, in the pool
//   bf16-matmul   oneDNN matmul primitive over the whole batch, OpenMP threads
// `--bf16` runs napkin (fp32) and the bf16 candidates only.
#include <dnnl.hpp>
#include <omp.h>
#include <dirent.h>
#include <spawn.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "runtime/float_formats.h"
#include "runtime/gemm.h"
#include "runtime/thread_pool.h"

extern "C" {
void openblas_set_num_threads(int);
void cblas_sgemm(int order, int trans_a, int trans_b, int m, int n, int k, float alpha, const float* a, int lda,
                 const float* b, int ldb, float beta, float* c, int ldc);
}
extern char** environ;

using napkin::runtime::Gemm;
using napkin::runtime::GemmType;
using napkin::runtime::LowPrecisionKernel;
using napkin::runtime::MatmulDesc;
using napkin::runtime::ThreadPool;
using Clock = std::chrono::steady_clock;

namespace {

std::unique_ptr<ThreadPool> g_pool;

struct Shape {
  std::string name;
  MatmulDesc d;
};

MatmulDesc plain(int64_t m, int64_t n, int64_t k, bool ta = false, bool tb = false) {
  return MatmulDesc::plain(m, n, k, ta, tb);
}

std::vector<Shape> shapes() {
  std::vector<Shape> s = {
      {"peak 2048^3", plain(2048, 2048, 2048)},
      {"mlp  512x784 @ 784x1024", plain(512, 1024, 784)},
      {"mlp  512x1024 @ 1024x1024", plain(512, 1024, 1024)},
      {"mlp  512x1024 @ 1024x10", plain(512, 10, 1024)},
      {"mlp  512x1024 @ (784x1024)^T", plain(512, 784, 1024, false, true)},
      {"mlp  (512x784)^T @ 512x1024", plain(784, 1024, 512, true, false)},
      {"mlp  512x1024 @ (1024x1024)^T", plain(512, 1024, 1024, false, true)},
      {"mlp  (512x1024)^T @ 512x1024", plain(1024, 1024, 512, true, false)},
      {"mlp  512x10 @ (1024x10)^T", plain(512, 1024, 10, false, true)},
      {"mlp  (512x1024)^T @ 512x10", plain(1024, 10, 512, true, false)},
      {"crn  256x1024 @ 1024x1024", plain(256, 1024, 1024)},
      {"crn  256x1024 @ (1024x1024)^T", plain(256, 1024, 1024, false, true)},
      {"crn  (256x1024)^T @ 256x1024", plain(1024, 1024, 256, true, false)},
      {"gpt  2048x256 @ 256x768", plain(2048, 768, 256)},
      {"gpt  2048x256 @ 256x1024", plain(2048, 1024, 256)},
      {"gpt  2048x1024 @ 1024x256", plain(2048, 256, 1024)},
      {"gpt  2048x256 @ 256x256", plain(2048, 256, 256)},
      {"gpt  2048x256 @ (256x256)^T", plain(2048, 256, 256, false, true)},
      {"gpt  (2048x256)^T @ 2048x768", plain(256, 768, 2048, true, false)},
      {"gpt  2048x768 @ (256x768)^T", plain(2048, 256, 768, false, true)},
  };
  // Attention, B=16 T=128 d=256 h=4 dh=64, q/k/v inside a fused qkv buffer
  // [b, t, 3, h, dh]: batch dims (b, h) with strides (T*3*d, dh) = (98304, 64).
  MatmulDesc qk;
  qk.batch = {16, 4};
  qk.a_batch_stride = {98304, 64};          // q
  qk.b_batch_stride = {98304, 64};          // k (offset 256 in the buffer)
  qk.c_batch_stride = {4 * 128 * 128, 128 * 128};
  qk.m = 128, qk.n = 128, qk.k = 64;
  qk.a_m_stride = 768, qk.a_k_stride = 1;
  qk.b_k_stride = 1, qk.b_n_stride = 768;   // k^T
  qk.c_m_stride = 128;
  s.push_back({"att  64 x 128x64 @ (128x64)^T strided", qk});
  MatmulDesc pv;
  pv.batch = {16, 4};
  pv.a_batch_stride = {4 * 128 * 128, 128 * 128};  // probabilities
  pv.b_batch_stride = {98304, 64};                 // v
  pv.c_batch_stride = {128 * 256, 64};             // out [b, t, h, dh]
  pv.m = 128, pv.n = 64, pv.k = 128;
  pv.a_m_stride = 128, pv.a_k_stride = 1;
  pv.b_k_stride = 768, pv.b_n_stride = 1;
  pv.c_m_stride = 256;
  s.push_back({"att  64 x 128x128 @ 128x64 strided", pv});
  return s;
}

// Elements an operand spans (max offset + 1).
int64_t span(const std::vector<int64_t>& batch, const std::vector<int64_t>& bs, int64_t r, int64_t rs, int64_t c,
             int64_t cs) {
  int64_t off = 0;
  for (size_t i = 0; i < batch.size(); ++i) off += (batch[i] - 1) * bs[i];
  return off + (r - 1) * rs + (c - 1) * cs + 1;
}

struct Buffers {
  std::vector<float> a, b, c;
  std::vector<uint16_t> a16, b16, c16;  // a and b rounded to bf16; C of the bf16 candidates
  explicit Buffers(const MatmulDesc& d) {
    a.resize(span(d.batch, d.a_batch_stride, d.m, d.a_m_stride, d.k, d.a_k_stride) + 256);
    b.resize(span(d.batch, d.b_batch_stride, d.k, d.b_k_stride, d.n, d.b_n_stride) + 256);
    c.resize(span(d.batch, d.c_batch_stride, d.m, d.c_m_stride, d.n, 1));
    for (size_t i = 0; i < a.size(); ++i) a[i] = float((i * 7919) % 1000) * 1e-3f - 0.5f;
    for (size_t i = 0; i < b.size(); ++i) b[i] = float((i * 104729) % 1000) * 1e-3f - 0.5f;
    for (float x : a) a16.push_back(napkin::runtime::float_to_bf16_bits(x));
    for (float x : b) b16.push_back(napkin::runtime::float_to_bf16_bits(x));
    c16.resize(c.size());
  }
};

bool is_bf16(const std::string& cand) { return cand.rfind("bf16-", 0) == 0; }

int64_t batch_count(const MatmulDesc& d) {
  int64_t n = 1;
  for (auto b : d.batch) n *= b;
  return n;
}
void offsets(const MatmulDesc& d, int64_t idx, int64_t* oa, int64_t* ob, int64_t* oc) {
  *oa = *ob = *oc = 0;
  for (size_t i = d.batch.size(); i-- > 0;) {
    int64_t j = idx % d.batch[i];
    idx /= d.batch[i];
    *oa += j * d.a_batch_stride[i], *ob += j * d.b_batch_stride[i], *oc += j * d.c_batch_stride[i];
  }
}

// dnnl_sgemm or cblas_sgemm (row-major) of rows [r0, r1) of batch entry idx.
template <bool kDnnl>
void blas_one(const MatmulDesc& d, const float* a, const float* b, float* c, int64_t idx, int64_t r0, int64_t r1) {
  int64_t oa, ob, oc;
  offsets(d, idx, &oa, &ob, &oc);
  bool ta = d.a_k_stride != 1, tb = d.b_n_stride != 1;
  int64_t lda = ta ? d.a_k_stride : d.a_m_stride, ldb = tb ? d.b_n_stride : d.b_k_stride;
  if (kDnnl)
    dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', r1 - r0, d.n, d.k, 1.0f, a + oa + r0 * d.a_m_stride, lda, b + ob, ldb,
               0.0f, c + oc + r0 * d.c_m_stride, d.c_m_stride);
  else
    cblas_sgemm(101, ta ? 112 : 111, tb ? 112 : 111, int(r1 - r0), int(d.n), int(d.k), 1.0f,
                a + oa + r0 * d.a_m_stride, int(lda), b + ob, int(ldb), 0.0f, c + oc + r0 * d.c_m_stride,
                int(d.c_m_stride));
}
void dnnl_one(const MatmulDesc& d, const float* a, const float* b, float* c, int64_t idx, int64_t r0, int64_t r1) {
  blas_one<true>(d, a, b, c, idx, r0, r1);
}

// The pool split napkin uses (simplified): the batch when it divides evenly,
// else (batch entry, row panel) items.
template <bool kDnnl>
void pool_run(const MatmulDesc& d, const float* a, const float* b, float* c) {
  int64_t nb = batch_count(d);
  int t = g_pool->num_threads();
  if (nb % t == 0) {
    g_pool->parallel_for(nb, [&](int64_t b0, int64_t b1) {
      for (int64_t i = b0; i < b1; ++i) blas_one<kDnnl>(d, a, b, c, i, 0, d.m);
    });
  } else {
    g_pool->parallel_for(nb * t, [&](int64_t b0, int64_t b1) {
      for (int64_t it = b0; it < b1; ++it) {
        auto [r0, r1] = ThreadPool::chunk(d.m, t, int(it % t));
        if (r0 < r1) blas_one<kDnnl>(d, a, b, c, it / t, r0, r1);
      }
    });
  }
}

struct Candidate {
  std::function<void(const float*, const float*, float*)> run;
  std::function<void(const uint16_t*, const uint16_t*, uint16_t*)> run16;  // bf16 candidates
};

Candidate make(const std::string& cand, const MatmulDesc& d) {
  if (is_bf16(cand) && cand != "bf16-matmul") {
    LowPrecisionKernel kernel = cand == "bf16-prim"     ? LowPrecisionKernel::Primitive
                                : cand == "bf16-panels" ? LowPrecisionKernel::F32Panels
                                                        : LowPrecisionKernel::Auto;
    auto g = std::make_shared<Gemm>(d, napkin::runtime::GemmTypes{GemmType::BF16, GemmType::BF16}, kernel);
    g->prepare(g_pool->num_threads());
    Candidate c;
    c.run16 = [g](const uint16_t* a, const uint16_t* b, uint16_t* c) { g->run(a, b, c, *g_pool); };
    return c;
  }
  if (cand == "napkin") {
    auto g = std::make_shared<Gemm>(d);
    return {[g](const float* a, const float* b, float* c) { g->run(a, b, c, *g_pool); }};
  }
  if (cand == "openblas-mt") {
    return {[d](const float* a, const float* b, float* c) {
      for (int64_t i = 0, n = batch_count(d); i < n; ++i) blas_one<false>(d, a, b, c, i, 0, d.m);
    }};
  }
  if (cand == "openblas-pool") return {[d](const float* a, const float* b, float* c) { pool_run<false>(d, a, b, c); }};
  if (cand == "dnnl-sgemm") {
    return {[d](const float* a, const float* b, float* c) {
      for (int64_t i = 0, n = batch_count(d); i < n; ++i) dnnl_one(d, a, b, c, i, 0, d.m);
    }};
  }
  if (cand == "dnnl-pool") return {[d](const float* a, const float* b, float* c) { pool_run<true>(d, a, b, c); }};
  if (cand == "dnnl-matmul" || cand == "bf16-matmul") {
    using namespace dnnl;
    const auto dt = cand == "bf16-matmul" ? memory::data_type::bf16 : memory::data_type::f32;
    static engine eng(engine::kind::cpu, 0);
    static stream strm(eng);
    memory::dims bd(d.batch.begin(), d.batch.end());
    auto dims = [&](int64_t r, int64_t c) {
      memory::dims x = bd;
      x.push_back(r), x.push_back(c);
      return x;
    };
    auto strides = [&](const std::vector<int64_t>& bs, int64_t rs, int64_t cs) {
      memory::dims x(bs.begin(), bs.end());
      x.push_back(rs), x.push_back(cs);
      return x;
    };
    memory::desc amd(dims(d.m, d.k), dt, strides(d.a_batch_stride, d.a_m_stride, d.a_k_stride));
    memory::desc bmd(dims(d.k, d.n), dt, strides(d.b_batch_stride, d.b_k_stride, d.b_n_stride));
    memory::desc cmd(dims(d.m, d.n), dt, strides(d.c_batch_stride, d.c_m_stride, 1));
    auto prim = std::make_shared<matmul>(matmul::primitive_desc(matmul::desc(amd, bmd, cmd), eng));
    auto exec = [=](const void* a, const void* b, void* c) {
      memory am(amd, eng, const_cast<void*>(a)), bm(bmd, eng, const_cast<void*>(b)), cm(cmd, eng, c);
      prim->execute(strm, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
      strm.wait();
    };
    Candidate c;
    if (dt == memory::data_type::bf16) c.run16 = exec;
    else c.run = exec;
    return c;
  }
  std::fprintf(stderr, "unknown candidate %s\n", cand.c_str());
  std::exit(2);
}

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Median of 5 measurements of ~40 ms each, in seconds per call.
double time_it(const std::function<void()>& f) {
  f();
  f();
  auto t = Clock::now();
  f();
  double one = std::max(seconds_since(t), 1e-7);
  int reps = std::max(1, int(0.04 / one));
  std::vector<double> v;
  for (int r = 0; r < 5; ++r) {
    t = Clock::now();
    for (int i = 0; i < reps; ++i) f();
    v.push_back(seconds_since(t) / reps);
  }
  std::sort(v.begin(), v.end());
  return v[2];
}

void check_against_napkin(const std::string& cand, const MatmulDesc& d, const Buffers& buf, const std::vector<float>& c) {
  if (cand == "napkin") return;
  std::vector<float> ref(buf.c.size(), 0.0f);
  Gemm(d).run(buf.a.data(), buf.b.data(), ref.data());
  double worst = 0, scale = 1e-3;
  for (size_t i = 0; i < ref.size(); ++i) {
    worst = std::max(worst, double(std::fabs(ref[i] - c[i])));
    scale = std::max(scale, double(std::fabs(ref[i])));
  }
  // bf16: inputs and C rounded (2^-8 each) against fp32 napkin on unrounded inputs.
  if (worst > (is_bf16(cand) ? 2e-2 * scale : 1e-2))
    std::fprintf(stderr, "%s: %s differs from napkin by %g\n", cand.c_str(), d.to_string().c_str(), worst);
}

// Memory-bound elementwise loop on the pool: y = 2x + 1 over 4 Mi floats.
struct Axpb {
  const float* x;
  float* y;
};
void axpb(void* p, int64_t b, int64_t e) {
  auto* s = static_cast<Axpb*>(p);
  for (int64_t i = b; i < e; ++i) s->y[i] = 2.0f * s->x[i] + 1.0f;
}

int child(const std::string& cand) {
  g_pool = std::make_unique<ThreadPool>(2);
  openblas_set_num_threads(cand == "openblas-mt" ? 2 : 1);
  if (cand == "dnnl-pool") g_pool->run_on_all([](void*, int64_t, int64_t) { omp_set_num_threads(1); }, nullptr);
  for (auto& s : shapes()) {
    Buffers buf(s.d);
    Candidate c = make(cand, s.d);
    double sec;
    if (c.run16) {
      sec = time_it([&] { c.run16(buf.a16.data(), buf.b16.data(), buf.c16.data()); });
      std::vector<float> c32;
      for (uint16_t x : buf.c16) c32.push_back(napkin::runtime::bf16_bits_to_float(x));
      check_against_napkin(cand, s.d, buf, c32);
    } else {
      sec = time_it([&] { c.run(buf.a.data(), buf.b.data(), buf.c.data()); });
      check_against_napkin(cand, s.d, buf, buf.c);
    }
    double fl = 2.0 * batch_count(s.d) * s.d.m * s.d.n * s.d.k;
    std::printf("%s\t%s\t%.1f\n", cand.c_str(), s.name.c_str(), fl / sec * 1e-9);
  }
  // Interference: a GEMM, then a pool loop, alternated (fp32 candidates).
  if (!is_bf16(cand)) {
    MatmulDesc d = plain(512, 1024, 1024);
    Buffers buf(d);
    Candidate c = make(cand, d);
    const int64_t n = 1 << 22;
    std::vector<float> x(n, 1.0f), y(n);
    Axpb ax{x.data(), y.data()};
    auto loop = [&] { g_pool->parallel_for(n, axpb, &ax); };
    auto gemm = [&] { c.run(buf.a.data(), buf.b.data(), buf.c.data()); };
    double tg = time_it(gemm), tl = time_it(loop);
    const int iters = 300;
    auto t = Clock::now();
    for (int i = 0; i < iters; ++i) gemm(), loop();
    double both = seconds_since(t) / iters;
    // The loop alone right after a GEMM (when BLAS threads may still spin).
    double loop_after = 0;
    for (int i = 0; i < 100; ++i) {
      gemm();
      auto t1 = Clock::now();
      loop();
      loop_after += seconds_since(t1);
    }
    loop_after /= 100;
    int tasks = 0;
    if (DIR* dir = opendir("/proc/self/task")) {
      while (dirent* e = readdir(dir)) tasks += e->d_name[0] != '.';
      closedir(dir);
    }
    std::printf("%s\tthreads in the process: %d\n", cand.c_str(), tasks);
    std::printf("%s\tinterference: gemm %.0f us, pool loop %.0f us alone, %.0f us right after a gemm; "
                "alternated %.0f us vs sum %.0f us (+%.0f%%)\n",
                cand.c_str(), tg * 1e6, tl * 1e6, loop_after * 1e6, both * 1e6, (tg + tl) * 1e6,
                (both / (tg + tl) - 1) * 100);
  }
  return 0;
}

void pool_latency() {
  for (int spin : {100, 0}) {
    ThreadPool pool(2, spin);
    auto empty = [](void*, int64_t, int64_t) {};
    double hot = time_it([&] { pool.parallel_for(2, empty, nullptr); });
    // Cold: the worker sleeps (sleep 2 ms between calls, longer than the spin).
    double cold = 0;
    for (int i = 0; i < 50; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      auto t = Clock::now();
      pool.parallel_for(2, empty, nullptr);
      cold += seconds_since(t);
    }
    std::printf("pool spin_us=%d: empty parallel_for %.2f us back to back, %.1f us after the worker slept\n", spin,
                hot * 1e6, cold / 50 * 1e6);
  }
  // Idle cost: CPU time an idle 2-thread pool burns in 200 ms.
  {
    ThreadPool pool(2);
    pool.parallel_for(2, [](void*, int64_t, int64_t) {}, nullptr);
    timespec a, b;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &a);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &b);
    double cpu = (b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) * 1e-9;
    std::printf("pool idle: %.2f ms CPU in 200 ms wall\n", cpu * 1e3);
  }
  // Small GEMMs: inline vs pooled, to place the parallel threshold.
  {
    ThreadPool pool(2);
    for (int s : {16, 32, 48, 64, 96, 128}) {
      MatmulDesc d = plain(s, s, s);
      Buffers buf(d);
      Gemm g(d);
      double t1 = time_it([&] { g.run(buf.a.data(), buf.b.data(), buf.c.data()); });
      std::printf("small %dx%dx%d (%.0f kFLOP): one thread %.2f us\n", s, s, s, 2.0 * s * s * s * 1e-3, t1 * 1e6);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "--candidate") return child(argv[2]);
  if (argc == 2 && std::string(argv[1]) == "--pool") {
    pool_latency();
    return 0;
  }
  const char* only = argc == 2 ? argv[1] : nullptr;
  const bool bf16_only = only && std::string(only) == "--bf16";
  std::vector<std::pair<std::string, std::vector<std::string>>> cands = {
      {"napkin", {"OPENBLAS_NUM_THREADS=1"}},  // OMP_NUM_THREADS unset: napkin must cope
      {"openblas-mt", {"OPENBLAS_NUM_THREADS=2", "OMP_NUM_THREADS=1"}},
      {"openblas-pool", {"OPENBLAS_NUM_THREADS=1", "OMP_NUM_THREADS=1"}},
      {"dnnl-sgemm", {"OPENBLAS_NUM_THREADS=1", "OMP_NUM_THREADS=2"}},
      {"dnnl-matmul", {"OPENBLAS_NUM_THREADS=1", "OMP_NUM_THREADS=2"}},
      {"dnnl-pool", {"OPENBLAS_NUM_THREADS=1", "OMP_NUM_THREADS=1"}},
      {"bf16-napkin", {"OPENBLAS_NUM_THREADS=1"}},
      {"bf16-prim", {"OPENBLAS_NUM_THREADS=1"}},
      {"bf16-panels", {"OPENBLAS_NUM_THREADS=1"}},
      {"bf16-matmul", {"OPENBLAS_NUM_THREADS=1", "OMP_NUM_THREADS=2"}},
  };
  if (!only) pool_latency();
  std::fflush(stdout);
  for (auto& [name, env] : cands) {
    if (bf16_only ? name != "napkin" && !is_bf16(name) : only && name != only) continue;
    std::vector<std::string> e;
    for (char** p = environ; *p; ++p)
      if (std::strncmp(*p, "OPENBLAS_NUM_THREADS=", 21) && std::strncmp(*p, "OMP_NUM_THREADS=", 16)) e.push_back(*p);
    e.insert(e.end(), env.begin(), env.end());
    std::vector<char*> ep;
    for (auto& s : e) ep.push_back(s.data());
    ep.push_back(nullptr);
    std::string arg0 = "/proc/self/exe", a1 = "--candidate", a2 = name;
    char* args[] = {arg0.data(), a1.data(), a2.data(), nullptr};
    pid_t pid;
    if (posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, args, ep.data()) != 0) return 1;
    int st;
    waitpid(pid, &st, 0);
  }
  return 0;
}
