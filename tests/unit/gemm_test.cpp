// runtime::ThreadPool and runtime::Gemm: the pool's split, coverage, nesting
// and shutdown; the matmul against a plain double loop on many layouts.
#include <dirent.h>

#include <atomic>
#include <cstring>
#include <cmath>
#include <doctest/doctest.h>
#include <limits>
#include <mutex>
#include <random>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "runtime/error.h"
#include "runtime/float_formats.h"
#include "runtime/gemm.h"
#include "runtime/thread_pool.h"

using napkin::runtime::Gemm;
using napkin::runtime::GemmType;
using napkin::runtime::GemmTypes;
using napkin::runtime::LowPrecisionKernel;
using napkin::runtime::MatmulDesc;
using napkin::runtime::ThreadPool;

namespace {

int threads_in_process() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
    closedir(d);
  }
  return n;
}

}  // namespace

TEST_CASE("thread pool: every index exactly once, for many n and thread counts") {
  for (int threads : {1, 2, 3, 4, 7}) {
    ThreadPool pool(threads);
    CHECK(pool.num_threads() == threads);
    for (int64_t n : {0, 1, 2, 3, 5, 6, 7, 8, 100, 1001, 65536}) {
      std::vector<std::atomic<int>> hits(size_t(std::max<int64_t>(n, 1)));
      for (auto& h : hits) h = 0;
      pool.parallel_for(n, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) hits[size_t(i)]++;
      });
      for (int64_t i = 0; i < n; ++i) REQUIRE(hits[size_t(i)] == 1);
    }
  }
}

TEST_CASE("thread pool: deterministic near-equal contiguous chunks") {
  ThreadPool pool(3);
  for (int64_t n : {3, 10, 11, 12, 1000}) {
    for (int rep = 0; rep < 20; ++rep) {
      std::mutex mu;
      std::set<std::pair<int64_t, int64_t>> chunks;
      pool.parallel_for(n, [&](int64_t b, int64_t e) {
        std::lock_guard<std::mutex> g(mu);
        chunks.insert({b, e});
      });
      std::set<std::pair<int64_t, int64_t>> want;
      for (int i = 0; i < 3; ++i) want.insert(ThreadPool::chunk(n, 3, i));
      REQUIRE(chunks == want);
    }
  }
  // The split itself: first n % parts chunks one longer, contiguous, covering.
  CHECK(ThreadPool::chunk(10, 3, 0) == std::pair<int64_t, int64_t>{0, 4});
  CHECK(ThreadPool::chunk(10, 3, 1) == std::pair<int64_t, int64_t>{4, 7});
  CHECK(ThreadPool::chunk(10, 3, 2) == std::pair<int64_t, int64_t>{7, 10});
  CHECK(ThreadPool::chunk(2, 4, 3) == std::pair<int64_t, int64_t>{2, 2});
}

TEST_CASE("thread pool: n < threads and one thread run inline on the caller") {
  ThreadPool pool(4);
  auto me = std::this_thread::get_id();
  int calls = 0;
  bool on_caller = true;
  pool.parallel_for(3, [&](int64_t b, int64_t e) {
    ++calls;
    on_caller = on_caller && std::this_thread::get_id() == me && b == 0 && e == 3;
  });
  CHECK(calls == 1);
  CHECK(on_caller);
  ThreadPool one(1);
  calls = 0;
  one.parallel_for(1000, [&](int64_t b, int64_t e) {
    ++calls;
    CHECK(b == 0);
    CHECK(e == 1000);
    CHECK(std::this_thread::get_id() == me);
  });
  CHECK(calls == 1);
}

TEST_CASE("thread pool: the caller is worker 0 and chunks run on distinct threads") {
  ThreadPool pool(2);
  auto me = std::this_thread::get_id();
  std::thread::id ids[2];
  pool.parallel_for(2, [&](int64_t b, int64_t) { ids[b] = std::this_thread::get_id(); });
  CHECK(ids[0] == me);
  CHECK(ids[1] != me);
}

