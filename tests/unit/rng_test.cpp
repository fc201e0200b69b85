// The runtime RNG: Philox4x32-10 against Random123's known answers, the
// stream layout, FNV-1a, and the statistics of the derived draws.
#include <doctest/doctest.h>

#include <cmath>
#include <numbers>
#include <set>
#include <stdexcept>
#include <vector>

#include "runtime/init.h"
#include "runtime/rng.h"
#include "runtime/thread_pool.h"

using napkin::runtime::philox4x32_10;
using napkin::runtime::Rng;
using napkin::runtime::stream_for_name;

TEST_CASE("rng: Philox4x32-10 matches Random123's known-answer vectors") {
  // Random123 tests/kat_vectors, the three "philox4x32 10" lines: counter, key -> output.
  using C = std::array<uint32_t, 4>;
  using K = std::array<uint32_t, 2>;
  CHECK(philox4x32_10(C{0, 0, 0, 0}, K{0, 0}) == C{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8});
  CHECK(philox4x32_10(C{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, K{0xffffffff, 0xffffffff}) ==
        C{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd});
  CHECK(philox4x32_10(C{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, K{0xa4093822, 0x299f31d0}) ==
        C{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1});
}

TEST_CASE("rng: a generator walks the blocks of (key = seed, counter = {block, stream})") {
  const uint64_t seed = 0x299f31d0a4093822ull, stream = 0x0370734413198a2eull;
  Rng r(seed, stream);
  for (uint32_t block = 0; block < 3; ++block) {
    auto want = philox4x32_10({block, 0, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0});
    for (int i = 0; i < 4; ++i) CHECK(r.next_u32() == want[i]);
  }
  // Seed 0, stream 0 starts with the all-zeros known answer.
  Rng zero(0, 0);
  CHECK(zero.next_u32() == 0x6627e8d5u);
  CHECK(zero.next_u32() == 0xe169c58du);
}

TEST_CASE("rng: uniform01 is (a * 2^20 + (b >> 12) + 0.5) * 2^-52 from two words") {
  Rng words(7, 11), u(7, 11);
  for (int i = 0; i < 1000; ++i) {
    uint64_t a = words.next_u32(), b = words.next_u32();
    double want = (static_cast<double>((a << 20) | (b >> 12)) + 0.5) / 4503599627370496.0;
    double got = u.uniform01();
    REQUIRE(got == want);
    REQUIRE(got > 0.0);
    REQUIRE(got < 1.0);
  }
  // The extremes stay strictly inside (0, 1).
  CHECK(0.5 * 0x1p-52 > 0.0);
  CHECK((4503599627370495.0 + 0.5) * 0x1p-52 < 1.0);
}

TEST_CASE("rng: normal() is Box-Muller on two uniforms and uses exactly four words") {
  Rng a(3, 5), b(3, 5);
  double u1 = a.uniform01(), u2 = a.uniform01();
  CHECK(b.normal() == std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586476925286766559 * u2));
  // Both consumed one block: the next word is word 0 of block 1.
  CHECK(b.next_u32() == philox4x32_10({1, 0, 5, 0}, {3, 0})[0]);
}

TEST_CASE("rng: 100k normals have mean 0 and std 1 within 4 standard errors") {
  const int n = 100000;
  Rng r(42, stream_for_name("w"));
  double sum = 0, sum2 = 0;
  for (int i = 0; i < n; ++i) {
    double z = r.normal();
    sum += z;
    sum2 += z * z;
  }
  double mean = sum / n;
  double sd = std::sqrt(sum2 / n - mean * mean);
  CHECK(std::fabs(mean) < 4.0 / std::sqrt(n));            // se of the mean: 1/sqrt(n)
  CHECK(std::fabs(sd - 1.0) < 4.0 / std::sqrt(2.0 * n));  // se of the std: 1/sqrt(2n)
}

TEST_CASE("rng: trunc_normal stays in [lo, hi] with the truncated normal's mean") {
  const int n = 100000;
  const double lo = -0.5, hi = 1.5;
  Rng r(1, 2);
  double sum = 0, min = 1e9, max = -1e9;
  for (int i = 0; i < n; ++i) {
    double x = r.trunc_normal(0.0, 1.0, lo, hi);
    sum += x;
    min = std::min(min, x);
    max = std::max(max, x);
  }
  CHECK(min >= lo);
  CHECK(max <= hi);
  CHECK(min < lo + 0.01);  // the whole interval is used
  CHECK(max > hi - 0.01);
  auto pdf = [](double x) { return std::exp(-0.5 * x * x) / std::sqrt(2 * std::numbers::pi); };
  auto cdf = [](double x) { return 0.5 * (1 + std::erf(x / std::sqrt(2.0))); };
  double want = (pdf(lo) - pdf(hi)) / (cdf(hi) - cdf(lo));  // about 0.345
  CHECK(std::fabs(sum / n - want) < 4.0 / std::sqrt(n));
  // Mean and std shift and scale; bounds stay absolute.
  Rng s(9, 9);
  for (int i = 0; i < 1000; ++i) {
    double x = s.trunc_normal(10.0, 0.02, 9.99, 10.03);
    REQUIRE(x >= 9.99);
    REQUIRE(x <= 10.03);
  }
}

TEST_CASE("rng: trunc_normal rejects bad arguments and intervals without mass") {
  Rng r(0, 0);
  CHECK_THROWS_AS(r.trunc_normal(0, 0, -1, 1), std::invalid_argument);
  CHECK_THROWS_AS(r.trunc_normal(0, 1, 1, 1), std::invalid_argument);
  CHECK_THROWS_AS(r.trunc_normal(0, 1, 50, 51), std::runtime_error);
}

TEST_CASE("rng: FNV-1a 64 stream names, reproducible and distinct") {
  CHECK(stream_for_name("") == 0xcbf29ce484222325ull);
  CHECK(stream_for_name("a") == 0xaf63dc4c8601ec8cull);
  CHECK(stream_for_name("foobar") == 0x85944171f73967e8ull);
  std::set<uint64_t> streams;
  for (const char* name : {"w1", "w2", "blocks.0.w", "blocks.1.w", "b1"}) streams.insert(stream_for_name(name));
  CHECK(streams.size() == 5);

  Rng a(5, stream_for_name("w1")), b(5, stream_for_name("w1")), c(5, stream_for_name("w2")), d(6, stream_for_name("w1"));
  std::vector<uint32_t> wa, wb, wc, wd;
  for (int i = 0; i < 8; ++i) {
    wa.push_back(a.next_u32());
    wb.push_back(b.next_u32());
    wc.push_back(c.next_u32());
    wd.push_back(d.next_u32());
  }
  CHECK(wa == wb);
  CHECK(wa != wc);
  CHECK(wa != wd);
}

TEST_CASE("rng: seek(n) makes the next normal the stream's n-th, also after words already drawn") {
  Rng walk(11, 4);
  std::vector<double> normals;
  for (int i = 0; i < 40; ++i) normals.push_back(walk.normal());
  Rng jump(11, 4);
  jump.next_u32();  // mid-block: seek discards the rest of it
  for (int n : {17, 3, 39, 0}) {
    jump.seek(static_cast<uint64_t>(n));
    CHECK(jump.normal() == normals[static_cast<size_t>(n)]);
  }
}

TEST_CASE("init: normal weights drawn on a pool are the sequential draw's bits, for any thread count") {
  napkin::runtime::ParamInit normal;
  normal.kind = napkin::runtime::InitKind::Normal;
  normal.std = 0.02;
  const int64_t numel = (int64_t{1} << 16) + 12345;  // over the parallel threshold, not a multiple of any split
  const std::vector<double> alone = napkin::runtime::init_values(normal, "blocks.3.w", numel, 42);
  for (int threads : {1, 2, 3, 7}) {
    CAPTURE(threads);
    napkin::runtime::ThreadPool pool(threads);
    CHECK(napkin::runtime::init_values(normal, "blocks.3.w", numel, 42, &pool) == alone);
  }
  // The n-th value is the stream's n-th normal times std.
  Rng r(42, stream_for_name("blocks.3.w"));
  r.seek(70000);
  CHECK(alone[70000] == 0.02 * r.normal());
}
