// runtime/routing.h's CPU kernels: top_k against a plain stable sort in
// double over strided tensors of every dtype with many ties, at several
// thread counts; moe_slots on a hand-worked case (choice-major priority,
// drops, an empty slot), strided indices, and a bad index reported with
// nothing written.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "runtime/error.h"
#include "runtime/float_formats.h"
#include "runtime/rng.h"
#include "runtime/routing.h"
#include "runtime/tensor_element.h"

namespace napkin {
namespace {

using runtime::DType;

// x [3, 5, n] stored as [n, 3, 5] (a permuted view: the row's stride is 15).
TEST_CASE("routing: top_k picks each row's k largest, descending, ties to the lower index, every dtype, any threads") {
  const int64_t n = 9;
  const std::vector<int64_t> sizes{3, 5, n}, strides{5, 1, 15};
  runtime::Rng rng(3, 4);
  for (DType dtype : {DType::F32, DType::F64, DType::BF16, DType::F16}) {
    CAPTURE(runtime::dtype_name(dtype));
    const int64_t size = runtime::element_bytes(dtype), count = 3 * 5 * n;
    // Values from a few levels so that most rows have ties; one NaN.
    std::vector<char> x(static_cast<size_t>(count * size));
    for (int64_t i = 0; i < count; ++i)
      runtime::write_element(x.data(), dtype, i, static_cast<double>(rng.next_u32() % 5) - 2.0 + 0.25);
    runtime::write_element(x.data(), dtype, 7 * 15 + 4, std::nan(""));
    for (int64_t k : {int64_t{1}, int64_t{2}, n}) {
      CAPTURE(k);
      const runtime::TopKDesc d{sizes, strides, k};
      runtime::check_top_k(d, dtype);
      for (int threads : {1, 3}) {
        runtime::ThreadPool pool(threads);
        std::vector<char> values(static_cast<size_t>(15 * k * size));
        std::vector<int32_t> indices(static_cast<size_t>(15 * k), -7);
        runtime::top_k(d, dtype, x.data(), values.data(), indices.data(), pool);
        for (int64_t r = 0; r < 15; ++r) {
          const int64_t base = (r / 5) * 5 + r % 5;  // the row's element 0
          std::vector<double> row(static_cast<size_t>(n));
          for (int64_t j = 0; j < n; ++j) row[j] = runtime::read_element(x.data(), dtype, base + j * 15);
          std::vector<int64_t> order(static_cast<size_t>(n));
          std::iota(order.begin(), order.end(), 0);
          std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
            return std::isnan(row[a]) ? !std::isnan(row[b]) : row[a] > row[b];
          });
          for (int64_t j = 0; j < k; ++j) {
            CAPTURE(r);
            CAPTURE(j);
            CHECK(indices[r * k + j] == order[j]);
            CHECK(std::memcmp(values.data() + (r * k + j) * size, x.data() + (base + order[j] * 15) * size, size) == 0);
          }
        }
      }
    }
  }
}

TEST_CASE("routing: top_k refuses k outside [1, n] and integer rows") {
  CHECK_THROWS_AS(runtime::check_top_k({{4, 6}, {6, 1}, 7}, DType::F32), runtime::Error);
  CHECK_THROWS_AS(runtime::check_top_k({{4, 6}, {6, 1}, 0}, DType::F32), runtime::Error);
  CHECK_THROWS_AS(runtime::check_top_k({{4, 6}, {6, 1}, 2}, DType::I32), runtime::Error);
}

TEST_CASE("routing: moe_slots fills slots choice-major, drops past capacity, counts before it (worked by hand)") {
  // T = 4, k = 2, E = 3, C = 2: t0 (2, 0), t1 (2, 1), t2 (2, 0), t3 (0, 2).
  // First choices: t0 -> e2 s0, t1 -> e2 s1, t2 dropped, t3 -> e0 s0;
  // second: t0 -> e0 s1, t1 -> e1 s0, t2 dropped (e0 full), t3 dropped (e2 full).
  // Stored transposed ([k, T] in memory, strides {1, 4}) to read through strides.
  const std::vector<int32_t> indices{2, 2, 2, 0, /**/ 0, 1, 0, 2};
  const runtime::MoeSlotsDesc d{.tokens = 4, .k = 2, .experts = 3, .capacity = 2, .index_strides = {1, 4}};
  runtime::check_moe_slots(d);
  std::vector<int32_t> pos(8, 99), src(6, 99);
  std::vector<float> counts(3, 99);
  CHECK_FALSE(runtime::moe_slots(d, indices.data(), pos.data(), src.data(), counts.data()).has_value());
  CHECK(pos == std::vector<int32_t>{4, 1, 5, 2, -1, -1, 0, -1});
  CHECK(src == std::vector<int32_t>{3, 0, 1, 0, 0, 1});  // e1's slot 1 is empty: 0
  CHECK(counts == std::vector<float>{3, 1, 4});
}

TEST_CASE("routing: moe_slots reports the first index outside 0 to E - 1 and writes nothing") {
  const std::vector<int32_t> indices{0, 1, 3, 1, -1, 0};
  const runtime::MoeSlotsDesc d{.tokens = 3, .k = 2, .experts = 3, .capacity = 2, .index_strides = {2, 1}};
  std::vector<int32_t> pos(6, 99), src(6, 99);
  std::vector<float> counts(3, 99);
  CHECK(runtime::moe_slots(d, indices.data(), pos.data(), src.data(), counts.data()) == 3);
  CHECK(pos == std::vector<int32_t>(6, 99));
  CHECK(src == std::vector<int32_t>(6, 99));
  CHECK(counts == std::vector<float>(3, 99));
  CHECK_THROWS_AS(runtime::check_moe_slots({.tokens = 3, .k = 2, .experts = 3, .capacity = 0, .index_strides = {2, 1}}),
                  runtime::Error);
}

}  // namespace
}  // namespace napkin
