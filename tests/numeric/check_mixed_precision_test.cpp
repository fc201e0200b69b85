// napkin check's low-precision line can fail: mixed-precision bugs that leave
// the float64 gradients right (the rules are fine, the roundings are not)
// make it fail, while the same graphs without the bug pass. Each bug is a
// real one, put in by configuration or by a test-only edit of the training
// graph after the pipeline:
//  - fp16-mixed without loss scaling (a scale of 1): gradients under f16's
//    normal range are flushed or lose their digits;
//  - a missing unscale: a gradient 65536 times too large;
//  - a cast dropped before the unscale: the scaled f16 gradient unscaled in
//    f16, where the true gradient underflows;
//  - a wrong cast: bf16-mixed's backward casts to f16 instead of bf16 (the two
//    16-bit formats mixed up), where the gradients are below f16's range.
// The model's loss is small (1e-4 · mse), so its gradients are ~1e-6: well
// inside bf16's range (f32's exponent), below f16's smallest normal
// (6.1e-5), which is what loss scaling is for; 1e-8 · mse for the wrong cast.
//
// NAPKIN_NUMERIC_VERBOSE=1 prints each check's errors and tolerances.
#include <doctest/doctest.h>

#include <cstdlib>
#include <iostream>
#include <regex>
#include <string>

#include <fmt/format.h>

#include "interp/gradient_check.h"
#include "ir/builder.h"
#include "support/test_io.h"
#include "support/test_models.h"

using namespace napkin;
using ir::DType;
using ir::Op;
using ir::ValueId;

namespace {

// loss = factor · mse: gradients ~1e-2 · factor.
std::string small_gradients_model(const std::string& precision, const std::string& factor = "0.0001") {
  return R"yaml(
model: small-gradients
dims: {batch: 8, d: 16, hidden: 32}
inputs:
  x: {shape: [batch, d]}
  y: {shape: [batch, d]}
params:
  w1: {shape: [d, hidden], init: xavier}
  w2: {shape: [hidden, d], init: xavier}
forward:
  - h: gelu(x @ w1)
  - pred: h @ w2
loss: mse(pred, y) * )yaml" + factor + R"yaml(
optimizer: sgd(lr=0.1)
precision: )yaml" + precision + "\n";
}

interp::GradCheckResult check(const ir::Graph& g) {
  interp::GradCheckOptions options;
  options.samples = 8;
  interp::GradCheckResult r = interp::check_gradients(g, options);
  if (std::getenv("NAPKIN_NUMERIC_VERBOSE"))
    for (const interp::TensorCheck& t : r.tensors)
      std::cout << fmt::format("  {:<4} f64 {:8.1e} / {:6.0e}  native {:8.1e} / {:8.1e}  {}\n", t.name, t.error_f64,
                               t.tolerance_f64, t.error_native, t.tolerance_native, t.passed ? "ok" : "FAIL");
  return r;
}

// Every tensor's float64 gradient passes: the rules are right, whatever the bug.
void require_rules_right(const interp::GradCheckResult& r) {
  for (const interp::TensorCheck& t : r.tensors) {
    CAPTURE(t.name);
    CHECK(t.error_f64 <= t.tolerance_f64);
  }
}

const interp::TensorCheck& tensor(const interp::GradCheckResult& r, const std::string& name) {
  for (const interp::TensorCheck& t : r.tensors)
    if (t.name == name) return t;
  FAIL("no gradient check of " << name);
  throw;  // unreachable: FAIL throws
}

void require_passes(const ir::Graph& g) {
  interp::GradCheckResult r = check(g);
  for (const interp::TensorCheck& t : r.tensors) {
    CAPTURE(t.name);
    CAPTURE(t.error_native);
    CAPTURE(t.tolerance_native);
    CHECK(t.passed);
  }
  REQUIRE(r.passed);
}

// The output "grad.<param>" now reads `v` (the check reads outputs).
void redirect_output(ir::Graph& g, const std::string& label, ValueId v) {
  for (auto& [name, value] : g.outputs)
    if (name == label) value = v;
}

// grad.w2 under fp16-mixed is unscale(cast(dW16, f32)): the unscale node.
const ir::Node& unscale_of_w2(const ir::Graph& g) {
  const ir::Node& unscale = g.node(g.value(g.find_output("grad.w2")).producer);
  REQUIRE(unscale.op == Op::Mul);
  return unscale;
}

}  // namespace

TEST_CASE("numeric: napkin check fails fp16-mixed without loss scaling and passes it with") {
  require_passes(napkin::testing::compile_training(small_gradients_model("fp16-mixed")));
  require_passes(napkin::testing::compile_training(small_gradients_model("bf16-mixed")));

  // A scale of 1 is no scaling: the f16 backward underflows.
  ir::Graph g = napkin::testing::compile_training(small_gradients_model("{policy: fp16-mixed, loss_scale: {init: 1}}"));
  interp::GradCheckResult r = check(g);
  require_rules_right(r);
  CHECK_FALSE(r.passed);
  for (const interp::TensorCheck& t : r.tensors) {
    CAPTURE(t.name);
    CHECK_FALSE(t.passed);
    CHECK(t.error_native > 10 * t.tolerance_native);
  }
}

