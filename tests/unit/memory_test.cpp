// The memory of a training step against hand counts: category totals, per-dtype
// split, live ranges through views, saved activations, the peak and its
// breakdown, per-phase peaks, updates written in place (or not), and the
// forward peak of a compiled MLP.
#include <doctest/doctest.h>

#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <vector>

#include "analysis/memory.h"
#include "ir/builder.h"
#include "ir/verifier.h"
#include "support/test_models.h"

using namespace napkin;
using analysis::MemoryCategory;

namespace {

// The liveness rules by hand, each buffer its own memory; in-place reuse is
// tested in memory_plan_test.cpp.
const analysis::MemoryOptions kNoReuse{.in_place_reuse = false};

ir::TensorType ty(std::vector<int64_t> sizes, ir::DType dtype = ir::DType::F32) {
  ir::TensorType t;
  t.dtype = dtype;
  for (int64_t s : sizes) t.dims.push_back({s, ""});
  return t;
}

// A training-like step by hand. Bytes (f32 unless said):
//   x input [2,4] 32, w param [4,8] 128, c param bf16[8] 16, m state [4,8] 128
//   -> resident 304.
// position  phase      node                        buffer
//   0       forward    h = matmul(x, w)            h [2,8] 64
//   1       forward    hv = reshape(h, [16])       (view of h)
//   2       forward    r = relu(h)                 r 64
//   3       forward    loss = reduce_sum(r)        loss 4 (output "loss")
//   4       backward   one = constant 1            one 4
//   5       backward   d = mul(hv, one)            d [16] 64   (reads h through hv)
//   6       backward   dv = reshape(d, [2,8])      (view of d)
//   7       backward   xt = permute(x)             (view of x)
//   8       backward   gw = matmul(xt, dv)         gw [4,8] 128 (output "grad.w")
//   9       optimizer  m_new = add(m, gw)          update m <- m_new
//  10       optimizer  w_new = sub(w, m_new)       update w <- w_new
struct Step {
  ir::Graph g;
  ir::ValueId x, w, c, m, h, hv, r, loss, one, d, gw, m_new, w_new;
};

void build_step(Step& s) {
  ir::Graph& g = s.g;
  s.x = g.add_input("x", ty({2, 4}), {});
  s.w = g.add_param("w", ty({4, 8}), {}, {});
  s.c = g.add_param("c", ty({8}, ir::DType::BF16), {}, {});
  s.m = g.add_state("m", ty({4, 8}), {});
  ir::Builder b(g);
  s.h = b.must(b.add(ir::Op::MatMul, {s.x, s.w}));
  s.hv = b.must(b.reshape(s.h, {{16, ""}}));
  s.r = b.must(b.add(ir::Op::Relu, {s.h}));
  s.loss = b.must(b.add(ir::Op::ReduceSum, {s.r}, {{"axes", std::vector<int64_t>{0, 1}}, {"keepdims", int64_t{0}}}));
  g.outputs.push_back({"loss", s.loss});
  b.set_phase(ir::Phase::Backward);
  s.one = b.must(b.constant(1.0, ir::DType::F32));
  s.d = b.must(b.add(ir::Op::Mul, {s.hv, s.one}));
  ir::ValueId dv = b.must(b.reshape(s.d, {{2, ""}, {8, ""}}));
  ir::ValueId xt = b.must(b.permute(s.x, {1, 0}));
  s.gw = b.must(b.add(ir::Op::MatMul, {xt, dv}));
  g.outputs.push_back({"grad.w", s.gw});
  b.set_phase(ir::Phase::Optimizer);
  s.m_new = b.must(b.add(ir::Op::Add, {s.m, s.gw}));
  s.w_new = b.must(b.add(ir::Op::Sub, {s.w, s.m_new}));
  g.updates.push_back({s.m, s.m_new});
  g.updates.push_back({s.w, s.w_new});
}

const analysis::MemoryBuffer* find_buffer(const analysis::MemoryReport& r, ir::ValueId v) {
  for (const analysis::MemoryBuffer& b : r.buffers)
    if (b.value == v) return &b;
  return nullptr;
}

}  // namespace

