// runtime::Classifier (the CPU fused classifier) against the classifier
// written out in float64 here, logit by logit (ir/loop.h's definition, with
// the logits and their gradient rounded to the element type as the op
// defines): loss, lse, dx and dw for f32, bf16, f16 and f64, on shapes that
// do not fill the kernel's row blocks or vocabulary chunks, vocabularies
// smaller than one chunk and over two, w given as [V, d] and as the
// transposed view of [d, V], padded rows of x, i32 and i64 targets;
// bit-identical results for any thread count; a target out of range.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "runtime/classifier.h"
#include "runtime/error.h"
#include "runtime/float_formats.h"
#include "support/typed_buffer.h"
#include "runtime/thread_pool.h"

using napkin::runtime::Classifier;
using napkin::runtime::ClassifierDesc;
using napkin::runtime::GemmType;
using napkin::runtime::ThreadPool;

namespace {

using Buffer = napkin::testing::TypedBuffer;

// x rounded to the type, through a one-element buffer.
double round_to(GemmType t, double x) {
  Buffer b(t, 1);
  return b.set(0, x);
}

struct Case {
  int64_t rows, vocab, d;
  GemmType type;
  bool w_transposed = false;  // w is the [V, d] view of a [d, V] buffer
  int64_t x_pad = 0;          // extra elements between rows of x
  bool targets_i64 = false;
  std::string name() const {
    return std::string(napkin::runtime::gemm_type_name(type)) + " rows=" + std::to_string(rows) +
           " V=" + std::to_string(vocab) + " d=" + std::to_string(d) + (w_transposed ? " w-transposed" : "") +
           (x_pad ? " x-padded" : "") + (targets_i64 ? " i64" : "");
  }
};

// Dense float64 x [rows, d] and w [V, d] (the values stored), targets, and
// every result by the definition.
struct Reference {
  std::vector<double> x, w, lse, dx, dw;
  std::vector<int64_t> targets;
  double loss = 0, dloss = 0;
};

Reference reference(const Case& c, Reference r) {
  const bool low = c.type == GemmType::BF16 || c.type == GemmType::F16;
  auto logit = [&](int64_t row, int64_t v) {
    double s = 0;
    for (int64_t k = 0; k < c.d; ++k) s += r.x[size_t(row * c.d + k)] * r.w[size_t(v * c.d + k)];
    return low ? round_to(c.type, s) : s;
  };
  r.lse.assign(size_t(c.rows), 0);
  r.dx.assign(size_t(c.rows * c.d), 0);
  r.dw.assign(size_t(c.vocab * c.d), 0);
  r.loss = 0;
  for (int64_t row = 0; row < c.rows; ++row) {
    double m = -std::numeric_limits<double>::infinity();
    for (int64_t v = 0; v < c.vocab; ++v) m = std::max(m, logit(row, v));
    double s = 0;
    for (int64_t v = 0; v < c.vocab; ++v) s += std::exp(logit(row, v) - m);
    r.lse[size_t(row)] = m + std::log(s);
    r.loss += r.lse[size_t(row)] - logit(row, r.targets[size_t(row)]);
  }
  r.loss /= double(c.rows);
  for (int64_t row = 0; row < c.rows; ++row)
    for (int64_t v = 0; v < c.vocab; ++v) {
      double g = (std::exp(logit(row, v) - r.lse[size_t(row)]) - (v == r.targets[size_t(row)] ? 1.0 : 0.0)) * r.dloss /
                 double(c.rows);
      if (low) g = round_to(c.type, g);
      for (int64_t k = 0; k < c.d; ++k) {
        r.dx[size_t(row * c.d + k)] += g * r.w[size_t(v * c.d + k)];
        r.dw[size_t(v * c.d + k)] += g * r.x[size_t(row * c.d + k)];
      }
    }
  return r;
}

// Tolerance relative to the largest reference magnitude: the kernel's f32
// sums run in another order, which may move a rounding of a low-precision
// logit or gradient by one unit.
double tolerance(GemmType t) {
  switch (t) {
    case GemmType::F64: return 1e-11;
    case GemmType::F32: return 2e-5;
    case GemmType::F16: return 4e-3;
    case GemmType::BF16: return 2e-2;
  }
  return 0;
}

void check_close(const std::string& what, const Buffer& got, size_t n, const std::vector<double>& want, GemmType t) {
  double scale = 1e-30, worst = 0;
  for (double v : want) scale = std::max(scale, std::abs(v));
  size_t at = 0;
  for (size_t i = 0; i < n; ++i)
    if (std::abs(got.get(i) - want[i]) > worst) worst = std::abs(got.get(i) - want[i]), at = i;
  INFO(what << ": worst error " << worst << " at " << at << " (got " << got.get(at) << ", want " << want[at]
            << "), scale " << scale);
  CHECK(worst <= tolerance(t) * scale);
}

struct Run {
  Buffer loss, lse, dx, dw;
};

Run run(const Case& c, const Reference& in, int threads, Buffer& x, Buffer& w, std::vector<unsigned char>& targets) {
  const GemmType acc = c.type == GemmType::F64 ? GemmType::F64 : GemmType::F32;
  ClassifierDesc desc;
  desc.rows = c.rows;
  desc.vocab = c.vocab;
  desc.d = c.d;
  desc.x_row_stride = c.d + c.x_pad;
  desc.w_v_stride = c.w_transposed ? 1 : c.d;
  desc.w_d_stride = c.w_transposed ? c.vocab : 1;
  desc.targets_i64 = c.targets_i64;
  Classifier k(desc, c.type);
  ThreadPool pool(threads);
  Run r{Buffer(acc, 1), Buffer(acc, size_t(c.rows)), Buffer(c.type, size_t(c.rows * c.d)),
        Buffer(c.type, size_t(c.vocab * c.d))};
  k.forward(x.data(), w.data(), targets.data(), r.loss.data(), r.lse.data(), pool);
  Buffer dloss(acc, 1);
  dloss.set(0, in.dloss);
  k.backward(x.data(), w.data(), targets.data(), r.lse.data(), dloss.data(), r.dx.data(), r.dw.data(), pool);
  return r;
}

void check_case(const Case& c) {
  INFO(c.name());
  std::mt19937 rng(unsigned(c.rows * 131 + c.vocab * 7 + c.d));
  std::normal_distribution<double> normal(0.0, 1.0);
  Buffer x(c.type, size_t(c.rows * (c.d + c.x_pad))), w(c.type, size_t(c.vocab * c.d));
  Reference in;
  in.x.resize(size_t(c.rows * c.d));
  in.w.resize(size_t(c.vocab * c.d));
  for (int64_t r = 0; r < c.rows; ++r)
    for (int64_t k = 0; k < c.d; ++k) in.x[size_t(r * c.d + k)] = x.set(size_t(r * (c.d + c.x_pad) + k), normal(rng));
  for (int64_t v = 0; v < c.vocab; ++v)
    for (int64_t k = 0; k < c.d; ++k)
      in.w[size_t(v * c.d + k)] = w.set(size_t(c.w_transposed ? k * c.vocab + v : v * c.d + k), 0.5 * normal(rng));
  std::vector<unsigned char> targets(size_t(c.rows) * (c.targets_i64 ? 8 : 4));
  for (int64_t r = 0; r < c.rows; ++r) {
    int64_t t = int64_t(rng() % uint32_t(c.vocab));
    in.targets.push_back(t);
    if (c.targets_i64) std::memcpy(&targets[size_t(r) * 8], &t, 8);
    else { int32_t t32 = int32_t(t); std::memcpy(&targets[size_t(r) * 4], &t32, 4); }
  }
  in.dloss = 1.75;
  const Reference want = reference(c, in);
  Run got = run(c, in, 3, x, w, targets);
  check_close("loss", got.loss, 1, {want.loss}, c.type);
  check_close("lse", got.lse, size_t(c.rows), want.lse, c.type);
  check_close("dx", got.dx, size_t(c.rows * c.d), want.dx, c.type);
  check_close("dw", got.dw, size_t(c.vocab * c.d), want.dw, c.type);
  // The same bits on one thread as on three.
  Run one = run(c, in, 1, x, w, targets);
  CHECK(one.loss.bytes == got.loss.bytes);
  CHECK(one.lse.bytes == got.lse.bytes);
  CHECK(one.dx.bytes == got.dx.bytes);
  CHECK(one.dw.bytes == got.dw.bytes);
}

}  // namespace

