// The memory plan: on every model, no two buffers live at the same time share
// a byte, the arena is at least the liveness peak, and the chosen placement is
// no worse than the other; in-place reuse happens for a chain of elementwise
// ops and not when the input is read later, transposed or broadcast.
#include <doctest/doctest.h>

#include <fmt/format.h>

#include <string>
#include <vector>

#include "analysis/in_place_reuse.h"
#include "analysis/memory.h"
#include "analysis/memory_plan.h"
#include "ir/builder.h"
#include "ir/verifier.h"
#include "support/test_models.h"

using namespace napkin;

namespace {

ir::TensorType ty(std::vector<int64_t> sizes, ir::DType dtype = ir::DType::F32) {
  ir::TensorType t;
  t.dtype = dtype;
  for (int64_t s : sizes) t.dims.push_back({s, ""});
  return t;
}

const analysis::MemoryBuffer* find_buffer(const analysis::MemoryReport& r, ir::ValueId v) {
  for (const analysis::MemoryBuffer& b : r.buffers)
    if (b.value == v) return &b;
  return nullptr;
}

ir::ValueId sum_all(ir::Builder& b, ir::ValueId v, int rank) {
  std::vector<int64_t> axes;
  for (int i = 0; i < rank; ++i) axes.push_back(i);
  return b.must(b.add(ir::Op::ReduceSum, {v}, {{"axes", axes}, {"keepdims", int64_t{0}}}));
}

ir::Graph full_model(const std::filesystem::path& model) {
  ir::Diagnostics diag;
  std::optional<ir::Graph> g = frontend::load_model_file(model.string(), diag);
  if (g) passes::run_training_pipeline(*g, diag);
  INFO(diag.render());
  REQUIRE(g.has_value());
  REQUIRE_FALSE(diag.has_errors());
  return std::move(*g);
}

// Every pair of buffers whose live ranges intersect has disjoint bytes.
void check_no_overlap(const analysis::MemoryReport& m, const analysis::MemoryPlan& plan) {
  const auto& bs = m.buffers;
  int64_t violations = 0;
  for (size_t i = 0; i < bs.size(); ++i) {
    REQUIRE(plan.has(bs[i].value));
    int64_t a0 = plan.storage_offset.at(bs[i].value), a1 = a0 + bs[i].bytes;
    CHECK(a1 <= plan.arena_bytes);
    CHECK(a0 % analysis::kArenaAlignment == 0);
    for (size_t j = i + 1; j < bs.size(); ++j) {
      bool live_together = bs[i].first <= bs[j].last && bs[j].first <= bs[i].last;
      if (!live_together) continue;
      int64_t b0 = plan.storage_offset.at(bs[j].value), b1 = b0 + bs[j].bytes;
      if (a0 < b1 && b0 < a1) ++violations;
    }
  }
  CHECK(violations == 0);
}

}  // namespace

TEST_CASE("memory plan: on every model, live buffers never share bytes and the arena is at least the peak") {
  for (const auto& model : napkin::testing::model_files()) {
    CAPTURE(model);
    ir::Graph g = full_model(model);
    analysis::MemoryReport m = analysis::analyze_memory(g);
    analysis::MemoryPlan plan = analysis::plan_memory(m);
    check_no_overlap(m, plan);
    CHECK(plan.arena_bytes >= m.peak.bytes);
    CHECK(plan.liveness_peak == m.peak.bytes);
    // Without in-place reuse too (the report's comparison).
    analysis::MemoryReport separate = analysis::analyze_memory(g, {.in_place_reuse = false});
    analysis::MemoryPlan separate_plan = analysis::plan_memory(separate);
    check_no_overlap(separate, separate_plan);
    CHECK(separate.peak.bytes >= m.peak.bytes);
    CHECK(analysis::naive_bytes(separate) == analysis::naive_bytes(m));
    // The placement the plan uses is no worse than the other on any model
    // (docs/memory-planning.md has these numbers).
    analysis::MemoryPlan lowest = analysis::plan_memory(m, analysis::Placement::LowestFit);
    analysis::MemoryPlan best = analysis::plan_memory(m, analysis::Placement::BestFit);
    check_no_overlap(m, lowest);
    check_no_overlap(m, best);
    CHECK(plan.arena_bytes == std::min(lowest.arena_bytes, best.arena_bytes));
    MESSAGE(fmt::format("{}: naive {}, peak {}, lowest fit {}, best fit {}, no reuse: peak {} arena {}, reused {} buffers",
                        model.stem().string(), analysis::naive_bytes(m), m.peak.bytes, lowest.arena_bytes, best.arena_bytes,
                        separate.peak.bytes, separate_plan.arena_bytes, plan.in_place_buffers));
  }
}