TEST_CASE("thread pool: nested and concurrent calls are safe and keep the split") {
  ThreadPool pool(2);
  std::vector<std::atomic<int>> hits(100 * 50);
  for (auto& h : hits) h = 0;
  pool.parallel_for(100, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      std::vector<std::pair<int64_t, int64_t>> inner;
      pool.parallel_for(50, [&](int64_t ib, int64_t ie) {
        inner.push_back({ib, ie});  // nested: runs on this thread, chunk by chunk
        for (int64_t j = ib; j < ie; ++j) hits[size_t(i * 50 + j)]++;
      });
      REQUIRE(inner.size() == 2);
      REQUIRE(inner[0] == ThreadPool::chunk(50, 2, 0));
      REQUIRE(inner[1] == ThreadPool::chunk(50, 2, 1));
    }
  });
  for (auto& h : hits) REQUIRE(h == 1);

  // Two outside threads sharing one pool.
  std::atomic<int64_t> sum{0};
  auto work = [&] {
    for (int r = 0; r < 200; ++r)
      pool.parallel_for(64, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) sum += i;
      });
  };
  std::thread t1(work), t2(work);
  t1.join();
  t2.join();
  CHECK(sum == 2 * 200 * (63 * 64 / 2));
}

TEST_CASE("thread pool: exceptions propagate after the join - the pool stays usable") {
  ThreadPool pool(2);
  CHECK_THROWS_AS(pool.parallel_for(10, [](int64_t b, int64_t) {
    if (b > 0) throw std::runtime_error("worker chunk");
  }),
                  std::runtime_error);
  CHECK_THROWS_AS(pool.parallel_for(10, [](int64_t b, int64_t) {
    if (b == 0) throw std::runtime_error("caller chunk");
  }),
                  std::runtime_error);
  std::atomic<int> n{0};
  pool.parallel_for(10, [&](int64_t b, int64_t e) { n += int(e - b); });
  CHECK(n == 10);
}