TEST_CASE("numeric: napkin check fails a missing loss-scale unscale on that gradient only") {
  ir::Graph g = napkin::testing::compile_training(small_gradients_model("fp16-mixed"));
  redirect_output(g, "grad.w2", unscale_of_w2(g).inputs[0]);  // the scaled gradient, as it was before the unscale
  interp::GradCheckResult r = check(g);
  CHECK_FALSE(r.passed);
  CHECK_FALSE(tensor(r, "w2").passed);
  CHECK(tensor(r, "w2").error_native > 0.99);  // 65536 times too large: relative error 1 - 1/65536
  CHECK(tensor(r, "w1").passed);
}

TEST_CASE("numeric: napkin check fails a gradient unscaled in f16 because its cast to f32 was dropped before the unscale") {
  ir::Graph g = napkin::testing::compile_training(small_gradients_model("fp16-mixed"));
  const ir::Node unscale = unscale_of_w2(g);
  const ir::Node& up = g.node(g.value(unscale.inputs[0]).producer);  // cast(dW16, f32)
  REQUIRE(up.op == Op::Cast);
  const ValueId scaled16 = up.inputs[0];
  REQUIRE(g.value(scaled16).type.dtype == DType::F16);
  ir::Builder b(g);
  b.set_phase(ir::Phase::Backward);
  ValueId inverse16 = b.must(b.add(Op::Cast, {unscale.inputs[1]}, {{"dtype", DType::F16}}));
  ValueId unscaled16 = b.must(b.add(Op::Mul, {scaled16, inverse16}));
  REQUIRE(g.value(unscaled16).type.dtype == DType::F16);
  redirect_output(g, "grad.w2", b.must(b.add(Op::Cast, {unscaled16}, {{"dtype", DType::F32}})));

  interp::GradCheckResult r = check(g);
  require_rules_right(r);
  CHECK_FALSE(r.passed);
  CHECK_FALSE(tensor(r, "w2").passed);
  CHECK(tensor(r, "w1").passed);
}

TEST_CASE("numeric: napkin check fails bf16-mixed whose backward casts to f16 instead of bf16") {
  // Gradients ~1e-10: far below f16's range, ordinary for bf16 (f32's exponent).
  const std::string model = small_gradients_model("bf16-mixed", "0.00000001");
  require_passes(napkin::testing::compile_training(model));
  ir::Graph g = napkin::testing::compile_training(model);
  int changed = 0;
  for (ir::NodeId id : g.schedule()) {
    ir::Node& n = g.node(id);
    if (n.phase != ir::Phase::Backward || n.op != Op::Cast || g.value(n.out()).type.dtype != DType::BF16) continue;
    n.attrs.set("dtype", DType::F16);
    g.value(n.out()).type.dtype = DType::F16;
    ++changed;
  }
  REQUIRE(changed > 0);
  interp::GradCheckResult r = check(g);
  require_rules_right(r);
  CHECK_FALSE(r.passed);
  for (const interp::TensorCheck& t : r.tensors) {
    CAPTURE(t.name);
    CHECK_FALSE(t.passed);
  }
}

// The command line: the shipped mlp in bf16-mixed (its w2 failed at 5.0e-1
// against a fixed bf16 tolerance of 1e-1), cruncher in fp16-mixed (its first
// steps overflow f16 at the initial scale), and the small-gradient model
// without loss scaling (exit 1).
TEST_CASE("numeric: napkin check passes the shipped models in mixed precision on the command line and fails a bug") {
  napkin::testing::TempDir dir("check-mixed");
  auto with_policy = [&](const std::string& model, const std::string& policy) {
    std::string text = std::regex_replace(napkin::testing::read_source("models/" + model + ".yaml"),
                                          std::regex("\nprecision: fp32\n"), "\nprecision: " + policy + "\n");
    REQUIRE(text.find("\nprecision: " + policy + "\n") != std::string::npos);
    std::string path = dir / (model + "-" + policy + ".yaml");
    napkin::testing::write_bytes(path, text);
    return path;
  };
  auto check_cli = [](const std::string& path, const std::string& flags) {
    return napkin::testing::run_in_source_tree(fmt::format("{} check {} {}", NAPKIN_BINARY, path, flags));
  };

  auto mlp = check_cli(with_policy("mlp", "bf16-mixed"), "--dims batch=4,d_in=12,hidden=16 --seed 0");
  INFO(mlp.out);
  CHECK(mlp.status == 0);
  CHECK(mlp.out.find("PASS: all 6 gradients match") != std::string::npos);
  CHECK(mlp.out.find("dtype err       tol") != std::string::npos);

  auto cruncher = check_cli(with_policy("cruncher", "fp16-mixed"), "--dims batch=4,d=16 --seed 0");
  INFO(cruncher.out);
  CHECK(cruncher.status == 0);
  CHECK(cruncher.out.find("loss scale 4096: the first 4 steps overflow and are skipped, as in training") !=
        std::string::npos);

  std::string unscaled = dir / "unscaled.yaml";
  napkin::testing::write_bytes(unscaled, small_gradients_model("{policy: fp16-mixed, loss_scale: {init: 1}}"));
  auto bug = check_cli(unscaled, "");
  INFO(bug.out);
  CHECK(bug.status == 1);
  CHECK(bug.out.find("FAIL: 2 of 2 gradients disagree with finite differences") != std::string::npos);
}