TEST_CASE("memory: category totals and the per-dtype split") {
  Step s;
  build_step(s);
  REQUIRE(ir::verify(s.g).empty());
  analysis::MemoryReport r = analysis::analyze_memory(s.g, kNoReuse);
  CHECK(r.has_backward);
  CHECK(r.resident_bytes == 304);
  CHECK(r.category_bytes(MemoryCategory::Parameters) == 128 + 16);
  CHECK(r.category_bytes(MemoryCategory::OptimizerState) == 128);
  CHECK(r.category_bytes(MemoryCategory::Inputs) == 32);
  CHECK(r.category_bytes(MemoryCategory::Gradients) == 128);
  CHECK(r.category_bytes(MemoryCategory::SavedActivations) == 64);         // h
  CHECK(r.category_bytes(MemoryCategory::Temporaries) == 64 + 4 + 4 + 64);  // r, loss, one, d
  CHECK(r.category_bytes_by_dtype(MemoryCategory::Parameters) ==
        std::map<ir::DType, int64_t>{{ir::DType::F32, 128}, {ir::DType::BF16, 16}});
  CHECK(r.category_bytes_by_dtype(MemoryCategory::Gradients) == std::map<ir::DType, int64_t>{{ir::DType::F32, 128}});
  CHECK(r.category_bytes_by_dtype(MemoryCategory::SavedActivations).size() == 1);
  // One buffer per owning value that costs bytes: 4 resident, h r loss one d gw.
  CHECK(r.buffers.size() == 10);
  CHECK(analysis::memory_category_name(MemoryCategory::SavedActivations) == "saved activations");
  CHECK(analysis::memory_category_name(MemoryCategory::OptimizerState) == "optimizer state");
}

TEST_CASE("memory: a view extends its buffer's lifetime - forward buffers read by backward are saved") {
  Step s;
  build_step(s);
  analysis::MemoryReport r = analysis::analyze_memory(s.g, kNoReuse);
  // h is read directly only up to relu (position 2), but backward reads its
  // view hv at position 5.
  const analysis::MemoryBuffer* h = find_buffer(r, s.h);
  REQUIRE(h);
  CHECK(h->first == 0);
  CHECK(h->last == 5);
  CHECK(h->category == MemoryCategory::SavedActivations);
  CHECK(h->bytes == 64);
  CHECK(h->name == fmt::format("%{}", s.h));
  // No view of hv's own: it has no buffer.
  CHECK(find_buffer(r, s.hv) == nullptr);
  // r is forward and read only in the forward: a temporary.
  const analysis::MemoryBuffer* rb = find_buffer(r, s.r);
  REQUIRE(rb);
  CHECK(rb->category == MemoryCategory::Temporaries);
  CHECK(rb->first == 2);
  CHECK(rb->last == 3);
  // d is read only through the view dv, by the matmul at position 8.
  const analysis::MemoryBuffer* d = find_buffer(r, s.d);
  REQUIRE(d);
  CHECK(d->first == 5);
  CHECK(d->last == 8);
  // Outputs stay to the end of the step (position 10).
  CHECK(find_buffer(r, s.loss)->last == 10);
  CHECK(find_buffer(r, s.gw)->first == 8);
  CHECK(find_buffer(r, s.gw)->last == 10);
  CHECK(find_buffer(r, s.gw)->category == MemoryCategory::Gradients);
  // Residents span the whole step.
  const analysis::MemoryBuffer* w = find_buffer(r, s.w);
  REQUIRE(w);
  CHECK(w->resident);
  CHECK(w->first == 0);
  CHECK(w->last == 10);
}

TEST_CASE("memory: live bytes per position, the peak and its breakdown") {
  Step s;
  build_step(s);
  analysis::MemoryReport r = analysis::analyze_memory(s.g, kNoReuse);
  // 304 resident plus: h | h | h r | h r loss | h loss one | h loss one d |
  // loss d | loss d | loss d gw | loss gw | loss gw.
  CHECK(r.live_bytes == std::vector<int64_t>{368, 368, 432, 436, 376, 440, 372, 372, 500, 436, 436});
  const analysis::MemoryPeak& p = r.peak;
  REQUIRE(p.found);
  CHECK(p.position == 8);
  CHECK(p.node == s.g.value(s.gw).producer);
  CHECK(p.phase == ir::Phase::Backward);
  CHECK(p.bytes == 500);
  CHECK(p.category_bytes(MemoryCategory::Parameters) == 144);
  CHECK(p.category_bytes(MemoryCategory::OptimizerState) == 128);
  CHECK(p.category_bytes(MemoryCategory::Inputs) == 32);
  CHECK(p.category_bytes(MemoryCategory::Gradients) == 128);
  CHECK(p.category_bytes(MemoryCategory::SavedActivations) == 0);  // h died at 5
  CHECK(p.category_bytes(MemoryCategory::Temporaries) == 68);      // loss, d
  // Largest first; equal sizes by value id (w, m, gw all 128).
  std::vector<std::string> names;
  std::vector<int64_t> bytes;
  for (const analysis::MemoryBuffer& b : p.live) {
    names.push_back(b.name);
    bytes.push_back(b.bytes);
  }
  CHECK(names == std::vector<std::string>{"w", "m", fmt::format("%{}", s.gw), fmt::format("%{}", s.d), "x", "c",
                                          fmt::format("%{}", s.loss)});
  CHECK(bytes == std::vector<int64_t>{128, 128, 128, 64, 32, 16, 4});
  CHECK(p.live[2].category == MemoryCategory::Gradients);
  CHECK(p.live[2].producer == s.g.value(s.gw).producer);
}

