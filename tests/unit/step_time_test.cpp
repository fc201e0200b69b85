// The time model (analysis/step_time.h) against hand formulas on a device whose
// figures are round numbers: the kernels are the backend's kernels (one per
// fusion group or non-view node), each takes max(FLOPs/rate, bytes/bandwidth)
// plus the launch cost, contractions at peak x the GEMM efficiency of their
// narrowest dim, small kernels at the cache level's bandwidth.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "analysis/cost.h"
#include "analysis/step_time.h"
#include "codegen/plan.h"
#include "ir/fusion_group.h"
#include "report/kernel_table.h"
#include "support/test_models.h"

using namespace napkin;
using napkin::testing::compile_training;

namespace {

analysis::Device round_device() {
  analysis::Device d;
  d.name = "round";
  d.memory_bytes = 1e9;
  d.bandwidth_bytes_per_s = 1e10;  // 10 GB/s
  d.fp32_flops = 1e12;
  d.fp64_flops = 5e11;
  d.loop_flops = 1e11;
  d.launch_seconds = 1e-6;
  d.gemm_efficiency["f32"] = {{8, 0.25}, {32, 0.5}, {128, 1.0}};
  return d;
}

const char* kMlp = R"yaml(
model: mlp
dims: {batch: 64, d_in: 128, hidden: 32, classes: 8}
inputs:
  x: {shape: [batch, d_in]}
  labels: {shape: [batch], dtype: i32}
params:
  w1: {shape: [d_in, hidden], init: xavier}
  b1: {shape: [hidden], init: zeros}
  w2: {shape: [hidden, classes], init: xavier}
forward:
  - h: gelu(x @ w1 + b1)
  - logits: h @ w2
loss: cross_entropy(logits, labels)
optimizer: adamw(lr=1e-3)
)yaml";

}  // namespace

TEST_CASE("time model: one prediction per backend kernel, in schedule order") {
  ir::Graph g = compile_training(kMlp);
  analysis::Device d = round_device();
  analysis::StepTime t = analysis::predict_step_time(g, analysis::analyze_step(g, &d), d);
  codegen::KernelPlan plan = codegen::plan_kernels(g);
  REQUIRE(t.kernels.size() == plan.kernels.size());
  for (size_t i = 0; i < plan.kernels.size(); ++i) CHECK(t.kernels[i].node == plan.kernels[i].node);
  double sum = 0;
  for (const analysis::KernelTime& k : t.kernels) sum += k.seconds;
  CHECK(t.seconds == doctest::Approx(sum));
  CHECK(t.launch_seconds == doctest::Approx(1e-6 * static_cast<double>(t.kernels.size())));
  double classes = 0;
  for (double s : t.class_seconds) classes += s;
  CHECK(classes == doctest::Approx(t.seconds));
}

TEST_CASE("time model: a contraction runs at peak times the efficiency of its narrowest dim") {
  ir::Graph g = compile_training(kMlp);
  analysis::Device d = round_device();
  analysis::StepTime t = analysis::predict_step_time(g, analysis::analyze_step(g, &d), d);
  // The forward x @ w1: 64 x 128 @ 128 x 32, narrowest 32: half the peak.
  auto first = std::find_if(t.kernels.begin(), t.kernels.end(),
                            [](const analysis::KernelTime& k) { return k.kind == analysis::KernelClass::Matmul; });
  REQUIRE(first != t.kernels.end());
  CHECK(first->narrowest == 32);
  const double flops = 2.0 * 64 * 128 * 32, bytes = 4.0 * (64 * 128 + 128 * 32 + 64 * 32);
  CHECK(first->flops == flops);
  CHECK(first->bytes == bytes);
  CHECK(first->rate == doctest::Approx(0.5e12));
  CHECK(first->seconds == doctest::Approx(std::max(flops / 0.5e12, bytes / 1e10) + 1e-6));
  // h @ w2 has n = 8: a quarter of the peak; between points the curve is linear in log2(dim).
  CHECK(analysis::gemm_efficiency(d, ir::DType::F32, 8) == 0.25);
  CHECK(analysis::gemm_efficiency(d, ir::DType::F32, 64) == doctest::Approx(0.75));
  CHECK(analysis::gemm_efficiency(d, ir::DType::F32, 4096) == 1.0);
  CHECK(analysis::gemm_efficiency(d, ir::DType::F64, 8) == 1.0);  // no f64 curve: the peak itself
}