TEST_CASE("thread pool: idle workers sleep and destruction joins them") {
  int before = threads_in_process();
  {
    ThreadPool pool(3, /*spin_us=*/0);
    CHECK(threads_in_process() == before + 2);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // workers asleep on the futex
    std::atomic<int> n{0};
    pool.parallel_for(3, [&](int64_t b, int64_t e) { n += int(e - b); });
    CHECK(n == 3);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  { ThreadPool never_used(4); }  // destroyed while its workers still spin
  for (int i = 0; i < 20; ++i) {
    ThreadPool p(2);
    p.parallel_for(2, [](int64_t, int64_t) {});
  }
  CHECK(threads_in_process() == before);
  CHECK(napkin::runtime::default_thread_count() >= 1);
}

// ---------------------------------------------------------------- gemm

namespace {

struct Case {
  MatmulDesc d;
  int64_t a_size, b_size, c_size;
};

int64_t span(const std::vector<int64_t>& batch, const std::vector<int64_t>& bs, int64_t r, int64_t rs, int64_t c,
             int64_t cs) {
  if (r == 0 || c == 0) return 1;
  int64_t off = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    if (batch[i] == 0) return 1;
    off += (batch[i] - 1) * bs[i];
  }
  return off + (r - 1) * rs + (c - 1) * cs + 1;
}

// Reference: C[idx] = sum_k A B in double, into a copy of c (elements no
// entry covers, e.g. the padding of c_m_stride > n, keep their values), and
// which elements are covered.
template <class T>
std::vector<double> reference(const MatmulDesc& d, const std::vector<T>& a, const std::vector<T>& b,
                              const std::vector<T>& c, std::vector<char>* covered) {
  std::vector<double> out(c.begin(), c.end());
  covered->assign(c.size(), 0);
  int64_t nb = 1;
  for (auto s : d.batch) nb *= s;
  for (int64_t idx = 0; idx < nb; ++idx) {
    int64_t oa = 0, ob = 0, oc = 0, rest = idx;
    for (size_t i = d.batch.size(); i-- > 0;) {
      int64_t j = rest % d.batch[i];
      rest /= d.batch[i];
      oa += j * d.a_batch_stride[i], ob += j * d.b_batch_stride[i], oc += j * d.c_batch_stride[i];
    }
    for (int64_t i = 0; i < d.m; ++i)
      for (int64_t j = 0; j < d.n; ++j) {
        double s = 0;
        for (int64_t p = 0; p < d.k; ++p)
          s += double(a[size_t(oa + i * d.a_m_stride + p * d.a_k_stride)]) *
               double(b[size_t(ob + p * d.b_k_stride + j * d.b_n_stride)]);
        out[size_t(oc + i * d.c_m_stride + j)] = s;
        (*covered)[size_t(oc + i * d.c_m_stride + j)] = 1;
      }
  }
  return out;
}

template <class T>
void check_case(const MatmulDesc& d, ThreadPool& pool, uint32_t seed) {
  CAPTURE(d.to_string());
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<T> a(size_t(span(d.batch, d.a_batch_stride, d.m, d.a_m_stride, d.k, d.a_k_stride)));
  std::vector<T> b(size_t(span(d.batch, d.b_batch_stride, d.k, d.b_k_stride, d.n, d.b_n_stride)));
  std::vector<T> c0(size_t(span(d.batch, d.c_batch_stride, d.m, d.c_m_stride, d.n, 1)), T(-7));
  for (auto& x : a) x = T(u(rng));
  for (auto& x : b) x = T(u(rng));
  std::vector<char> covered;
  auto ref = reference(d, a, b, c0, &covered);
  // Covered elements start as NaN (C is overwritten, never read); the
  // padding holds -7 and must keep it.
  for (size_t i = 0; i < c0.size(); ++i)
    if (covered[i]) c0[i] = std::numeric_limits<T>::quiet_NaN();
  const GemmType t = std::is_same_v<T, float> ? GemmType::F32 : GemmType::F64;
  Gemm g(d, {t, t});
  const double rel = std::is_same_v<T, float> ? 1e-5 : 1e-13;
  const double tol = rel * std::sqrt(double(std::max<int64_t>(d.k, 1)));
  for (int pass = 0; pass < 2; ++pass) {
    std::vector<T> c = c0;
    if (pass == 0) g.run(a.data(), b.data(), c.data(), pool);
    else g.run(a.data(), b.data(), c.data());  // the calling thread alone
    for (size_t i = 0; i < c.size(); ++i) {
      double want = ref[i];
      if (!(std::fabs(double(c[i]) - want) <= tol * (1.0 + std::fabs(want)))) {
        CAPTURE(i);
        CAPTURE(want);
        CAPTURE(double(c[i]));
        CAPTURE(pass);
        FAIL("mismatch");
      }
    }
  }
}

MatmulDesc strided(std::vector<int64_t> batch, std::vector<int64_t> sa, std::vector<int64_t> sb,
                   std::vector<int64_t> sc, int64_t m, int64_t n, int64_t k, int64_t am, int64_t ak, int64_t bk,
                   int64_t bn, int64_t cm) {
  MatmulDesc d;
  d.batch = std::move(batch), d.a_batch_stride = std::move(sa), d.b_batch_stride = std::move(sb);
  d.c_batch_stride = std::move(sc);
  d.m = m, d.n = n, d.k = k, d.a_m_stride = am, d.a_k_stride = ak, d.b_k_stride = bk, d.b_n_stride = bn;
  d.c_m_stride = cm;
  return d;
}

std::vector<MatmulDesc> gemm_cases() {
  std::vector<MatmulDesc> v;
  // Plain, all four transpose combinations, many sizes incl. 1 and 0.
  const int64_t sizes[][3] = {{1, 1, 1},    {1, 7, 5},     {7, 1, 5},   {5, 7, 1},   {1, 1, 300}, {3, 4, 0},
                              {0, 4, 3},    {4, 0, 3},     {17, 33, 9}, {64, 64, 64}, {65, 31, 130},
                              {128, 10, 257}, {257, 129, 33}, {2, 600, 3}, {600, 2, 3}, {513, 1, 64}};
  for (auto& s : sizes)
    for (int t = 0; t < 4; ++t) v.push_back(MatmulDesc::plain(s[0], s[1], s[2], t & 1, t & 2));
  // Padded rows: lda > k, ldb > n, c_m_stride > n.
  v.push_back(strided({}, {}, {}, {}, 37, 21, 19, 24, 1, 30, 1, 29));
  v.push_back(strided({}, {}, {}, {}, 37, 21, 19, 1, 40, 1, 25, 22));
  // Batched contiguous, batch of 3 (does not divide 2 threads) and 4.
  v.push_back(strided({3}, {50 * 20}, {20 * 30}, {50 * 30}, 50, 30, 20, 20, 1, 30, 1, 30));
  v.push_back(strided({4}, {50 * 20}, {20 * 30}, {50 * 30}, 50, 30, 20, 20, 1, 30, 1, 30));
  v.push_back(strided({1}, {0}, {0}, {0}, 70, 30, 20, 20, 1, 30, 1, 30));
  v.push_back(strided({0}, {10}, {10}, {10}, 2, 2, 2, 2, 1, 2, 1, 2));
  // Broadcast B (stride 0): x[b] @ w, and broadcast A.
  v.push_back(strided({5}, {33 * 17}, {0}, {33 * 9}, 33, 9, 17, 17, 1, 9, 1, 9));
  v.push_back(strided({2, 3}, {0, 0}, {3 * 17 * 9, 17 * 9}, {3 * 33 * 9, 33 * 9}, 33, 9, 17, 17, 1, 9, 1, 9));
  // Attention in a fused qkv buffer [B, T, 3, H, dh]: batch (b, h), strides
  // (T*3*H*dh, dh); q k^T and p v, out written as [b, t, h, dh].
  {
    const int64_t B = 3, T = 12, H = 2, dh = 8, row = 3 * H * dh;
    v.push_back(strided({B, H}, {T * row, dh}, {T * row, dh}, {H * T * T, T * T}, T, T, dh, row, 1, 1, row, T));
    v.push_back(strided({B, H}, {H * T * T, T * T}, {T * row, dh}, {T * H * dh, dh}, T, dh, T, T, 1, row, 1, H * dh));
  }
  // Non-uniform, mergeable and size-1 batch dims mixed.
  v.push_back(strided({2, 1, 3}, {1000, 7, 100}, {0, 5, 64}, {3 * 40, 999, 40}, 5, 8, 6, 6, 1, 1, 6, 8));
  // Both A strides non-unit (packed path) and overlapping broadcast rows (a_m_stride 0).
  v.push_back(strided({}, {}, {}, {}, 9, 7, 5, 10, 2, 7, 1, 7));
  v.push_back(strided({}, {}, {}, {}, 9, 7, 5, 0, 1, 7, 1, 7));
  v.push_back(strided({}, {}, {}, {}, 9, 7, 5, 5, 1, 0, 1, 7));
  return v;
}

// Low precision: operands held as codes (bf16 or f16), C as codes too or
// f32; the reference sums the decoded values in double.
uint16_t encode16(GemmType t, double x) {
  return t == GemmType::BF16 ? napkin::runtime::float_to_bf16_bits(float(x))
                             : napkin::runtime::float_to_f16_bits(float(x));
}
double decode16(GemmType t, uint16_t x) {
  return t == GemmType::BF16 ? napkin::runtime::bf16_bits_to_float(x) : napkin::runtime::f16_bits_to_float(x);
}

void check_low_case(const MatmulDesc& d, GemmTypes types, LowPrecisionKernel kernel, ThreadPool& pool,
                    uint32_t seed) {
  CAPTURE(d.to_string());
  CAPTURE(int(types.ab));
  CAPTURE(int(types.c));
  CAPTURE(int(kernel));
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<uint16_t> a(size_t(span(d.batch, d.a_batch_stride, d.m, d.a_m_stride, d.k, d.a_k_stride)));
  std::vector<uint16_t> b(size_t(span(d.batch, d.b_batch_stride, d.k, d.b_k_stride, d.n, d.b_n_stride)));
  for (auto& x : a) x = encode16(types.ab, u(rng));
  for (auto& x : b) x = encode16(types.ab, u(rng));
  std::vector<double> ad(a.size()), bd(b.size());
  for (size_t i = 0; i < a.size(); ++i) ad[i] = decode16(types.ab, a[i]);
  for (size_t i = 0; i < b.size(); ++i) bd[i] = decode16(types.ab, b[i]);
  const size_t nc = size_t(span(d.batch, d.c_batch_stride, d.m, d.c_m_stride, d.n, 1));
  std::vector<char> covered;
  auto ref = reference(d, ad, bd, std::vector<double>(nc, -7.0), &covered);
  const bool low_c = types.c != GemmType::F32;
  // f32 accumulation as in the fp32 test, plus one rounding of C to its type.
  const double round = !low_c ? 0 : types.c == GemmType::BF16 ? 1.0 / 256 : 1.0 / 2048;
  const double acc = 1e-5 * std::sqrt(double(std::max<int64_t>(d.k, 1)));
  Gemm g(d, types, kernel);
  for (int pass = 0; pass < 2; ++pass) {
    std::vector<uint16_t> c16(nc, encode16(types.c == GemmType::F32 ? types.ab : types.c, -7.0));
    std::vector<float> c32(nc, -7.0f);
    for (size_t i = 0; i < nc; ++i)
      if (covered[i]) c32[i] = std::numeric_limits<float>::quiet_NaN(), c16[i] = 0x7FC0;  // NaN in both
    void* c = low_c ? static_cast<void*>(c16.data()) : static_cast<void*>(c32.data());
    if (pass == 0) g.run(a.data(), b.data(), c, pool);
    else g.run(a.data(), b.data(), c);  // the calling thread alone
    for (size_t i = 0; i < nc; ++i) {
      double got = low_c ? decode16(types.c, c16[i]) : double(c32[i]);
      double want = ref[i];
      if (!(std::fabs(got - want) <= acc * (1.0 + std::fabs(want)) + round * std::fabs(want))) {
        CAPTURE(i);
        CAPTURE(want);
        CAPTURE(got);
        CAPTURE(pass);
        FAIL("mismatch");
      }
    }
  }
}

}  // namespace