TEST_CASE("memory: the peak of each phase") {
  Step s;
  build_step(s);
  analysis::MemoryReport r = analysis::analyze_memory(s.g, kNoReuse);
  const analysis::MemoryPeak& f = r.phase_peak(ir::Phase::Forward);
  REQUIRE(f.found);
  CHECK(f.position == 3);
  CHECK(f.bytes == 436);
  CHECK(f.phase == ir::Phase::Forward);
  CHECK(f.category_bytes(MemoryCategory::SavedActivations) == 64);  // h
  CHECK(f.category_bytes(MemoryCategory::Temporaries) == 68);       // r, loss
  CHECK(f.category_bytes(MemoryCategory::Gradients) == 0);
  CHECK(f.live.size() == 7);  // 4 resident + h r loss
  const analysis::MemoryPeak& b = r.phase_peak(ir::Phase::Backward);
  REQUIRE(b.found);
  CHECK(b.position == 8);
  CHECK(b.bytes == 500);
  const analysis::MemoryPeak& o = r.phase_peak(ir::Phase::Optimizer);
  REQUIRE(o.found);
  CHECK(o.position == 9);  // 9 and 10 tie: the first
  CHECK(o.bytes == 436);
  CHECK(o.phase == ir::Phase::Optimizer);
  CHECK(o.category_bytes(MemoryCategory::Gradients) == 128);
  CHECK(o.category_bytes(MemoryCategory::Temporaries) == 4);  // the loss
}

TEST_CASE("memory: updates written in place cost nothing") {
  Step s;
  build_step(s);
  analysis::MemoryReport r = analysis::analyze_memory(s.g, kNoReuse);
  REQUIRE(r.updates.size() == 2);
  CHECK(r.updates[0].target == s.m);
  CHECK(r.updates[0].in_place);
  CHECK(r.updates[1].target == s.w);
  CHECK(r.updates[1].in_place);
  CHECK(find_buffer(r, s.m_new) == nullptr);
  CHECK(find_buffer(r, s.w_new) == nullptr);
  CHECK(r.live_bytes[9] == 304 + 4 + 128);  // m_new lives in m's buffer
  CHECK(r.live_bytes[10] == 304 + 4 + 128);
}

TEST_CASE("memory: an update whose target is read later is counted apart") {
  Step s;
  build_step(s);
  // Position 11 reads the old w after w_new (position 10) is made: w_new
  // cannot overwrite w, so it is a separate 128-byte buffer to the end.
  ir::Builder b(s.g);
  b.set_phase(ir::Phase::Optimizer);
  ir::ValueId late = b.must(b.add(ir::Op::Mul, {s.w, s.w}));
  s.g.outputs.push_back({"late", late});
  REQUIRE(ir::verify(s.g).empty());
  analysis::MemoryReport r = analysis::analyze_memory(s.g, kNoReuse);
  REQUIRE(r.updates.size() == 2);
  CHECK(r.updates[0].in_place);  // m is not read after m_new
  CHECK_FALSE(r.updates[1].in_place);
  const analysis::MemoryBuffer* w_new = find_buffer(r, s.w_new);
  REQUIRE(w_new);
  CHECK(w_new->category == MemoryCategory::Parameters);
  CHECK(w_new->update_of == s.w);
  CHECK(w_new->first == 10);
  CHECK(w_new->last == 11);
  CHECK(r.category_bytes(MemoryCategory::Parameters) == 144 + 128);
  CHECK(r.category_bytes_by_dtype(MemoryCategory::Parameters).at(ir::DType::F32) == 256);
  // 304 + loss 4 + gw 128 + w_new 128 + late 128 at position 11.
  CHECK(r.live_bytes[11] == 692);
  CHECK(r.peak.position == 11);
  CHECK(r.peak.category_bytes(MemoryCategory::Parameters) == 272);
}