TEST_CASE("time model: the kernel roofline takes every kernel at peak rate or main-memory bandwidth, no launch") {
  ir::Graph g = compile_training(kMlp);
  analysis::Device d = round_device();
  analysis::StepCost cost = analysis::analyze_step(g, &d);
  analysis::StepTime t = analysis::predict_step_time(g, cost, d);
  double want = 0;
  for (const analysis::KernelTime& k : t.kernels) {
    // Matmuls at the fp32 peak (1e12, no GEMM efficiency), loops at the vector peak; bytes at 10 GB/s.
    const double rate = k.kind == analysis::KernelClass::Matmul ? 1e12 : analysis::vector_peak(d, ir::DType::F32);
    want += std::max(k.flops / rate, k.bytes / 1e10);
  }
  CHECK(t.roofline_seconds == doctest::Approx(want));
  // The forward x @ w1 alone: 2·64·128·32 FLOPs at 1e12 vs its bytes at 1e10: memory-bound.
  const double x_w1 = std::max(2.0 * 64 * 128 * 32 / 1e12, 4.0 * (64 * 128 + 128 * 32 + 64 * 32) / 1e10);
  CHECK(t.roofline_seconds > x_w1);
  CHECK(t.roofline_seconds < t.seconds - t.launch_seconds + 1e-12);  // no efficiency below 1, no launch
  CHECK(t.roofline_mfu == doctest::Approx(cost.total.flops / (t.roofline_seconds * 1e12)));
}

TEST_CASE("time model: a fusion group reads each input once and runs as one loop kernel") {
  ir::Graph g = compile_training(kMlp);
  analysis::Device d = round_device();
  analysis::StepTime t = analysis::predict_step_time(g, analysis::analyze_step(g, &d), d);
  ir::FusionGroups groups = ir::fusion_groups(g);
  REQUIRE_FALSE(groups.groups.empty());
  int seen = 0;
  for (const analysis::KernelTime& k : t.kernels) {
    if (k.group < 0) continue;
    // A batch's kernel does the work of each of its groups.
    const std::vector<int> members = k.batch >= 0 ? groups.batches[static_cast<size_t>(k.batch)].groups : std::vector<int>{k.group};
    double bytes = 0;
    for (int member : members) {
      ++seen;
      const ir::FusionGroup& fg = groups.groups[static_cast<size_t>(member)];
      for (ir::ValueId v : fg.inputs) bytes += ir::distinct_bytes(g, v);
      for (ir::ValueId v : fg.outputs) bytes += static_cast<double>(g.value(v).type.bytes());
    }
    CHECK(k.bytes == bytes);
    CHECK(k.rate == 1e11);  // loop kernels: the device's loop_flops
    CHECK(k.seconds == doctest::Approx(std::max(k.flops / 1e11, bytes / 1e10) + 1e-6));
    CHECK((k.kind == analysis::KernelClass::Elementwise || k.kind == analysis::KernelClass::Optimizer));
  }
  CHECK(seen == static_cast<int>(groups.groups.size()));
}

TEST_CASE("time model: an input comes from the cache when its buffer was touched recently enough") {
  ir::Graph g = compile_training(kMlp);
  analysis::Device d = round_device();
  d.cache_bandwidth_bytes_per_s = 1e11;
  // A cache that holds the whole step: every byte at the cache's bandwidth.
  d.cache_bytes = 1e12;
  analysis::StepTime all = analysis::predict_step_time(g, analysis::analyze_step(g, &d), d);
  for (const analysis::KernelTime& k : all.kernels)
    if (k.bytes > 0) CHECK(k.bandwidth == doctest::Approx(1e11));
  // A cache of one byte: every byte from main memory.
  d.cache_bytes = 1;
  analysis::StepTime none = analysis::predict_step_time(g, analysis::analyze_step(g, &d), d);
  for (const analysis::KernelTime& k : none.kernels)
    if (k.bytes > 1) CHECK(k.bandwidth == doctest::Approx(1e10));
  // A cache just larger than one kernel's traffic: the backward reads what
  // the forward wrote long before (main memory), while a kernel that reads
  // its predecessor's output gets that input from the cache.
  d.cache_bytes = 40000;
  analysis::StepTime some = analysis::predict_step_time(g, analysis::analyze_step(g, &d), d);
  int faster = 0, slower = 0;
  for (const analysis::KernelTime& k : some.kernels) {
    if (k.bytes == 0) continue;
    CHECK(k.bandwidth >= 1e10 * (1 - 1e-9));
    CHECK(k.bandwidth <= 1e11 * (1 + 1e-9));
    (k.bandwidth > 1.5e10 ? faster : slower) += 1;
  }
  CHECK(faster > 0);
  CHECK(slower > 0);
}