TEST_CASE("memory plan: a chain of elementwise ops shares one buffer") {
  // h = x @ w; a = h + b; g = gelu(a); y = g * g; loss = sum(y). Each of a, g,
  // y is the last reader of the one before, element for element.
  ir::Graph g;
  ir::ValueId x = g.add_input("x", ty({4, 8}), {});
  ir::ValueId w = g.add_param("w", ty({8, 8}), {}, {});
  ir::ValueId bias = g.add_param("b", ty({8}), {}, {});
  ir::Builder b(g);
  ir::ValueId h = b.must(b.add(ir::Op::MatMul, {x, w}));
  ir::ValueId bb = b.must(b.add(ir::Op::Broadcast, {bias}, {{"shape", std::vector<int64_t>{4, 8}}}));
  ir::ValueId a = b.must(b.add(ir::Op::Add, {h, bb}));
  ir::ValueId ge = b.must(b.add(ir::Op::Gelu, {a}, {{"approximate", std::string("tanh")}}));
  ir::ValueId y = b.must(b.add(ir::Op::Mul, {ge, ge}));
  ir::ValueId loss = sum_all(b, y, 2);
  g.outputs.push_back({"loss", loss});
  REQUIRE(ir::verify(g).empty());

  analysis::MemoryReport m = analysis::analyze_memory(g);
  CHECK(find_buffer(m, h)->reuses == ir::kNoValue);
  CHECK(find_buffer(m, a)->reuses == h);
  CHECK(find_buffer(m, ge)->reuses == a);
  CHECK(find_buffer(m, y)->reuses == ge);
  CHECK(find_buffer(m, loss)->reuses == ir::kNoValue);  // a reduction never reuses
  // Positions: 0 matmul, 1 broadcast, 2 add, 3 gelu, 4 mul, 5 sum. Each donor
  // ends just before its taker starts: 128 bytes of activations at a time.
  CHECK(find_buffer(m, h)->last == 1);
  CHECK(find_buffer(m, a)->first == 2);
  CHECK(find_buffer(m, a)->last == 2);
  const int64_t resident = 128 + 256 + 32;
  CHECK(m.live_bytes == std::vector<int64_t>{resident + 128, resident + 128, resident + 128, resident + 128,
                                             resident + 128, resident + 128 + 4});
  analysis::MemoryPlan plan = analysis::plan_memory(m);
  CHECK(plan.in_place_buffers == 3);
  CHECK(plan.in_place_bytes == 3 * 128);
  CHECK(plan.storage_offset.at(a) == plan.storage_offset.at(h));
  CHECK(plan.storage_offset.at(ge) == plan.storage_offset.at(h));
  CHECK(plan.storage_offset.at(y) == plan.storage_offset.at(h));
  // Residents in 64-byte slots (x 128, w 256, b 64), the chain 128, the loss 64.
  CHECK(plan.arena_bytes == 128 + 256 + 64 + 128 + 64);

  // Without reuse each is its own buffer, and two are live at every op.
  analysis::MemoryReport separate = analysis::analyze_memory(g, {.in_place_reuse = false});
  CHECK(separate.peak.bytes == resident + 256);
  CHECK(analysis::plan_memory(separate).in_place_buffers == 0);
}

TEST_CASE("memory plan: no reuse when the input is read later, transposed or broadcast") {
  ir::Graph g;
  ir::ValueId x = g.add_input("x", ty({4, 4}), {});
  ir::ValueId w = g.add_param("w", ty({4, 4}), {}, {});
  ir::ValueId v = g.add_param("v", ty({4}), {}, {});
  ir::Builder b(g);
  ir::ValueId h = b.must(b.add(ir::Op::MatMul, {x, w}));
  ir::ValueId r = b.must(b.add(ir::Op::Relu, {h}));    // h is read again below: no reuse
  ir::ValueId s = b.must(b.add(ir::Op::Add, {r, h}));  // last reader of both: takes r's buffer
  ir::ValueId st = b.must(b.permute(s, {1, 0}));
  ir::ValueId t = b.must(b.add(ir::Op::Tanh, {st}));  // reads s transposed: no reuse
  // u: f32[4] (16 bytes) compared against t broadcast; the bool[4, 4] result
  // has the same 16 bytes, but reads u broadcast: no reuse of u.
  ir::ValueId u = sum_all(b, t, 1);
  ir::ValueId ub = b.must(b.add(ir::Op::Broadcast, {u}, {{"shape", std::vector<int64_t>{4, 4}}}));
  ir::ValueId less = b.must(b.add(ir::Op::Less, {ub, t}));
  ir::ValueId lf = b.must(b.add(ir::Op::Cast, {less}, {{"dtype", ir::DType::F32}}));
  ir::ValueId vb = b.must(b.add(ir::Op::Broadcast, {v}, {{"shape", std::vector<int64_t>{4, 4}}}));
  ir::ValueId out = b.must(b.add(ir::Op::Mul, {lf, vb}));
  g.outputs.push_back({"loss", sum_all(b, out, 2)});
  REQUIRE(ir::verify(g).empty());
  REQUIRE(g.value(u).type.bytes() == g.value(less).type.bytes());

  analysis::MemoryReport m = analysis::analyze_memory(g);
  CHECK(find_buffer(m, r)->reuses == ir::kNoValue);
  CHECK(find_buffer(m, s)->reuses == r);
  CHECK(find_buffer(m, t)->reuses == ir::kNoValue);
  CHECK(find_buffer(m, less)->reuses == ir::kNoValue);
  CHECK_FALSE(analysis::reads_element_for_element(g, g.node(g.value(t).producer), s));
  CHECK_FALSE(analysis::reads_element_for_element(g, g.node(g.value(less).producer), u));
  CHECK(analysis::reads_element_for_element(g, g.node(g.value(s).producer), h));
  CHECK_FALSE(analysis::reads_element_for_element(g, g.node(g.value(u).producer), t));  // a reduction
  CHECK_FALSE(analysis::reads_element_for_element(g, g.node(g.value(less).producer), h));  // does not read h
  // A resident (the param v) is never taken over, even by its last reader.
  CHECK(find_buffer(m, out)->reuses == lf);
  check_no_overlap(m, analysis::plan_memory(m));
}