TEST_CASE("gemm: fp32 and fp64 against a double loop, many layouts, 1-4 threads") {
  ThreadPool p1(1), p2(2), p3(3);
  uint32_t seed = 1;
  for (auto& d : gemm_cases()) {
    for (ThreadPool* p : {&p1, &p2, &p3}) {
      check_case<float>(d, *p, seed++);
      check_case<double>(d, *p, seed++);
    }
  }
}

TEST_CASE("gemm: model shapes (mlp, gpt attention) against the double loop") {
  ThreadPool pool(2);
  check_case<float>(MatmulDesc::plain(512, 1024, 784), pool, 7);
  check_case<float>(MatmulDesc::plain(784, 1024, 512, true, false), pool, 8);
  check_case<float>(MatmulDesc::plain(512, 10, 1024, false, true), pool, 9);
  const int64_t T = 128, row = 768;
  check_case<float>(
      strided({2, 4}, {T * row, 64}, {T * row, 64}, {4 * T * T, T * T}, T, T, 64, row, 1, 1, row, T), pool, 10);
}

TEST_CASE("gemm: results do not depend on the run (same split, same bits)") {
  ThreadPool pool(2);
  MatmulDesc d = MatmulDesc::plain(300, 200, 500);
  std::vector<float> a(300 * 500), b(500 * 200), c1(300 * 200), c2(300 * 200);
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1, 1);
  for (auto& x : a) x = u(rng);
  for (auto& x : b) x = u(rng);
  Gemm g(d);
  g.run(a.data(), b.data(), c1.data(), pool);
  for (int i = 0; i < 5; ++i) {
    g.run(a.data(), b.data(), c2.data(), pool);
    REQUIRE(c1 == c2);
  }
}