TEST_CASE("memory: a non-elementwise producer reading its target is not in place") {
  ir::Graph g;
  ir::ValueId st = g.add_state("s", ty({4, 4}), {});
  ir::ValueId p = g.add_param("p", ty({4, 4}), {}, {});
  ir::Builder b(g);
  b.set_phase(ir::Phase::Optimizer);
  ir::ValueId s_new = b.must(b.add(ir::Op::MatMul, {st, st}));  // reads all of s for each element
  ir::ValueId pt = b.must(b.permute(p, {1, 0}));
  ir::ValueId p_new = b.must(b.add(ir::Op::Add, {pt, s_new}));  // reads p through a transpose
  g.updates.push_back({st, s_new});
  g.updates.push_back({p, p_new});
  REQUIRE(ir::verify(g).empty());
  analysis::MemoryReport r = analysis::analyze_memory(g, kNoReuse);
  CHECK_FALSE(r.has_backward);
  REQUIRE(r.updates.size() == 2);
  CHECK_FALSE(r.updates[0].in_place);
  CHECK_FALSE(r.updates[1].in_place);
  CHECK(r.category_bytes(MemoryCategory::OptimizerState) == 128);
  CHECK(r.category_bytes(MemoryCategory::Parameters) == 128);
  CHECK(r.live_bytes == std::vector<int64_t>{192, 192, 256});
  CHECK(r.peak.bytes == 256);
  CHECK_FALSE(r.phase_peak(ir::Phase::Forward).found);
  CHECK(r.phase_peak(ir::Phase::Optimizer).found);
}

TEST_CASE("memory: a compiled MLP's forward peak equals the hand count") {
  ir::Graph g = napkin::testing::compile(R"yaml(
model: tiny
dims: {batch: 4, d_in: 8, hidden: 16, classes: 3}
inputs:
  x: {shape: [batch, d_in]}
  labels: {shape: [batch], dtype: i32}
params:
  w1: {shape: [d_in, hidden], init: xavier}
  b1: {shape: [hidden], init: zeros}
  w2: {shape: [hidden, classes], init: xavier}
  b2: {shape: [classes], init: zeros}
forward:
  - h: relu(x @ w1 + b1)
  - logits: h @ w2 + b2
loss: cross_entropy(logits, labels)
optimizer: sgd(lr=0.1)
)yaml");
  analysis::MemoryReport r = analysis::analyze_memory(g, kNoReuse);
  CHECK_FALSE(r.has_backward);
  // Resident: x 128 + labels 16; w1 512 + b1 64 + w2 192 + b2 12 = 780.
  CHECK(r.category_bytes(MemoryCategory::Inputs) == 144);
  CHECK(r.category_bytes(MemoryCategory::Parameters) == 780);
  CHECK(r.category_bytes(MemoryCategory::SavedActivations) == 0);
  CHECK(r.category_bytes(MemoryCategory::Gradients) == 0);
  // Schedule: matmul 256 | add 256 | relu 256 | matmul 48 | add 48 | cross_entropy 4.
  // Live: x@w1 | x@w1, +b1 | +b1, h | h, h@w2 | h@w2, logits | logits, loss.
  CHECK(r.live_bytes == std::vector<int64_t>{924 + 256, 924 + 512, 924 + 512, 924 + 304, 924 + 96, 924 + 52});
  CHECK(r.category_bytes(MemoryCategory::Temporaries) == 3 * 256 + 2 * 48 + 4);
  // The add and the relu tie at 1436: the first is the peak.
  REQUIRE(r.peak.found);
  CHECK(r.peak.bytes == 1436);
  CHECK(r.peak.position == 1);
  CHECK(g.node(r.peak.node).op == ir::Op::Add);
  CHECK(r.peak.category_bytes(MemoryCategory::Temporaries) == 512);
  CHECK(r.peak.live.front().name == "w1");
  CHECK(r.peak.live.front().line == 8);  // its declaration in the YAML above
  CHECK(r.phase_peak(ir::Phase::Forward).bytes == 1436);
  CHECK_FALSE(r.phase_peak(ir::Phase::Backward).found);
  CHECK_FALSE(r.phase_peak(ir::Phase::Optimizer).found);
  // The loss is an output: it lives to the end (the last position).
  ir::ValueId loss = g.find_output("loss");
  for (const analysis::MemoryBuffer& b : r.buffers)
    if (b.value == loss) CHECK(b.last == 5);
}
