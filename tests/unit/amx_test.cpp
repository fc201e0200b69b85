// runtime/amx.h: the packers against their definitions element by element
// (odd sizes, sources inside NaN-poisoned buffers whose poison must never be
// read), and the AMX tile product against a float64 product of the same bf16
// values, both plain and accumulating. The product's tests are skipped, with
// a message, on CPUs without AMX.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <tuple>
#include <utility>
#include <vector>

#include "runtime/amx.h"
#include "runtime/float_formats.h"

namespace amx = napkin::runtime::amx;
using napkin::runtime::float_to_bf16_bits;

namespace {

float widen(uint16_t x) {
  uint32_t u = uint32_t(x) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

constexpr uint16_t kNaN = 0x7FC1;  // a bf16 NaN: where it shows up, poison was read

// rows x cols of random bf16 values at row stride ld, inside a buffer full of NaN.
std::vector<uint16_t> poisoned(int64_t rows, int64_t cols, int64_t ld, std::mt19937& rng) {
  std::normal_distribution<float> normal;
  std::vector<uint16_t> buf(size_t(rows * ld + 8), kNaN);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) buf[size_t(r * ld + c)] = float_to_bf16_bits(normal(rng));
  return buf;
}

}  // namespace

TEST_CASE("amx packers: each layout holds the source's elements where its definition puts them, zeros elsewhere") {
  std::mt19937 rng(5);
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{37, 24}, {20, 40}, {16, 64}, {5, 3}, {130, 80}, {1, 2}}) {
    const int64_t ld = cols + 7;
    const std::vector<uint16_t> src = poisoned(rows, cols, ld, rng);
    auto at = [&](int64_t r, int64_t c) -> uint16_t { return r < rows && c < cols ? src[size_t(r * ld + c)] : 0; };
    INFO("rows ", rows, " cols ", cols);
    {  // A: the source itself, padded
      const int64_t pr = amx::round_up(rows, 16), pc = amx::round_up(cols, 32);
      std::vector<uint16_t> a(size_t(pr * pc), kNaN);
      amx::pack_a(src.data(), rows, cols, ld, a.data(), pr, pc);
      int bad = 0;
      for (int64_t r = 0; r < pr; ++r)
        for (int64_t c = 0; c < pc; ++c) bad += a[size_t(r * pc + c)] != at(r, c);
      CHECK(bad == 0);
    }
    {  // A of the transpose
      const int64_t pr = amx::round_up(cols, 16), pc = amx::round_up(rows, 32);
      std::vector<uint16_t> a(size_t(pr * pc), kNaN);
      amx::pack_a_transposed(src.data(), rows, cols, ld, a.data(), pr, pc);
      int bad = 0;
      for (int64_t r = 0; r < pr; ++r)
        for (int64_t c = 0; c < pc; ++c) bad += a[size_t(r * pc + c)] != at(c, r);
      CHECK(bad == 0);
    }
    {  // B of the source (k = rows, n = cols): VNNI, k pairs interleaved
      const int64_t kp = amx::round_up(rows, 32), np = amx::round_up(cols, 16);
      std::vector<uint16_t> b(size_t(kp * np), kNaN);
      amx::pack_b(src.data(), rows, cols, ld, b.data(), kp, np);
      int bad = 0;
      for (int64_t k = 0; k < kp; ++k)
        for (int64_t n = 0; n < np; ++n) bad += b[size_t((k / 2) * 2 * np + 2 * n + (k % 2))] != at(k, n);
      CHECK(bad == 0);
    }
    {  // B of the transpose (k = cols, n = rows)
      const int64_t kp = amx::round_up(cols, 32), np = amx::round_up(rows, 16);
      std::vector<uint16_t> b(size_t(kp * np), kNaN);
      amx::pack_b_transposed(src.data(), rows, cols, ld, b.data(), kp, np);
      int bad = 0;
      for (int64_t k = 0; k < kp; ++k)
        for (int64_t n = 0; n < np; ++n) bad += b[size_t((k / 2) * 2 * np + 2 * n + (k % 2))] != at(n, k);
      CHECK(bad == 0);
    }
  }
}

TEST_CASE("amx packers: an exact-size transposed A (an odd number of rows, as runtime::Gemm asks) stays inside its buffer") {
  std::mt19937 rng(7);
  const int64_t rows = 6, cols = 4, ld = 9;  // dst: cols rows of rows, plus one more zero row
  const std::vector<uint16_t> src = poisoned(rows, cols, ld, rng);
  const int64_t dst_rows = cols + 1, dst_cols = rows;
  std::vector<uint16_t> dst(size_t(dst_rows * dst_cols + 4), kNaN);
  amx::pack_a_transposed(src.data(), rows, cols, ld, dst.data(), dst_rows, dst_cols);
  for (int64_t r = 0; r < dst_rows; ++r)
    for (int64_t c = 0; c < dst_cols; ++c)
      CHECK(dst[size_t(r * dst_cols + c)] == (r < cols ? src[size_t(c * ld + r)] : 0));
  for (size_t i = size_t(dst_rows * dst_cols); i < dst.size(); ++i) CHECK(dst[i] == kNaN);  // untouched
}

TEST_CASE("amx gemm: bf16 tile products equal a float64 product of the same values, set and accumulated") {
  if (!amx::available()) {
    MESSAGE("skipped: this CPU (or NAPKIN_AMX=0) has no AMX; runtime/attention.cpp's f32 tiles serve bf16 here");
    return;
  }
  std::mt19937 rng(9);
  for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{16, 16, 32}, {48, 80, 64}, {64, 128, 64}, {32, 16, 96},
                         {80, 48, 160}}) {
    INFO("m ", m, " n ", n, " k ", k);
    // A from a 37-column-wider buffer (any row stride), B packed from a k x n matrix.
    const int64_t lda = k + 37;
    const std::vector<uint16_t> a = poisoned(m, k, lda, rng);
    const std::vector<uint16_t> bsrc = poisoned(k, n, n, rng);
    std::vector<uint16_t> b(size_t(k * n));
    amx::pack_b(bsrc.data(), k, n, n, b.data(), k, n);
    const int64_t ldc = n + 5;
    std::vector<float> c(size_t(m * ldc), 0.5f), start = c;
    for (bool accumulate : {false, true}) {
      c = start;
      {
        amx::TileScope tiles;
        amx::gemm(m, n, k, a.data(), lda, b.data(), 2 * n, c.data(), ldc, accumulate);
      }
      double worst = 0;
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          double want = accumulate ? 0.5 : 0.0, scale = 0;
          for (int64_t p = 0; p < k; ++p) {
            const double x = double(widen(a[size_t(i * lda + p)])) * double(widen(bsrc[size_t(p * n + j)]));
            want += x;
            scale += std::fabs(x);
          }
          worst = std::max(worst, std::fabs(double(c[size_t(i * ldc + j)]) - want) / std::max(scale, 1.0));
        }
      // f32 sums of exact bf16 x bf16 products: a few f32 ulps of the terms' size.
      CHECK(worst < 1e-5);
      // The gaps between C's rows are never written.
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = n; j < ldc; ++j) CHECK(c[size_t(i * ldc + j)] == 0.5f);
    }
  }
}