TEST_CASE("gemm: starts no threads of its own (oneDNN's OpenMP stays serial)") {
  ThreadPool pool(2);
  int before = threads_in_process();
  MatmulDesc d = MatmulDesc::plain(256, 256, 256);
  std::vector<float> a(256 * 256, 1.0f), b(256 * 256, 1.0f), c(256 * 256);
  Gemm g(d);
  for (int i = 0; i < 3; ++i) g.run(a.data(), b.data(), c.data(), pool);
  g.run(a.data(), b.data(), c.data());
  CHECK(c[0] == 256.0f);
  CHECK(threads_in_process() == before);
}

TEST_CASE("gemm: bad descriptors are errors") {
  using napkin::runtime::Error;
  MatmulDesc d = MatmulDesc::plain(4, 4, 4);
  d.batch = {2};
  CHECK_THROWS_AS(Gemm{d}, Error);  // missing batch strides
  d.a_batch_stride = d.b_batch_stride = {16};
  d.c_batch_stride = {0};
  CHECK_THROWS_AS(Gemm{d}, Error);  // C broadcast over a batch
  MatmulDesc e = MatmulDesc::plain(4, 4, 4);
  e.c_m_stride = 3;
  CHECK_THROWS_AS(Gemm{e}, Error);  // overlapping rows of C
  MatmulDesc f = MatmulDesc::plain(4, -1, 4);
  CHECK_THROWS_AS(Gemm{f}, Error);
}