TEST_CASE("time model: GPT's kernels fall in every class, attention included") {
  ir::Graph g = compile_training(napkin::testing::read_source("models/gpt.yaml"), "models/gpt.yaml");
  const analysis::Device& cpu = *analysis::find_device("cpu");
  analysis::StepCost cost = analysis::analyze_step(g, &cpu);
  analysis::StepTime t = analysis::predict_step_time(g, cost, cpu);
  for (int c = 0; c < analysis::kNumKernelClasses; ++c) {
    CAPTURE(analysis::kernel_class_name(static_cast<analysis::KernelClass>(c)));
    // GPT's loss is inside the fused classifier, a matmul-class kernel (below).
    if (static_cast<analysis::KernelClass>(c) == analysis::KernelClass::Loss) continue;
    CHECK(t.class_seconds[c] > 0);
  }
  int classifier_kernels = 0;
  for (const analysis::KernelTime& k : t.kernels)
    if (ir::op_info(g.node(k.node).op).op_class == ir::OpClass::Classifier) {
      ++classifier_kernels;
      CHECK(k.kind == analysis::KernelClass::Matmul);
      CHECK(k.narrowest == double(g.value(g.node(k.node).in(0)).type.dims.back().size));  // d
    }
  CHECK(classifier_kernels == 2);
  // The fused attention kernels do the attention rows' FLOPs and their recompute.
  double attention_flops = 0, attention_rows = 0;
  for (const analysis::KernelTime& k : t.kernels)
    if (k.kind == analysis::KernelClass::Attention && k.narrowest > 0) attention_flops += k.flops;
  for (const analysis::OpRow& row : cost.rows)
    if (row.category == "attention") attention_rows += row.cost.flops + row.cost.recompute_flops;
  CHECK(attention_rows > 0);
  CHECK(attention_flops == attention_rows);
  CHECK(t.mfu > 0);
  CHECK(t.mfu <= 1);
}

TEST_CASE("contraction dims: a batch axis one operand lacks folds into m or n") {
  ir::Graph g = napkin::testing::compile(R"yaml(
model: dims
dims: {b: 4, t: 8, d: 16, e: 32, h: 2}
inputs:
  x: {shape: [b, t, d]}
  q: {shape: [b, h, t, d]}
  k: {shape: [b, h, t, d]}
params:
  w: {shape: [d, e], init: xavier}
forward:
  - y: x @ w
  - s: einsum(q, k, "b h t d, b h s d -> b h t s")
loss: mean(y) + mean(s)
optimizer: sgd(lr=0.1)
)yaml");
  std::vector<ir::ContractionDims> found;
  for (ir::NodeId id : g.schedule())
    if (ir::op_info(g.node(id).op).op_class == ir::OpClass::Contraction) found.push_back(ir::contraction_dims(g, g.node(id)));
  REQUIRE(found.size() == 2);
  CHECK(found[0].batch == 1);
  CHECK(found[0].m == 4 * 8);
  CHECK(found[0].n == 32);
  CHECK(found[0].k == 16);
  CHECK(found[1].batch == 4 * 2);
  CHECK(found[1].m == 8);
  CHECK(found[1].n == 8);
  CHECK(found[1].k == 16);
  CHECK(found[1].narrowest() == 8);
}

TEST_CASE("heaviest kernels: each kernel in one row, alike kernels across layers summed, most time first") {
  ir::Graph g = compile_training(napkin::testing::read_source("models/gpt.yaml"), "models/gpt.yaml");
  analysis::Device d = round_device();
  analysis::StepTime t = analysis::predict_step_time(g, analysis::analyze_step(g, &d), d);
  const std::vector<report::KernelKind> kinds = report::kernel_kinds(g, t);
  REQUIRE(kinds.size() > 5);
  int kernels = 0;
  double seconds = 0, bytes = 0, roofline = 0;
  for (size_t i = 0; i < kinds.size(); ++i) {
    kernels += kinds[i].count;
    seconds += kinds[i].seconds;
    bytes += kinds[i].bytes;
    roofline += kinds[i].roofline_seconds;
    if (i > 0) CHECK(kinds[i - 1].seconds >= kinds[i].seconds);
  }
  CHECK(kernels == static_cast<int>(t.kernels.size()));
  CHECK(seconds == doctest::Approx(t.seconds));
  CHECK(roofline == doctest::Approx(t.roofline_seconds));
  double step_bytes = 0;
  for (const analysis::KernelTime& k : t.kernels) step_bytes += k.bytes;
  CHECK(bytes == doctest::Approx(step_bytes));
  // gpt has 4 blocks: a kernel each block runs in its forward is one row of 4.
  bool found_layer_rows = false;
  for (const report::KernelKind& k : kinds) found_layer_rows = found_layer_rows || (k.phase == "forward" && k.count == 4);
  CHECK(found_layer_rows);
  const std::string text = report::kernel_table_text(kinds, t.seconds, 3);
  CHECK(text.find("heaviest kernels") != std::string::npos);
  CHECK(text.find(fmt::format("{} other kinds of kernel", kinds.size() - 3)) != std::string::npos);
  CHECK(report::kernel_table_json(kinds).size() == kinds.size());
}
