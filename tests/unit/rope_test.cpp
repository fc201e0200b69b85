// runtime/rope.h against hand formulas in double: the frequencies (plain and
// with Llama 3.1's scaling, from transformers' _compute_llama3_parameters
// worked by hand), the table, the rotation of a row in both pairings and its
// inverse, and the standalone kernel over strided tensors, every dtype,
// explicit positions and any thread count.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <numbers>
#include <vector>

#include "runtime/error.h"
#include "runtime/float_formats.h"
#include "runtime/rope.h"
#include "runtime/rng.h"

namespace napkin {
namespace {

using runtime::RopeDesc;
using runtime::RopeStyle;

// f32 values as transformers computes them in f32 are within a few f32 ulps
// of the exact (double) formula.
constexpr double kF32 = 4e-7;

TEST_CASE("rope: the inverse frequencies are 1 / theta^(2j / dim), in f32") {
  RopeDesc d;
  d.dim = 64;
  d.theta = 10000;
  const std::vector<float> inv = runtime::rope_inv_freq(d);
  REQUIRE(inv.size() == 32);
  CHECK(inv[0] == 1.0f);
  for (int j = 0; j < 32; ++j) {
    CAPTURE(j);
    CHECK(inv[j] == doctest::Approx(1 / std::pow(10000.0, 2.0 * j / 64)).epsilon(kF32));
  }
  CHECK(inv[16] == doctest::Approx(0.01).epsilon(kF32));  // 10000^(-1/2)
}

TEST_CASE("rope: Llama 3.1's scaling keeps high frequencies, divides low ones, interpolates between (hand-worked values)") {
  // Llama-3.1-8B: dim 128, theta 500000, factor 8, low 1, high 4, context
  // 8192. Wavelengths 2 pi / inv below 8192 / 4 = 2048 are kept, above 8192 / 1
  // divided by 8, between: (1 - s) inv / 8 + s inv with s = (8192 / wavelength - 1) / 3.
  RopeDesc d;
  d.dim = 128;
  d.theta = 500000;
  d.factor = 8, d.low_freq_factor = 1, d.high_freq_factor = 4, d.original_context = 8192;
  const std::vector<float> inv = runtime::rope_inv_freq(d);
  REQUIRE(inv.size() == 64);
  // j, then the value worked out in double from the formula above:
  //  j = 10: inv 0.12868737343265052, wavelength 48.8: kept
  //  j = 29: inv 0.0026160992529250353, wavelength 2401.7, s = 0.803621042099634
  //  j = 30: inv 0.0021311195369119653, wavelength 2948.3, s = 0.5928492950029659
  //  j = 34: inv 0.0009384738703573801, wavelength 6695.1, s = 0.07452656416074303
  //  j = 35: inv 0.0007644969883171747, wavelength 8218.7: divided by 8
  //  j = 63: inv 2.455140791131609e-06: divided by 8
  const std::pair<int, double> expected[] = {{0, 1.0},
                                             {10, 0.12868737343265052},
                                             {29, 0.002166570763503359},
                                             {30, 0.0013718935677611381},
                                             {34, 0.00017850781276799638},
                                             {35, 9.556212353964683e-05},
                                             {63, 3.068925988914511e-07}};
  for (const std::pair<int, double>& e : expected) {
    CAPTURE(e.first);
    CHECK(inv[static_cast<size_t>(e.first)] == doctest::Approx(e.second).epsilon(kF32));
  }
  // Without the factor the same frequencies are the plain ones.
  d.factor = 0;
  CHECK(runtime::rope_inv_freq(d)[35] == doctest::Approx(0.0007644969883171747).epsilon(kF32));
}

TEST_CASE("rope: the table holds cos and sin of float(p) * inv_freq, rounded to f32 once") {
  RopeDesc d;
  d.dim = 8;
  d.theta = 100;
  const runtime::RopeTable t = runtime::make_rope_table(d, 5);
  const std::vector<float> inv = runtime::rope_inv_freq(d);
  REQUIRE(t.positions == 5);
  REQUIRE(t.half == 4);
  for (int64_t p = 0; p < 5; ++p)
    for (int64_t j = 0; j < 4; ++j) {
      const double a = static_cast<double>(static_cast<float>(p) * inv[static_cast<size_t>(j)]);
      CHECK(t.cos_row(p)[j] == static_cast<float>(std::cos(a)));
      CHECK(t.sin_row(p)[j] == static_cast<float>(std::sin(a)));
    }
  CHECK(t.cos_row(0)[3] == 1.0f);
  CHECK(t.sin_row(0)[3] == 0.0f);
}

TEST_CASE("rope: a row turns pair by pair, j with j + D/2 (half) or 2j with 2j + 1 (interleaved), and back") {
  // D = 4: two pairs with angles a0 = 0.5 and a1 = 2 (cos and sin in f32).
  const float cos[2] = {std::cos(0.5f), std::cos(2.0f)}, sin[2] = {std::sin(0.5f), std::sin(2.0f)};
  const double x[4] = {1.0, -2.0, 3.0, 0.25};
  auto norm = [&](int j) { return double(cos[j]) * cos[j] + double(sin[j]) * sin[j]; };
  auto turned = [&](double x1, double x2, int j) {
    return std::pair{x1 * cos[j] - x2 * sin[j], x2 * cos[j] + x1 * sin[j]};
  };
  {
    double row[4] = {x[0], x[1], x[2], x[3]};
    runtime::rope_rotate_row(RopeStyle::Half, 4, cos, sin, false, row);
    const auto [y0, y2] = turned(x[0], x[2], 0);
    const auto [y1, y3] = turned(x[1], x[3], 1);
    CHECK(row[0] == y0);
    CHECK(row[2] == y2);
    CHECK(row[1] == y1);
    CHECK(row[3] == y3);
    // Back by the negated angles: x again, scaled by cos² + sin² of the f32
    // cos and sin (1 within 1e-7), exactly so in double.
    runtime::rope_rotate_row(RopeStyle::Half, 4, cos, sin, true, row);
    for (int i = 0; i < 4; ++i) CHECK(row[i] == doctest::Approx(x[i] * norm(i % 2)).epsilon(1e-15));
  }
  {
    double row[4] = {x[0], x[1], x[2], x[3]};
    runtime::rope_rotate_row(RopeStyle::Interleaved, 4, cos, sin, false, row);
    const auto [y0, y1] = turned(x[0], x[1], 0);
    const auto [y2, y3] = turned(x[2], x[3], 1);
    CHECK(row[0] == y0);
    CHECK(row[1] == y1);
    CHECK(row[2] == y2);
    CHECK(row[3] == y3);
    runtime::rope_rotate_row(RopeStyle::Interleaved, 4, cos, sin, true, row);
    for (int i = 0; i < 4; ++i) CHECK(row[i] == doctest::Approx(x[i] * norm(i / 2)).epsilon(1e-15));
  }
  {
    // The inverse is the rotation by the negated angles: sin's sign flipped.
    float row[4] = {1.0f, -2.0f, 3.0f, 0.25f};
    runtime::rope_rotate_row(RopeStyle::Half, 4, cos, sin, true, row);
    CHECK(row[0] == doctest::Approx(x[0] * cos[0] + x[2] * sin[0]).epsilon(1e-6));
    CHECK(row[2] == doctest::Approx(x[2] * cos[0] - x[0] * sin[0]).epsilon(1e-6));
  }
  // Position 1 of theta 10000 and D = 2: one pair turned by exactly 1 radian.
  RopeDesc d;
  const runtime::RopeTable t = runtime::make_rope_table(d, 2);
  float row[2] = {2.0f, 3.0f};
  runtime::rope_rotate_row(RopeStyle::Half, 2, t.cos_row(1), t.sin_row(1), false, row);
  CHECK(row[0] == doctest::Approx(2 * std::cos(1.0) - 3 * std::sin(1.0)).epsilon(1e-6));
  CHECK(row[1] == doctest::Approx(3 * std::cos(1.0) + 2 * std::sin(1.0)).epsilon(1e-6));
}

// The kernel's expected output in double: every row of x ([sizes], x_strides)
// along `axis` turned at its position by the table's cos and sin.
std::vector<double> expected_rope(const runtime::RopeKernelDesc& d, const std::vector<double>& x,
                                  const std::vector<int64_t>& positions) {
  const std::vector<float> inv = runtime::rope_inv_freq(d.rope);
  const int rank = static_cast<int>(d.sizes.size());
  int64_t n = 1;
  for (int64_t s : d.sizes) n *= s;
  std::vector<int64_t> y_strides(static_cast<size_t>(rank), 1);
  for (int i = rank - 2; i >= 0; --i) y_strides[i] = y_strides[i + 1] * d.sizes[i + 1];
  std::vector<double> y(static_cast<size_t>(n));
  const int64_t dim = d.rope.dim, half = dim / 2;
  std::vector<float> c(static_cast<size_t>(half)), s(static_cast<size_t>(half));
  std::vector<double> row(static_cast<size_t>(dim));
  for (int64_t flat = 0; flat < n; ++flat) {
    std::vector<int64_t> idx(static_cast<size_t>(rank));
    int64_t rest = flat;
    for (int i = rank - 1; i >= 0; --i) idx[i] = rest % d.sizes[i], rest /= d.sizes[i];
    if (idx[d.axis] != 0) continue;  // one visit per row
    const int64_t seq = idx[d.seq_axis];
    runtime::rope_cos_sin(inv, d.explicit_positions ? positions[static_cast<size_t>(seq)] : seq, c.data(), s.data());
    int64_t xo = 0, yo = 0;
    for (int i = 0; i < rank; ++i) xo += idx[i] * d.x_strides[i], yo += idx[i] * y_strides[i];
    for (int64_t j = 0; j < dim; ++j) row[j] = x[xo + j * d.x_strides[d.axis]];
    runtime::rope_rotate_row(d.rope.style, dim, c.data(), s.data(), d.inverse, row.data());
    for (int64_t j = 0; j < dim; ++j) y[yo + j * y_strides[d.axis]] = row[j];
  }
  return y;
}

TEST_CASE("rope: the kernel turns every row of a strided tensor, f32, f64, bf16 and f16, at any thread count") {
  // x viewed as [2, 3, 5, 6] (batch, seq, heads, head_dim) from a [6, 2, 5, 3]
  // buffer: head_dim's stride is not 1. Rotated axis 3, positions along axis 1.
  runtime::RopeKernelDesc d;
  d.sizes = {2, 3, 5, 6};
  d.x_strides = {5 * 3, 1, 3, 2 * 5 * 3};
  d.axis = 3, d.seq_axis = 1;
  d.rope.dim = 6;
  d.rope.theta = 50;
  runtime::Rng rng(3, 0);
  std::vector<double> x(6 * 2 * 5 * 3);
  for (double& v : x) v = rng.normal();
  for (RopeStyle style : {RopeStyle::Half, RopeStyle::Interleaved})
    for (bool inverse : {false, true})
      for (bool positions : {false, true}) {
        CAPTURE(static_cast<int>(style));
        CAPTURE(inverse);
        CAPTURE(positions);
        d.rope.style = style, d.inverse = inverse, d.explicit_positions = positions, d.positions_i64 = true;
        // Position 9 is past the table's 3 rows: computed for the call.
        const std::vector<int64_t> pos = {9, 0, 2};
        const std::vector<double> want = expected_rope(d, x, pos);
        {
          {  // f64: the same arithmetic as the expectation
            runtime::RopeKernel k(d, runtime::DType::F64);
            std::vector<double> y(want.size());
            runtime::ThreadPool pool(3);
            k.run(x.data(), pos.data(), y.data(), pool);
            for (size_t i = 0; i < y.size(); ++i) CHECK(y[i] == want[i]);
          }
          std::vector<float> xf(x.begin(), x.end());
          std::vector<float> one(want.size()), three(want.size());
          runtime::RopeKernel k(d, runtime::DType::F32);
          runtime::ThreadPool serial(1), pool(3);
          k.run(xf.data(), pos.data(), one.data(), serial);
          k.run(xf.data(), pos.data(), three.data(), pool);
          CHECK(std::memcmp(one.data(), three.data(), one.size() * sizeof(float)) == 0);
          // x in f32 is x rounded; the rotation then rounds each product and sum.
          std::vector<double> wf = expected_rope(d, std::vector<double>(xf.begin(), xf.end()), pos);
          for (size_t i = 0; i < one.size(); ++i) CHECK(one[i] == doctest::Approx(wf[i]).epsilon(1e-6).scale(1));
          for (runtime::DType t : {runtime::DType::BF16, runtime::DType::F16}) {
            CAPTURE(runtime::dtype_name(t));
            auto narrow = [t](float v) {
              return t == runtime::DType::BF16 ? runtime::float_to_bf16_bits(v) : runtime::float_to_f16_bits(v);
            };
            auto widen = [t](uint16_t b) {
              return t == runtime::DType::BF16 ? runtime::bf16_bits_to_float(b) : runtime::f16_bits_to_float(b);
            };
            std::vector<uint16_t> xs(x.size()), ys(want.size());
            std::vector<double> xw(x.size());
            for (size_t i = 0; i < x.size(); ++i) xs[i] = narrow(static_cast<float>(x[i])), xw[i] = widen(xs[i]);
            runtime::RopeKernel k16(d, t);
            k16.run(xs.data(), pos.data(), ys.data(), pool);
            // One rounding of the f32 result to the narrow type: half an ulp (2^-9 for bf16, 2^-12 for f16).
            const double ulp = t == runtime::DType::BF16 ? 1.0 / 128 : 1.0 / 1024;
            const std::vector<double> w16 = expected_rope(d, xw, pos);
            for (size_t i = 0; i < ys.size(); ++i)
              CHECK(std::fabs(widen(ys[i]) - w16[i]) <= ulp * std::max(std::fabs(w16[i]), 1e-3) + 1e-6);
          }
        }
      }
}

TEST_CASE("rope: the kernel refuses an odd or mismatched rotated axis and the same axis twice") {
  runtime::RopeKernelDesc d;
  d.sizes = {4, 6};
  d.x_strides = {6, 1};
  d.axis = 1, d.seq_axis = 0;
  d.rope.dim = 6;
  CHECK_NOTHROW(runtime::RopeKernel(d, runtime::DType::F32));
  d.rope.dim = 4;
  CHECK_THROWS_WITH_AS(runtime::RopeKernel(d, runtime::DType::F32), doctest::Contains("they must be equal and even"),
                       runtime::Error);
  d.rope.dim = 6, d.seq_axis = 1;
  CHECK_THROWS_WITH_AS(runtime::RopeKernel(d, runtime::DType::F32), doctest::Contains("must be distinct axes"),
                       runtime::Error);
  d.seq_axis = 0;
  CHECK_THROWS_WITH_AS(runtime::RopeKernel(d, runtime::DType::I32), doctest::Contains("rotates f32, f64, bf16 or f16"),
                       runtime::Error);
}

}  // namespace
}  // namespace napkin