TEST_CASE("gemm: bf16 and f16 operands (f32 accumulation) against a double loop, many layouts, both kernels") {
  ThreadPool p1(1), p2(2), p3(3);
  uint32_t seed = 100;
  const GemmTypes types[] = {{GemmType::BF16, GemmType::BF16}, {GemmType::BF16, GemmType::F32},
                             {GemmType::F16, GemmType::F16}, {GemmType::F16, GemmType::F32}};
  for (auto& d : gemm_cases())
    for (ThreadPool* p : {&p1, &p2, &p3})
      for (GemmTypes t : types)
        for (LowPrecisionKernel kernel : {LowPrecisionKernel::Auto, LowPrecisionKernel::Primitive, LowPrecisionKernel::F32Panels})
          check_low_case(d, t, kernel, *p, seed++);
}

TEST_CASE("gemm: bf16 model shapes take the oneDNN primitive and agree with the double loop") {
  ThreadPool pool(2);
  const int64_t T = 128, row = 768;
  const MatmulDesc shapes[] = {
      MatmulDesc::plain(512, 1024, 784), MatmulDesc::plain(784, 1024, 512, true, false),
      MatmulDesc::plain(512, 10, 1024, false, true),
      strided({2, 4}, {T * row, 64}, {T * row, 64}, {4 * T * T, T * T}, T, T, 64, row, 1, 1, row, T)};
  uint32_t seed = 7;
  for (const MatmulDesc& d : shapes) {
    CAPTURE(d.to_string());
    CHECK(Gemm(d, {GemmType::BF16, GemmType::BF16}, LowPrecisionKernel::Primitive).uses_primitive(2));
    CHECK_FALSE(Gemm(d, {GemmType::BF16, GemmType::BF16}, LowPrecisionKernel::F32Panels).uses_primitive(2));
    CHECK_FALSE(Gemm(d, {GemmType::F16, GemmType::F16}).uses_primitive(2));  // no f16 matmul in oneDNN here
    // (Both C types with both kernels run on every small layout above; here
    // one each keeps the double reference loop's time down.)
    check_low_case(d, {GemmType::BF16, GemmType::BF16}, LowPrecisionKernel::Primitive, pool, seed++);
    check_low_case(d, {GemmType::BF16, GemmType::F32}, LowPrecisionKernel::F32Panels, pool, seed++);
  }
}

TEST_CASE("gemm: a bf16 product of one term is exact, its bf16 result rounded to nearest even") {
  // k = 1: C = a * b exactly in f32 (8 x 8 significant bits), so C in bf16
  // must be float_to_bf16_bits(a * b), ties included, whichever kernel.
  ThreadPool pool(2);
  const int64_t m = 64, n = 96;
  std::mt19937 rng(5);
  std::vector<uint16_t> a(m), b(n);
  for (auto& x : a) x = uint16_t(0x3C00 + rng() % 0x800);  // |a| in [2^-7, 2^9), b of both signs
  for (auto& x : b) x = uint16_t((rng() & 1 ? 0x8000 : 0) | (0x3C00 + rng() % 0x800));
  for (LowPrecisionKernel kernel : {LowPrecisionKernel::Primitive, LowPrecisionKernel::F32Panels}) {
    CAPTURE(int(kernel));
    Gemm g(MatmulDesc::plain(m, n, 1), {GemmType::BF16, GemmType::BF16}, kernel);
    std::vector<uint16_t> c(m * n);
    g.run(a.data(), b.data(), c.data(), pool);
    int ties = 0;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        float exact = napkin::runtime::bf16_bits_to_float(a[i]) * napkin::runtime::bf16_bits_to_float(b[j]);
        uint32_t bits;
        std::memcpy(&bits, &exact, 4);
        ties += (bits & 0xFFFF) == 0x8000;
        REQUIRE(c[size_t(i * n + j)] == napkin::runtime::float_to_bf16_bits(exact));
      }
    CHECK(ties > 10);  // the rounding case that matters was met
  }
}

