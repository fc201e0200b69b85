// The CUDA runtime (runtime/cuda) on a machine without a GPU:
//  - the matmul mapping onto cuBLASLt (lt_shape): every case is run twice on
//    the host, once by napkin's row-major definition over the MatmulDesc and
//    once as cuBLASLt defines the mapped problem (column-major operands, op,
//    leading dims, strided batch, one call per entry), and both must write
//    the same values to the same elements of C, each exactly once;
//  - types, the fp8 layout rule and pointer alignment;
//  - cuBLASLt's descriptors built by the real library, read back;
//  - the checked-call messages, through the real cuBLASLt and the toolkit's
//    stub libcuda (which also proves every driver entry point's versioned
//    symbol exists);
//  - a CudaEngine, and a trainer running on one, refusing to start without a
//    GPU with the guidance to build for the CPU, while --print-program works.
#ifdef NAPKIN_HAVE_CUDA_RUNTIME

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <fcntl.h>
#include <unistd.h>

#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/cuda/cublaslt_matmul.h"
#include "runtime/cuda/cuda_driver.h"
#include "runtime/cuda/cuda_engine.h"
#include "runtime/trainer.h"
#include "support/test_io.h"

namespace napkin {
namespace {

using runtime::MatmulDesc;
using runtime::cuda::LtOperand;
using runtime::cuda::LtShape;
using testing::error_of;

// ---- the mapping, checked by running it on the host ----

int64_t footprint(int64_t rows, int64_t cols, int64_t rs, int64_t cs) {
  return rows == 0 || cols == 0 ? 0 : (rows - 1) * rs + (cols - 1) * cs + 1;
}

// Elements an operand's view can reach (strides are non-negative here).
int64_t reach(const std::vector<int64_t>& batch, const std::vector<int64_t>& strides, int64_t matrix) {
  int64_t r = matrix;
  for (size_t i = 0; i < batch.size(); ++i) r += (batch[i] - 1) * strides[i];
  return std::max<int64_t>(r, 1);
}

struct Buffers {
  std::vector<double> a, b, c;
};

const double kUntouched = 1e300;

Buffers make_buffers(const MatmulDesc& d) {
  Buffers x;
  x.a.resize(reach(d.batch, d.a_batch_stride, footprint(d.m, d.k, d.a_m_stride, d.a_k_stride)));
  x.b.resize(reach(d.batch, d.b_batch_stride, footprint(d.k, d.n, d.b_k_stride, d.b_n_stride)));
  x.c.assign(reach(d.batch, d.c_batch_stride, footprint(d.m, d.n, d.c_m_stride, 1)), kUntouched);
  // Small integers: every sum is exact in any order.
  for (size_t i = 0; i < x.a.size(); ++i) x.a[i] = static_cast<double>(static_cast<int64_t>(i * 7 % 11) - 5);
  for (size_t i = 0; i < x.b.size(); ++i) x.b[i] = static_cast<double>(static_cast<int64_t>(i * 5 % 13) - 6);
  return x;
}

// napkin's definition: C[batch.., i, j] = sum_p A[batch.., i, p] B[batch.., p, j].
void run_row_major(const MatmulDesc& d, Buffers& x) {
  int64_t entries = 1;
  for (int64_t s : d.batch) entries *= s;
  for (int64_t e = 0; e < entries; ++e) {
    int64_t rest = e, oa = 0, ob = 0, oc = 0;
    for (size_t t = d.batch.size(); t-- > 0;) {
      int64_t j = rest % d.batch[t];
      rest /= d.batch[t];
      oa += j * d.a_batch_stride[t], ob += j * d.b_batch_stride[t], oc += j * d.c_batch_stride[t];
    }
    for (int64_t i = 0; i < d.m; ++i)
      for (int64_t j = 0; j < d.n; ++j) {
        double sum = 0;
        for (int64_t p = 0; p < d.k; ++p)
          sum += x.a[oa + i * d.a_m_stride + p * d.a_k_stride] * x.b[ob + p * d.b_k_stride + j * d.b_n_stride];
        x.c[oc + i * d.c_m_stride + j] = sum;
      }
  }
}

// Element (row, col) of op(X) for a stored operand, as cuBLASLt reads it.
int64_t op_index(const LtOperand& o, int64_t row, int64_t col) {
  int64_t r = o.transpose ? col : row, c = o.transpose ? row : col;  // in the stored matrix
  REQUIRE(r < o.rows);
  REQUIRE(c < o.cols);
  return r + c * o.ld;
}

// cuBLASLt's definition of the mapped problem, D = op(Lt A) op(Lt B) per
// call and batch entry, with Lt A = napkin's B and Lt B = napkin's A.
// Counts the writes of every element of C.
void run_mapped(const LtShape& s, Buffers& x, std::vector<int>& writes) {
  writes.assign(x.c.size(), 0);
  if (s.calls.empty()) return;
  // What cuBLASLt checks of the layouts.
  for (const LtOperand* o : {&s.a, &s.b, &s.d}) CHECK(o->ld >= std::max<int64_t>(o->rows, 1));
  CHECK(s.a.rows == (s.a.transpose ? s.k : s.m));
  CHECK(s.a.cols == (s.a.transpose ? s.m : s.k));
  CHECK(s.b.rows == (s.b.transpose ? s.n : s.k));
  CHECK(s.b.cols == (s.b.transpose ? s.k : s.n));
  CHECK(!s.d.transpose);
  CHECK(s.d.rows == s.m);
  CHECK(s.d.cols == s.n);
  for (const runtime::cuda::LtCall& call : s.calls)
    for (int64_t e = 0; e < s.batch_count; ++e) {
      int64_t oa = call.b + e * s.a.batch_stride;  // Lt A in napkin's B
      int64_t ob = call.a + e * s.b.batch_stride;  // Lt B in napkin's A
      int64_t od = call.c + e * s.d.batch_stride;
      for (int64_t i = 0; i < s.m; ++i)
        for (int64_t j = 0; j < s.n; ++j) {
          double sum = 0;
          for (int64_t p = 0; p < s.k; ++p) {
            int64_t ia = oa + op_index(s.a, i, p), ib = ob + op_index(s.b, p, j);
            REQUIRE(ia < static_cast<int64_t>(x.b.size()));
            REQUIRE(ib < static_cast<int64_t>(x.a.size()));
            sum += x.b[ia] * x.a[ib];
          }
          int64_t id = od + i + j * s.d.ld;
          REQUIRE(id < static_cast<int64_t>(x.c.size()));
          x.c[id] = sum;
          ++writes[id];
        }
    }
}

// Checks one descriptor; returns the mapped shape for further checks.
LtShape check_mapping(const MatmulDesc& d) {
  INFO("matmul ", d.to_string());
  LtShape s = runtime::cuda::lt_shape(d);
  Buffers want = make_buffers(d), got = want;
  run_row_major(d, want);
  std::vector<int> writes;
  run_mapped(s, got, writes);
  for (size_t i = 0; i < want.c.size(); ++i) {
    INFO("element ", i);
    REQUIRE(got.c[i] == want.c[i]);
    REQUIRE(writes[i] == (want.c[i] == kUntouched ? 0 : 1));
  }
  return s;
}

// A matrix rows x cols contiguous along cols (row stride cols + pad) or, when
// `columns`, along rows (column stride rows + pad).
void matrix_strides(int64_t rows, int64_t cols, bool columns, int64_t pad, int64_t* rs, int64_t* cs) {
  if (columns) *rs = 1, *cs = rows + pad;
  else *rs = cols + pad, *cs = 1;
}

// Batch layouts: per dim and operand whether it broadcasts, and whether the
// dims lie in memory in reverse order (then neighbours cannot merge).
struct BatchCase {
  std::vector<int64_t> sizes;
  std::vector<bool> a_broadcast, b_broadcast;
  bool reversed = false;
};

std::vector<int64_t> batch_strides(const std::vector<int64_t>& sizes, const std::vector<bool>& broadcast, bool reversed,
                                   int64_t matrix) {
  std::vector<int64_t> strides(sizes.size(), 0);
  int64_t next = matrix + 2;  // a gap between entries
  for (size_t t = 0; t < sizes.size(); ++t) {
    size_t dim = reversed ? t : sizes.size() - 1 - t;  // innermost in memory first
    if (!broadcast.empty() && broadcast[dim]) continue;
    strides[dim] = next;
    next *= std::max<int64_t>(sizes[dim], 1);
  }
  return strides;
}

MatmulDesc make_desc(int64_t m, int64_t n, int64_t k, bool a_columns, bool b_columns, int64_t pad_a, int64_t pad_b,
                     int64_t pad_c, const BatchCase& bc) {
  MatmulDesc d;
  d.m = m, d.n = n, d.k = k;
  matrix_strides(m, k, a_columns, pad_a, &d.a_m_stride, &d.a_k_stride);
  matrix_strides(k, n, b_columns, pad_b, &d.b_k_stride, &d.b_n_stride);
  d.c_m_stride = n + pad_c;
  d.batch = bc.sizes;
  d.a_batch_stride = batch_strides(bc.sizes, bc.a_broadcast, bc.reversed, footprint(m, k, d.a_m_stride, d.a_k_stride));
  d.b_batch_stride = batch_strides(bc.sizes, bc.b_broadcast, bc.reversed, footprint(k, n, d.b_k_stride, d.b_n_stride));
  d.c_batch_stride = batch_strides(bc.sizes, {}, bc.reversed, footprint(m, n, d.c_m_stride, 1));
  return d;
}

TEST_CASE("cuda runtime: the cuBLASLt mapping computes napkin's matmul (every layout, small sizes)") {
  const std::vector<BatchCase> batches = {
      {},
      {{2}, {}, {}},
      {{3}, {true}, {}},                          // A broadcast (a weight used by every entry)
      {{3}, {}, {true}},                          // B broadcast
      {{2, 3}, {}, {}},                           // merges into one strided dim of 6
      {{2, 3}, {}, {}, true},                     // cannot merge: 3 strided, 2 calls
      {{3, 2}, {false, true}, {true, false}},     // each operand broadcasts over another dim
      {{2, 1, 3}, {}, {true, false, false}},      // a size-1 dim between
      {{2, 2, 3}, {false, true, false}, {}, true},
      {{2, 0}, {}, {}},                           // no entries: C untouched
  };
  int cases = 0;
  for (int64_t m : {1, 2, 3})
    for (int64_t n : {1, 2, 3})
      for (int64_t k : {0, 1, 2, 3})
        for (bool a_columns : {false, true})
          for (bool b_columns : {false, true})
            for (int64_t pad : {0, 2})
              for (const BatchCase& bc : batches) {
                check_mapping(make_desc(m, n, k, a_columns, b_columns, pad, pad + 1, pad + 2, bc));
                ++cases;
              }
  CHECK(cases == 3 * 3 * 4 * 2 * 2 * 2 * 10);
}

TEST_CASE("cuda runtime: the cuBLASLt mapping of attention's views and of size-1 dims with any stride") {
  SUBCASE("q @ k^T and p @ v inside one qkv buffer: batch (b, h), strides (T*3*C, head_dim)") {
    int64_t b = 2, h = 3, t = 4, hd = 2, row = 3 * h * hd;  // qkv row: q, k, v of every head
    MatmulDesc scores;                                      // (b, h, T, T) = q (T x hd) k^T (hd x T)
    scores.batch = {b, h};
    scores.m = t, scores.n = t, scores.k = hd;
    scores.a_m_stride = row, scores.a_k_stride = 1;
    scores.b_k_stride = 1, scores.b_n_stride = row;
    scores.c_m_stride = t;
    scores.a_batch_stride = scores.b_batch_stride = {t * row, hd};
    scores.c_batch_stride = {h * t * t, t * t};
    LtShape s = check_mapping(scores);
    CHECK(s.a.transpose);  // k^T: contiguous along k
    CHECK_FALSE(s.b.transpose);
    CHECK(s.batch_count == 3);  // h, the larger: b = 2 calls
    CHECK(s.calls.size() == 2);

    MatmulDesc out;  // (b, h, T, hd) = p (T x T) v (T x hd)
    out.batch = {b, h};
    out.m = t, out.n = hd, out.k = t;
    out.a_m_stride = t, out.a_k_stride = 1;
    out.b_k_stride = row, out.b_n_stride = 1;
    out.c_m_stride = h * hd;  // written straight into (b, T, h, hd)
    out.a_batch_stride = {h * t * t, t * t};
    out.b_batch_stride = {t * row, hd};
    out.c_batch_stride = {t * h * hd, hd};
    s = check_mapping(out);
    CHECK(s.d.ld == h * hd);
  }
  SUBCASE("dW = X^T dY: A read along its columns, B row-major") {
    MatmulDesc d = MatmulDesc::plain(3, 4, 5, /*trans_a=*/true, false);
    LtShape s = check_mapping(d);
    CHECK_FALSE(s.a.transpose);
    CHECK(s.b.transpose);
  }
  SUBCASE("size-1 dims: their strides mean nothing") {
    for (int64_t junk : {0, 1, 7, 100}) {
      MatmulDesc row = MatmulDesc::plain(1, 3, 4);  // a single row of A
      row.a_m_stride = junk;
      check_mapping(row);
      MatmulDesc col = MatmulDesc::plain(3, 1, 4);  // a single column of B
      col.b_n_stride = junk;
      check_mapping(col);
      MatmulDesc outer = MatmulDesc::plain(3, 2, 1);  // k = 1: an outer product
      outer.a_k_stride = junk, outer.b_k_stride = junk;
      check_mapping(outer);
      MatmulDesc one = MatmulDesc::plain(1, 1, 1);
      one.a_m_stride = one.a_k_stride = one.b_k_stride = one.b_n_stride = one.c_m_stride = junk;
      check_mapping(one);
    }
  }
}

TEST_CASE("cuda runtime: the strided batch is the largest batch dim, the others are calls") {
  auto dims = [](std::vector<int64_t> sizes) {
    BatchCase bc{std::move(sizes), {}, {}, true};
    return runtime::cuda::lt_shape(make_desc(2, 2, 2, false, false, 0, 0, 0, bc));
  };
  LtShape s = dims({2, 5});
  CHECK(s.batch_count == 5);
  CHECK(s.calls.size() == 2);
  s = dims({5, 2});
  CHECK(s.batch_count == 5);
  CHECK(s.calls.size() == 2);
  s = dims({3, 3});  // equal: the innermost, whose stride (reversed layout) is the larger
  CHECK(s.batch_count == 3);
  CHECK(s.d.batch_stride == 3 * (2 * 2 + 2));
  s = dims({1, 1});
  CHECK(s.batch_count == 1);
  CHECK(s.calls.size() == 1);
}

TEST_CASE("cuda runtime: matmuls cuBLASLt cannot take are errors that say why") {
  MatmulDesc strided = MatmulDesc::plain(2, 2, 2);
  strided.a_m_stride = 4, strided.a_k_stride = 2;
  CHECK(error_of([&] { runtime::cuda::lt_shape(strided); }).find("A has no contiguous dim (m stride 4, k stride 2)") !=
        std::string::npos);
  MatmulDesc b_strided = MatmulDesc::plain(2, 2, 2);
  b_strided.b_k_stride = 6, b_strided.b_n_stride = 3;
  CHECK(error_of([&] { runtime::cuda::lt_shape(b_strided); }).find("B has no contiguous dim") != std::string::npos);
  MatmulDesc overlap = MatmulDesc::plain(2, 3, 2);
  overlap.c_m_stride = 2;
  CHECK(error_of([&] { runtime::cuda::lt_shape(overlap); }).find("c_m_stride must be >= n") != std::string::npos);
  MatmulDesc broadcast_c = MatmulDesc::plain(2, 2, 2);
  broadcast_c.batch = {2}, broadcast_c.a_batch_stride = {4}, broadcast_c.b_batch_stride = {4},
  broadcast_c.c_batch_stride = {0};
  CHECK(error_of([&] { runtime::cuda::lt_shape(broadcast_c); }).find("C cannot broadcast") != std::string::npos);
  MatmulDesc huge = MatmulDesc::plain(int64_t{1} << 31, 2, 2);
  CHECK(error_of([&] { runtime::cuda::lt_shape(huge); }).find("up to 2^31 - 1") != std::string::npos);
}

// ---- types, fp8, alignment ----

TEST_CASE("cuda runtime: dtypes map to cuBLASLt's types and compute types") {
  auto lt_types = [](const char* a, const char* b, const char* c, bool tf32) {
    return runtime::cuda::lt_types(runtime::parse_dtype(a), runtime::parse_dtype(b), runtime::parse_dtype(c), tf32);
  };
  auto t = lt_types("f32", "f32", "f32", false);
  CHECK(t.compute == CUBLAS_COMPUTE_32F);
  CHECK(t.scale == CUDA_R_32F);
  CHECK(lt_types("f32", "f32", "f32", true).compute == CUBLAS_COMPUTE_32F_FAST_TF32);
  t = lt_types("f64", "f64", "f64", true);  // tf32 is for f32 only
  CHECK(t.a == CUDA_R_64F);
  CHECK(t.compute == CUBLAS_COMPUTE_64F);
  CHECK(t.scale == CUDA_R_64F);
  t = lt_types("bf16", "bf16", "bf16", false);
  CHECK(t.a == CUDA_R_16BF);
  CHECK(t.c == CUDA_R_16BF);
  CHECK(t.compute == CUBLAS_COMPUTE_32F);
  CHECK(lt_types("bf16", "bf16", "f32", false).c == CUDA_R_32F);
  t = lt_types("f16", "f16", "f16", false);
  CHECK(t.b == CUDA_R_16F);
  CHECK(t.compute == CUBLAS_COMPUTE_32F);
  t = lt_types("f8e4m3", "f8e5m2", "bf16", false);
  CHECK(t.fp8);
  CHECK(t.a == CUDA_R_8F_E4M3);
  CHECK(t.b == CUDA_R_8F_E5M2);
  CHECK(t.c == CUDA_R_16BF);
  CHECK(lt_types("f8e5m2", "f8e4m3", "f32", false).a == CUDA_R_8F_E5M2);
  CHECK(lt_types("f8e4m3", "f8e4m3", "f16", false).c == CUDA_R_16F);
  for (auto [a, b, c] : {std::tuple{"f8e5m2", "f8e5m2", "bf16"}, {"bf16", "f16", "f32"}, {"f32", "f32", "bf16"},
                         {"f8e4m3", "f8e4m3", "f8e4m3"}, {"i32", "i32", "i32"}, {"f16", "f16", "bf16"}})
    CHECK(error_of([&] { lt_types(a, b, c, false); }) ==
          std::string("no cuBLASLt matmul of ") + a + " by " + b + " into " + c);
}

TEST_CASE("cuda runtime: fp8 matmuls must be TN with dims and leading dims multiples of 16") {
  using runtime::cuda::check_fp8_layout;
  // y = x W^T: x (m x k) and W (n x k) both row-major, contiguous along k.
  auto linear = [](int64_t m, int64_t n, int64_t k) {
    MatmulDesc d = MatmulDesc::plain(m, n, k, false, /*trans_b=*/true);
    return runtime::cuda::lt_shape(d);
  };
  check_fp8_layout(linear(32, 48, 64), "fc1");
  CHECK(error_of([&] { check_fp8_layout(runtime::cuda::lt_shape(MatmulDesc::plain(32, 48, 64)), "fc1"); }) ==
        "kernel fc1: fp8 matmul on cuBLASLt: A and B must both be contiguous along k (cuBLASLt's fp8 kernels take "
        "only the TN layout)");
  CHECK(error_of([&] { check_fp8_layout(runtime::cuda::lt_shape(MatmulDesc::plain(32, 48, 64, true, true)), "x"); })
            .find("TN layout") != std::string::npos);
  CHECK(error_of([&] { check_fp8_layout(linear(24, 48, 64), "fc2"); }) ==
        "kernel fc2: fp8 matmul on cuBLASLt: m is 24, not a multiple of 16");
  CHECK(error_of([&] { check_fp8_layout(linear(32, 40, 64), "fc2"); }).find("n is 40") != std::string::npos);
  CHECK(error_of([&] { check_fp8_layout(linear(32, 48, 72), "fc2"); }).find("k is 72") != std::string::npos);
  MatmulDesc padded = MatmulDesc::plain(32, 48, 64, false, true);
  padded.a_m_stride = 72;
  CHECK(error_of([&] { check_fp8_layout(runtime::cuda::lt_shape(padded), "fc3"); }) ==
        "kernel fc3: fp8 matmul on cuBLASLt: A's leading dim is 72, not a multiple of 16");
}

TEST_CASE("cuda runtime: pointer alignment for cuBLASLt's heuristics") {
  using runtime::cuda::pointer_alignment;
  CHECK(pointer_alignment({}) == 256);
  CHECK(pointer_alignment({0}) == 256);
  CHECK(pointer_alignment({512, 1024}) == 256);
  CHECK(pointer_alignment({64, 128}) == 64);
  CHECK(pointer_alignment({256 + 16}) == 16);
  CHECK(pointer_alignment({6}) == 2);
  CHECK(pointer_alignment({4096, 3}) == 1);
}

// ---- the libraries ----

// cuBLASLt as installed here, or null (a machine without the library).
std::unique_ptr<runtime::cuda::CublasLt> open_cublaslt() {
  try {
    return std::make_unique<runtime::cuda::CublasLt>();
  } catch (const runtime::Error& e) {
    MESSAGE("cuBLASLt not available, skipped: ", e.what());
    return nullptr;
  }
}

TEST_CASE("cuda runtime: cuBLASLt's descriptors hold the mapped layouts (built by the library, no GPU)") {
  auto lt = open_cublaslt();
  if (!lt) return;
  // A batched bf16 matmul, B broadcast: x (4, 32, 16) @ W^T, W (24, 16).
  MatmulDesc d = MatmulDesc::plain(32, 24, 16, false, true);
  d.batch = {4}, d.a_batch_stride = {32 * 16}, d.b_batch_stride = {0}, d.c_batch_stride = {32 * 24};
  LtShape s = runtime::cuda::lt_shape(d);
  auto types = runtime::cuda::lt_types(runtime::DType::BF16, runtime::DType::BF16, runtime::DType::F32, false);
  runtime::cuda::LtDescriptors desc(*lt, s, types, 32 << 20, 64, 128, 256);

  auto layout = [&](cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t attr, auto value) {
    decltype(value) got{};
    size_t written = 0;
    NAPKIN_CUBLASLT(*lt, cublasLtMatrixLayoutGetAttribute(l, attr, &got, sizeof(got), &written));
    CHECK(written == sizeof(got));
    return got;
  };
  struct Expect {
    cublasLtMatrixLayout_t layout;
    const LtOperand& o;
    uint32_t type;
  };
  for (const Expect& e : {Expect{desc.lt_a, s.a, CUDA_R_16BF}, Expect{desc.lt_b, s.b, CUDA_R_16BF},
                          Expect{desc.d, s.d, CUDA_R_32F}}) {
    CHECK(layout(e.layout, CUBLASLT_MATRIX_LAYOUT_TYPE, uint32_t{}) == e.type);
    CHECK(layout(e.layout, CUBLASLT_MATRIX_LAYOUT_ROWS, uint64_t{}) == static_cast<uint64_t>(e.o.rows));
    CHECK(layout(e.layout, CUBLASLT_MATRIX_LAYOUT_COLS, uint64_t{}) == static_cast<uint64_t>(e.o.cols));
    CHECK(layout(e.layout, CUBLASLT_MATRIX_LAYOUT_LD, int64_t{}) == e.o.ld);
    CHECK(layout(e.layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, int32_t{}) == 4);
    CHECK(layout(e.layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, int64_t{}) == e.o.batch_stride);
  }
  CHECK(s.a.batch_stride == 0);  // Lt A is napkin's B, broadcast
  CHECK(s.b.batch_stride == 32 * 16);

  auto op = [&](cublasLtMatmulDescAttributes_t attr, auto value) {
    decltype(value) got{};
    size_t written = 0;
    NAPKIN_CUBLASLT(*lt, cublasLtMatmulDescGetAttribute(desc.op, attr, &got, sizeof(got), &written));
    return got;
  };
  CHECK(op(CUBLASLT_MATMUL_DESC_TRANSA, int32_t{}) == CUBLAS_OP_T);  // W^T read along k
  CHECK(op(CUBLASLT_MATMUL_DESC_TRANSB, int32_t{}) == CUBLAS_OP_N);
  CHECK(op(CUBLASLT_MATMUL_DESC_COMPUTE_TYPE, int32_t{}) == CUBLAS_COMPUTE_32F);
  CHECK(op(CUBLASLT_MATMUL_DESC_SCALE_TYPE, int32_t{}) == CUDA_R_32F);

  // fp8: the scales follow their operands through the swap.
  MatmulDesc f = MatmulDesc::plain(32, 48, 64, false, true);
  LtShape fs = runtime::cuda::lt_shape(f);
  runtime::cuda::LtDescriptors fp8(*lt, fs, runtime::cuda::lt_types(runtime::DType::F8E4M3, runtime::DType::F8E4M3, runtime::DType::BF16, false), 32 << 20, 256,
                                   256, 256, /*a_scale=*/0x1000, /*b_scale=*/0x2000);
  auto scale = [&](cublasLtMatmulDescAttributes_t attr) {
    void* got = nullptr;
    size_t written = 0;
    NAPKIN_CUBLASLT(*lt, cublasLtMatmulDescGetAttribute(fp8.op, attr, &got, sizeof(got), &written));
    return reinterpret_cast<uintptr_t>(got);
  };
  CHECK(scale(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER) == 0x2000);  // Lt A = napkin's B
  CHECK(scale(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER) == 0x1000);
  CHECK(layout(fp8.lt_b, CUBLASLT_MATRIX_LAYOUT_TYPE, uint32_t{}) == CUDA_R_8F_E4M3);
  CHECK(layout(fp8.lt_b, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, int32_t{}) == 1);
}

TEST_CASE("cuda runtime: a failed call says where, which call, and the error's name and text") {
  CHECK(runtime::cuda::call_failed_message("runtime/cuda/cuda_engine.cpp", 123, "cuModuleLoadData(&module_, image)",
                                           "CUDA_ERROR_INVALID_IMAGE (device kernel image is invalid)") ==
        "runtime/cuda/cuda_engine.cpp:123: cuModuleLoadData failed: CUDA_ERROR_INVALID_IMAGE (device kernel image is "
        "invalid)");
  CHECK(runtime::cuda::source_path(NAPKIN_SOURCE_DIR "/runtime/cuda/cuda_engine.cpp") ==
        "runtime/cuda/cuda_engine.cpp");
  CHECK(runtime::cuda::source_path("../../runtime/cuda/cuda_engine.cpp") == "runtime/cuda/cuda_engine.cpp");

  if (auto lt = open_cublaslt()) {
    cublasLtMatmulDesc_t desc = nullptr;
    NAPKIN_CUBLASLT(*lt, cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    int32_t op = CUBLAS_OP_T;
    int line = __LINE__ + 2;
    std::string e = error_of([&] {
      NAPKIN_CUBLASLT(*lt, cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op, 1));  // short size
    });
    lt->cublasLtMatmulDescDestroy(desc);
    INFO(e);
    CHECK(e.starts_with("tests/unit/cuda_runtime_test.cpp:" + std::to_string(line) +
                        ": cublasLtMatmulDescSetAttribute failed: CUBLAS_STATUS_INVALID_VALUE ("));
  }

  // The toolkit's stub libcuda exports every entry point (so each versioned
  // name the runtime looks up exists) and fails every call.
  runtime::cuda::CudaDriver stub(NAPKIN_CUDA_STUB_DRIVER);
  int line = __LINE__ + 1;
  std::string e = error_of([&] { NAPKIN_CU(stub, cuInit(0)); });
  CHECK(e == "tests/unit/cuda_runtime_test.cpp:" + std::to_string(line) +
                    ": cuInit failed: CUDA_ERROR_STUB_LIBRARY (libcuda.so.1 is the CUDA toolkit's stub library, not "
                    "an NVIDIA driver)");

  e = error_of([] { runtime::cuda::CudaDriver none("libnapkin-no-such-driver.so.1"); });
  CHECK(e.starts_with("libnapkin-no-such-driver.so.1 cannot be loaded (libnapkin-no-such-driver.so.1: cannot open"));
  CHECK(e.ends_with("): no NVIDIA driver is installed"));
}

TEST_CASE("cuda runtime: a driver of an older CUDA major version is refused, naming both versions") {
  // 1000 * major + 10 * minor, as cuDriverGetVersion gives it.
  std::string e = error_of([] { runtime::cuda::check_driver_version("libcuda.so.1", 12080); });
  CHECK(e == fmt::format("libcuda.so.1 is a driver for CUDA 12.8; this trainer needs a driver for CUDA {}.{} or newer",
                         CUDA_VERSION / 1000, CUDA_VERSION % 1000 / 10));
  // The same major version, older or newer minor (minor version compatibility), or a newer major: accepted.
  int major = CUDA_VERSION / 1000 * 1000;
  for (int v : {major, major + 10, major + 990, major + 1000, CUDA_VERSION})
    CHECK(error_of([&] { runtime::cuda::check_driver_version("libcuda.so.1", v); }) == "(no error)");
}

TEST_CASE("cuda runtime: kernelParams carry the arena, the scratch and the offsets struct's bytes") {
  // The kernel's parameters as the device sees them: (char* arena, char*
  // scratch, NapkinOffsets<5> off), the struct by value.
  struct Offsets5 {
    long long at[5];
  };
  struct Device {
    char* arena;
    char* scratch;
    Offsets5 off;
  };
  CUdeviceptr arena = 0x7f0000000100ull, scratch = 0x7f0000100000ull;
  std::vector<long long> offsets = {0, 16, 4096, 1LL << 33, 48};
  std::array<void*, 3> params = runtime::cuda::kernel_params(arena, scratch, offsets);
  // What cuLaunchKernel does: copy each parameter's size (cuFuncGetParamInfo)
  // from kernelParams[j] to the parameter's offset.
  const size_t offset[] = {offsetof(Device, arena), offsetof(Device, scratch), offsetof(Device, off)};
  const size_t size[] = {sizeof(char*), sizeof(char*), sizeof(Offsets5)};
  Device got{};
  for (int j = 0; j < 3; ++j) std::memcpy(reinterpret_cast<char*>(&got) + offset[j], params[j], size[j]);
  CHECK(reinterpret_cast<uintptr_t>(got.arena) == arena);
  CHECK(reinterpret_cast<uintptr_t>(got.scratch) == scratch);
  for (int j = 0; j < 5; ++j) CHECK(got.off.at[j] == offsets[j]);
}

// ---- no GPU ----

// A one-kernel CUDA program: mean of a parameter as the loss.
std::string tiny_program_json() {
  nlohmann::json j = {
      {"format", "napkin-program-1"}, {"model", "tiny"}, {"hash", "0"}, {"backend", "cuda"}, {"device", "h100"},
      {"arena_bytes", 64}, {"liveness_peak", 64}, {"flops_per_step", 8}, {"flops_forward", 4}, {"flops_optimizer", 0},
      {"peak_flops", 0},
      {"tokens_per_step", 1},
      {"tensors",
       {{{"name", "w"}, {"role", "param"}, {"dtype", "f32"}, {"shape", {4}}, {"offset", 0}, {"bytes", 16},
         {"init", {{"kind", "zeros"}, {"value", 0}, {"std", 0}, {"lo", 0}, {"hi", 0}}}},
        {{"name", "loss"}, {"role", "loss"}, {"dtype", "f32"}, {"shape", nlohmann::json::array()}, {"offset", 16},
         {"bytes", 4}}}},
      {"kernels",
       {{{"name", "mean"}, {"where", "tiny.yaml:3"}, {"phase", "forward"}, {"kind", "loop"}, {"extent", 1},
         {"parallel", false}, {"out", {{"offset", 16}, {"numel", 1}, {"dtype", "f32"}}},
         {"cuda_launches",
          {{{"function", "k0_mean"}, {"grid", 1}, {"block", 32}, {"shared", 0}, {"offsets", {0, 16}}}}}}}},
      {"num_forward_kernels", 1},
      {"num_gradient_kernels", 1},
      {"gradients", nlohmann::json::array()},
      {"bucket_bytes", 26214400},
      {"cuda", {{"arch", "sm_90"}, {"scratch_bytes", 0}, {"tf32", false}}},
      {"updates", nlohmann::json::array()},
      {"train",
       {{"steps", 1}, {"seed", 0}, {"accumulate", 1}, {"data", nullptr}, {"eval_every", 0}, {"eval_batches", 1}, {"checkpoint_every", 0},
        {"checkpoint_dir", ""}, {"checkpoint_keep", 1}, {"log_every", 1}, {"metrics", ""}, {"optimizer", "sgd"},
        {"precision", "f32"}, {"lr", 0.1}}}};
  return j.dump();
}

const char* const kGuidance = "; build with `napkin build --target cpu` to train on this machine";

// True when this machine can run CUDA after all (then the no-GPU checks do not apply).
bool has_gpu(const std::string& engine_error) {
  return engine_error.find("this trainer runs its step") == std::string::npos;
}

TEST_CASE("cuda runtime: without a GPU the engine refuses to start and says to build for the CPU") {
  std::string json = tiny_program_json();
  runtime::Program p = runtime::parse_program(json.data(), json.size());
  std::string e = error_of([&] { runtime::cuda::CudaEngine engine(p, "", ""); });
  if (has_gpu(e)) {
    MESSAGE("a GPU is present; the no-GPU message is not checked (got: ", e, ")");
    return;
  }
  INFO(e);
  // Which reason depends on the machine (no libcuda.so.1, the stub, no device).
  CHECK(e.starts_with("this trainer runs its step on an NVIDIA GPU, and "));
  CHECK(e.ends_with(kGuidance));
}

// Runs trainer_main on the tiny program with stdout and stderr captured.
struct TrainerRun {
  int status = 0;
  std::string out, err;
};

TrainerRun run_trainer(std::vector<std::string> args, const runtime::EngineFactory& factory) {
  std::string json = tiny_program_json();
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  testing::TempDir dir("cuda-trainer");
  std::fflush(stdout);
  std::fflush(stderr);
  int saved[2] = {dup(1), dup(2)};
  for (int f : {1, 2}) {
    int fd = open((dir / std::to_string(f)).c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(fd, f);
    close(fd);
  }
  TrainerRun r;
  r.status = runtime::trainer_main(static_cast<int>(argv.size()), argv.data(), json.data(), json.size(), factory);
  std::fflush(stdout);
  std::fflush(stderr);
  for (int f : {1, 2}) {
    dup2(saved[f - 1], f);
    close(saved[f - 1]);
  }
  r.out = testing::read_bytes(dir / "1");
  r.err = testing::read_bytes(dir / "2");
  return r;
}

TEST_CASE("cuda runtime: a CUDA trainer without a GPU exits 1 with the reason - --print-program needs no GPU") {
  bool made = false;
  runtime::EngineFactory cuda = [&](const runtime::Program& p, int) {
    made = true;
    return std::make_unique<runtime::cuda::CudaEngine>(p, "", "");
  };
  TrainerRun r = run_trainer({"trainer", "--print-program"}, cuda);
  CHECK(r.status == 0);
  CHECK_FALSE(made);
  CHECK(r.out == tiny_program_json() + "\n");

  r = run_trainer({"trainer", "--steps", "1", "--quiet"}, cuda);
  CHECK(made);
  if (has_gpu(r.err)) {
    MESSAGE("a GPU is present; the no-GPU exit is not checked (got: ", r.err, ")");
    return;
  }
  INFO(r.err);
  CHECK(r.status == 1);
  CHECK(r.err.starts_with("error: this trainer runs its step on an NVIDIA GPU, and "));
  CHECK(r.err.ends_with(std::string(kGuidance) + "\n"));
}

}  // namespace
}  // namespace napkin

#endif  // NAPKIN_HAVE_CUDA_RUNTIME