TEST_CASE("runtime classifier matches the float64 definition in every dtype, bit-identical on any thread count") {
  for (GemmType t : {GemmType::F32, GemmType::BF16, GemmType::F16, GemmType::F64}) {
    check_case({37, 20, 24, t});
    check_case({130, 1100, 40, t, true, 3, true});  // over two chunks, three row blocks
    check_case({64, Classifier::kChunk, 16, t, false, 0, true});
    check_case({1, 1, 1, t});  // one class: loss 0, gradient 0
  }
}

TEST_CASE("runtime classifier: a target out of range is an error naming the row") {
  ClassifierDesc desc;
  desc.rows = 3;
  desc.vocab = 4;
  desc.d = 2;
  desc.x_row_stride = 2;
  desc.w_v_stride = 2;
  Classifier k(desc, GemmType::F32);
  ThreadPool pool(2);
  std::vector<float> x(6, 1.0f), w(8, 0.5f), lse(3);
  std::vector<int32_t> targets{0, 4, 1};
  float loss = 0;
  try {
    k.forward(x.data(), w.data(), targets.data(), &loss, lse.data(), pool);
    FAIL("no error");
  } catch (const napkin::runtime::Error& e) {
    CHECK(std::string(e.what()).find("target class 4 of row 1 is out of range [0, 4)") != std::string::npos);
  }
}

TEST_CASE("runtime classifier: a descriptor with no contiguous w axis is refused") {
  ClassifierDesc desc;
  desc.rows = 2;
  desc.vocab = 3;
  desc.d = 2;
  desc.x_row_stride = 2;
  desc.w_v_stride = 4;
  desc.w_d_stride = 2;
  CHECK_THROWS_AS(Classifier(desc, GemmType::F32), napkin::runtime::Error);
}