TEST_CASE("gemm: bf16 through the pool is deterministic and starts no threads") {
  ThreadPool pool(2);
  int before = threads_in_process();
  MatmulDesc d = MatmulDesc::plain(300, 200, 500);
  std::vector<uint16_t> a(300 * 500), b(500 * 200), c1(300 * 200), c2(300 * 200);
  std::mt19937 rng(3);
  for (auto& x : a) x = encode16(GemmType::BF16, std::uniform_real_distribution<double>(-1, 1)(rng));
  for (auto& x : b) x = encode16(GemmType::BF16, std::uniform_real_distribution<double>(-1, 1)(rng));
  Gemm g(d, {GemmType::BF16, GemmType::BF16});
  g.prepare(pool.num_threads());
  g.run(a.data(), b.data(), c1.data(), pool);
  for (int i = 0; i < 5; ++i) {
    g.run(a.data(), b.data(), c2.data(), pool);
    REQUIRE(c1 == c2);
  }
  CHECK(threads_in_process() == before);
}

TEST_CASE("gemm: element types it cannot take are errors") {
  using napkin::runtime::Error;
  MatmulDesc d = MatmulDesc::plain(4, 4, 4);
  CHECK_THROWS_AS(Gemm(d, {GemmType::F32, GemmType::BF16}), Error);
  CHECK_THROWS_AS(Gemm(d, {GemmType::BF16, GemmType::F16}), Error);
  CHECK_THROWS_AS(Gemm(d, {GemmType::F64, GemmType::F32}), Error);
  CHECK_THROWS_AS(napkin::runtime::gemm_type(napkin::runtime::DType::I32), Error);
  std::vector<double> x(16);
  Gemm g(d, {GemmType::BF16, GemmType::F32});
  CHECK_THROWS_AS(g.run(x.data(), x.data(), x.data()), Error);  // typed run of the wrong type
}

TEST_CASE("gemm: sum_b_over_k sums B's rows (a bias gradient) in f32, bf16 and f16, plain and transposed, any thread count") {
  // B [k, n] row-major (b_k_stride = n + pad) or transposed (b_n_stride = k + pad); each column's exact sum is
  // compared, and the bits must not depend on the thread count.
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (GemmType type : {GemmType::F32, GemmType::BF16, GemmType::F16})
    for (bool transposed : {false, true})
      for (auto [k, n] : {std::pair<int64_t, int64_t>{1, 1}, {37, 5}, {300, 700}, {8, 1}}) {
        CAPTURE(static_cast<int>(type));
        CAPTURE(transposed);
        CAPTURE(k);
        CAPTURE(n);
        MatmulDesc d = MatmulDesc::plain(3, n, k);
        if (transposed) d.b_n_stride = k + 3, d.b_k_stride = 1;
        else d.b_k_stride = n + 2, d.b_n_stride = 1;
        const int64_t span = transposed ? (n - 1) * d.b_n_stride + k : (k - 1) * d.b_k_stride + n;
        std::vector<float> values(static_cast<size_t>(span));
        std::vector<uint16_t> narrow(values.size());
        for (size_t i = 0; i < values.size(); ++i) {
          float x = dist(rng);
          if (type == GemmType::BF16) narrow[i] = napkin::runtime::float_to_bf16_bits(x), x = napkin::runtime::bf16_bits_to_float(narrow[i]);
          if (type == GemmType::F16) narrow[i] = napkin::runtime::float_to_f16_bits(x), x = napkin::runtime::f16_bits_to_float(narrow[i]);
          values[i] = x;
        }
        const void* b = type == GemmType::F32 ? static_cast<const void*>(values.data()) : narrow.data();
        std::vector<float> first;
        for (int threads : {1, 2, 3}) {
          ThreadPool pool(threads);
          std::vector<float> sums(static_cast<size_t>(n), -1.0f);
          napkin::runtime::sum_b_over_k(d, type, b, sums.data(), pool);
          for (int64_t j = 0; j < n; ++j) {
            double want = 0;
            for (int64_t q = 0; q < k; ++q) want += values[static_cast<size_t>(q * d.b_k_stride + j * d.b_n_stride)];
            CHECK(sums[j] == static_cast<float>(want));  // summed in double, rounded once
          }
          if (first.empty()) first = sums;
          CHECK(sums == first);
        }
      }
  ThreadPool pool(1);
  float out = 0;
  double b = 1;
  CHECK_THROWS_AS(napkin::runtime::sum_b_over_k(MatmulDesc::plain(1, 1, 1), GemmType::F64, &b, &out, pool),
                  napkin::runtime::Error);
}
