// Mixed precision (passes/mixed_precision, fp8_scaling, loss_scaling), in the
// reference interpreter: where the casts go (count, placement, reasons) for
// bf16-mixed versions of models/mlp.yaml and models/gpt.yaml; that the fp32
// policy changes nothing; the bf16-mixed step's loss and gradients against
// the fp32 step's; fp32 overrides; fp16 dynamic loss scaling (underflow
// without it, training with it, a skipped step on Inf, growth); fp8
// quantization against the E4M3 error bound and with tiny magnitudes.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "analysis/cost.h"
#include "analysis/memory.h"
#include "frontend/frontend.h"
#include "interp/interpreter.h"
#include "ir/printer.h"
#include "ir/quantities.h"
#include "passes/mixed_precision.h"
#include "passes/pipeline.h"
#include "report/amp_audit.h"
#include "report/report.h"
#include "support/test_models.h"

using namespace napkin;
using interp::Interpreter;
using interp::Numerics;
using ir::DType;
using ir::ValueId;

namespace {

// `text` with its `precision: fp32` line replaced by `precision: <precision>`.
std::string with_precision(std::string text, const std::string& precision) {
  const std::string line = "precision: fp32";
  size_t at = text.find(line);
  REQUIRE(at != std::string::npos);
  return text.replace(at, line.size(), "precision: " + precision);
}

// models/<stem>.yaml at the small dims of the numeric tests, with another
// precision line, through the training pipeline (forward_only: the forward pipeline).
ir::Graph compile_model(const std::string& stem, const std::string& precision, bool forward_only = false) {
  std::string text = with_precision(napkin::testing::read_source("models/" + stem + ".yaml"), precision);
  ir::Diagnostics diag;
  frontend::LoadOptions options;
  options.dim_overrides = napkin::testing::small_dims().at(stem);
  std::optional<ir::Graph> g = frontend::load_model_text(text, "models/" + stem + ".yaml", diag, options);
  if (g) forward_only ? passes::run_forward_pipeline(*g, diag) : passes::run_training_pipeline(*g, diag);
  INFO(diag.render());
  REQUIRE(g.has_value());
  REQUIRE_FALSE(diag.has_errors());
  return std::move(*g);
}

std::vector<ir::NodeId> nodes_of(const ir::Graph& g, ir::Op op, ir::Phase phase) {
  std::vector<ir::NodeId> out;
  for (ir::NodeId id : g.schedule())
    if (g.node(id).op == op && g.node(id).phase == phase) out.push_back(id);
  return out;
}

DType dtype(const ir::Graph& g, ValueId v) { return g.value(v).type.dtype; }
std::string reason(const ir::Graph& g, ir::NodeId cast) {
  const ir::Attrs& a = g.node(cast).attrs;
  return a.has(passes::kAmpCastAttr) ? a.get_string(passes::kAmpCastAttr) : "";
}
const std::string& name_of(const ir::Graph& g, ValueId v) { return g.value(v).name; }

ValueId named(const ir::Graph& g, const std::string& name) {
  for (ValueId v = 0; v < g.num_values(); ++v)
    if (g.value(v).name == name) return v;
  FAIL("no value named " << name);
  return ir::kNoValue;
}

// Runs one step of g in Native numerics from seed-0 params and inputs
// (`inputs` replaces some of them); returns the interpreter after run().
Interpreter run_step(const ir::Graph& g, const std::map<ValueId, std::vector<double>>& inputs = {}) {
  Interpreter it(g, Numerics::Native);
  it.set(interp::initial_values(g, 0));
  it.set(interp::random_inputs(g, 0));
  it.set(inputs);
  it.run();
  return it;
}

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

// max |a - b| / max |b|.
double relative_error(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(a[i] - b[i]));
  return worst / std::max(max_abs(b), 1e-300);
}

}  // namespace

TEST_CASE("mixed precision: the fp32 policy leaves the graph as it is") {
  for (const std::string stem : {"mlp", "gpt"}) {
    CAPTURE(stem);
    ir::Graph g = compile_model(stem, "fp32", true);
    std::string before = ir::print_graph(g);
    ir::Diagnostics diag;
    CHECK_FALSE(passes::make_mixed_precision_pass()->run(g, diag));
    CHECK(ir::print_graph(g) == before);
    // ... and the training step has no cast at all.
    ir::Graph step = compile_model(stem, "fp32");
    for (ir::Phase p : {ir::Phase::Forward, ir::Phase::Backward})
      CHECK(nodes_of(step, ir::Op::Cast, p).empty());
  }
}

TEST_CASE("mixed precision: mlp bf16-mixed casts each weight once, matmuls in bf16, the loss in f32") {
  ir::Graph g = compile_model("mlp", "bf16-mixed");
  std::map<std::string, int> reasons;
  std::map<std::string, int> param_casts;
  for (ir::NodeId id : nodes_of(g, ir::Op::Cast, ir::Phase::Forward)) {
    const ir::Node& n = g.node(id);
    ++reasons[reason(g, id)];
    if (g.value(n.in(0)).kind == ir::ValueKind::Param) {
      ++param_casts[name_of(g, n.in(0))];
      CHECK(dtype(g, n.out()) == DType::BF16);
      CHECK(reason(g, id) == "param low-precision copy");
    }
  }
  // images, h1 and h2 into the matmuls. Every matmul's bias add (and gelu)
  // is its GEMM's epilogue (passes/fuse_gemm_epilogues.h): each accumulates
  // into f32 directly, no promotion; the two gelus' inputs are stored in
  // bf16 for their gradients.
  CHECK(param_casts == std::map<std::string, int>{{"w1", 1}, {"w2", 1}, {"w3", 1}});
  CHECK(reasons == std::map<std::string, int>{
                       {"param low-precision copy", 3}, {"matmul input", 3}, {"gelu input for its gradient", 2}});
  std::vector<ir::NodeId> matmuls = nodes_of(g, ir::Op::MatMul, ir::Phase::Forward);
  REQUIRE(matmuls.size() == 3);
  for (ir::NodeId id : matmuls) {
    const ir::Node& n = g.node(id);
    CHECK(dtype(g, n.in(0)) == DType::BF16);
    CHECK(dtype(g, n.in(1)) == DType::BF16);
    CHECK(dtype(g, n.out()) == DType::F32);
    CHECK(n.group >= 0);
  }
  CHECK(dtype(g, named(g, "logits")) == DType::F32);
  std::vector<ir::NodeId> ce = nodes_of(g, ir::Op::CrossEntropy, ir::Phase::Forward);
  REQUIRE(ce.size() == 1);
  CHECK(dtype(g, g.node(ce[0]).in(0)) == DType::F32);
  // Master weights, their gradients and the optimizer state stay f32.
  for (const ir::Param& p : g.params) CHECK(dtype(g, p.value) == DType::F32);
  for (const auto& [label, v] : g.outputs) CHECK(dtype(g, v) == DType::F32);
  for (ValueId s : g.state)
    CHECK((dtype(g, s) == DType::F32 || dtype(g, s) == DType::I64));
  // The backward matmuls (two per forward matmul, less the gradient of the
  // data) run in bf16; the weight gradients' store their f32 sums
  // (passes/matmul_epilogues.h), as do the gelu gradients' GEMMs for their
  // epilogue (passes/fuse_gemm_epilogues.h); the others round to bf16.
  int backward = 0;
  for (ir::NodeId id : g.schedule()) {
    const ir::Node& n = g.node(id);
    if (n.phase != ir::Phase::Backward || ir::op_info(n.op).op_class != ir::OpClass::Contraction) continue;
    ++backward;
    for (ValueId v : n.inputs) CHECK(dtype(g, v) == DType::BF16);
    const bool weight_gradient = g.value(n.out()).name.rfind("grad.", 0) == 0;
    CHECK(dtype(g, n.out()) == (weight_gradient || n.group >= 0 ? DType::F32 : DType::BF16));
  }
  CHECK(backward == 5);
}

TEST_CASE("mixed precision: gpt bf16-mixed follows the rules op by op") {
  ir::Graph g = compile_model("gpt", "bf16-mixed");
  int param_copies = 0;
  std::map<ValueId, int> casts_of;
  for (ir::NodeId id : g.schedule()) {
    const ir::Node& n = g.node(id);
    if (n.phase != ir::Phase::Forward) continue;
    if (n.op == ir::Op::Cast) {
      ++casts_of[n.in(0)];
      param_copies += reason(g, id) == "param low-precision copy";
      continue;
    }
    switch (passes::amp_rule(n.op, false)) {
      case passes::AmpRule::Contraction:
        for (ValueId v : n.inputs) CHECK(dtype(g, v) == DType::BF16);
        // bf16, or the f32 sums a GEMM epilogue reads (the contraction heads its group).
        CHECK(dtype(g, n.out()) == (n.group >= 0 ? DType::F32 : DType::BF16));
        break;
      case passes::AmpRule::Fp32Op:
        for (ValueId v : n.inputs)
          if (ir::is_floating(dtype(g, v))) CHECK(dtype(g, v) == DType::F32);
        break;
      case passes::AmpRule::FollowsInputs: {
        // The widest floating operand's dtype, and every floating operand in it.
        DType want = DType::F8E4M3;
        for (ValueId v : n.inputs)
          if (ir::is_floating(dtype(g, v)) && ir::dtype_size(dtype(g, v)) > ir::dtype_size(want)) want = dtype(g, v);
        for (ValueId v : n.inputs)
          if (ir::is_floating(dtype(g, v))) CHECK(dtype(g, v) == want);
        break;
      }
      default: break;
    }
  }
  // Every value is cast to a given dtype at most once; wte (embedding in f32, logits in bf16) and the
  // four weights of each of the two blocks get one bf16 copy each.
  for (const auto& [v, count] : casts_of) CHECK(count <= 2);
  CHECK(param_copies == 1 + 4 * 2);
  // The residual stream stays f32; fused attention takes bf16 q, k, v as a matmul does, and gives
  // its output in bf16 and the log-sum-exp of each row in f32.
  std::vector<ir::NodeId> attention = nodes_of(g, ir::Op::Attention, ir::Phase::Forward);
  REQUIRE(attention.size() == 2);
  for (ir::NodeId id : attention) {
    const ir::Node& n = g.node(id);
    for (ValueId v : n.inputs) CHECK(dtype(g, v) == DType::BF16);
    CHECK(dtype(g, n.out(0)) == DType::BF16);
    CHECK(dtype(g, n.out(1)) == DType::F32);
  }
  CHECK(dtype(g, named(g, "logits")) == DType::BF16);
  for (const auto& [label, v] : g.outputs) CHECK(dtype(g, v) == DType::F32);
}

TEST_CASE("mixed precision: bf16-mixed loss and gradients agree with fp32 within bf16 tolerance") {
  for (const std::string stem : {"mlp", "gpt"}) {
    CAPTURE(stem);
    ir::Graph reference = compile_model(stem, "fp32");
    ir::Graph mixed = compile_model(stem, "bf16-mixed");
    Interpreter a = run_step(reference), b = run_step(mixed);
    double loss32 = a.get(reference.find_output("loss"))[0], loss16 = b.get(mixed.find_output("loss"))[0];
    CAPTURE(loss32);
    CAPTURE(loss16);
    CHECK(std::fabs(loss16 - loss32) <= 1e-2 * std::fabs(loss32));
    double worst = 0;
    for (const ir::Param& p : reference.params) {
      const std::string label = "grad." + reference.value(p.value).name;
      CAPTURE(label);
      ValueId g32 = reference.find_output(label), g16 = mixed.find_output(label);
      REQUIRE(g32 != ir::kNoValue);
      REQUIRE(g16 != ir::kNoValue);
      double err = relative_error(b.get(g16), a.get(g32));
      CHECK(err <= 2e-2);  // bf16 keeps 8 bits: 2^-9 per rounding, a few dozen roundings deep (measured: 0.9e-2)
      worst = std::max(worst, err);
    }
    MESSAGE(stem << ": loss " << loss32 << " vs " << loss16 << ", worst gradient error " << worst);
  }
}

TEST_CASE("mixed precision: fp32 overrides keep the selected ops in f32") {
  ir::Graph g = compile_model("mlp", "{policy: bf16-mixed, fp32: [\"logits\"]}");
  std::vector<ir::NodeId> matmuls = nodes_of(g, ir::Op::MatMul, ir::Phase::Forward);
  REQUIRE(matmuls.size() == 3);
  for (ir::NodeId id : {matmuls[0], matmuls[1]}) {  // bf16 operands; bf16 results, or f32 sums for a GEMM epilogue
    CHECK(dtype(g, g.node(id).in(0)) == DType::BF16);
    CHECK(dtype(g, g.node(id).out()) == (g.node(id).group >= 0 ? DType::F32 : DType::BF16));
  }
  CHECK(g.node(matmuls[0]).group >= 0);  // gelu(images @ w1 + b1), stored in bf16 for the next matmul
  CHECK(dtype(g, g.node(matmuls[2]).out()) == DType::F32);  // `logits: h2 @ w3 + b3`
  CHECK(dtype(g, g.node(matmuls[2]).in(0)) == DType::F32);  // selected: f32 operands
  CHECK(dtype(g, g.node(matmuls[2]).in(1)) == DType::F32);  // w3 itself: no copy
  for (ir::NodeId id : nodes_of(g, ir::Op::Cast, ir::Phase::Forward)) CHECK(name_of(g, g.node(id).in(0)) != "w3");

  ir::Graph gpt = compile_model("gpt", "{policy: bf16-mixed, fp32: [\"blocks.0\"]}");
  int block0 = 0, block1 = 0;
  for (ir::NodeId id : nodes_of(gpt, ir::Op::Einsum, ir::Phase::Forward)) {
    const ir::Node& n = gpt.node(id);
    if (n.scope == "blocks.0") {
      CHECK(dtype(gpt, n.out()) == DType::F32);
      ++block0;
    } else if (n.scope == "blocks.1") {
      CHECK(dtype(gpt, n.out()) == (n.group >= 0 ? DType::F32 : DType::BF16));  // f32: a GEMM epilogue's sums
      ++block1;
    }
  }
  CHECK(block0 == 4);  // qkv, proj, fc, out (scores and att·v are the fused attention's)
  CHECK(block1 == 4);
  for (ir::NodeId id : nodes_of(gpt, ir::Op::Attention, ir::Phase::Forward))
    CHECK(dtype(gpt, gpt.node(id).in(0)) == (gpt.node(id).scope == "blocks.0" ? DType::F32 : DType::BF16));

  // A pattern that selects nothing is an error at the pattern.
  std::string text = with_precision(napkin::testing::read_source("models/mlp.yaml"),
                                    "{policy: bf16-mixed, fp32: [\"logitz\"]}");
  ir::Diagnostics diag;
  std::optional<ir::Graph> bad = frontend::load_model_text(text, "mlp.yaml", diag);
  REQUIRE(bad.has_value());
  CHECK_FALSE(passes::run_training_pipeline(*bad, diag));
  INFO(diag.render());
  CHECK(diag.render().find("mlp.yaml:30:41: error: precision fp32 pattern 'logitz' selects no op") != std::string::npos);
}

namespace {

// A model whose gradients are ~1e-8: below f16's smallest subnormal (6e-8).
std::string tiny_loss_model(const std::string& loss_scale) {
  return R"(
dims: {batch: 8, d: 16}
inputs:
  x: {shape: [batch, d]}
params:
  w: {shape: [d, d], init: normal(0.1)}
forward:
  - y: x @ w
loss: 1e-6 * mean(y * y)
optimizer: sgd(lr=0.1)
precision: {policy: fp16-mixed, loss_scale: )" + loss_scale + "}\n";
}

ValueId state_named(const ir::Graph& g, const std::string& name) {
  for (ValueId v : g.state)
    if (g.value(v).name == name) return v;
  FAIL("no state " << name);
  return ir::kNoValue;
}

}  // namespace

TEST_CASE("loss scaling: f16 gradients underflow without it and train with it") {
  ir::Graph unscaled = napkin::testing::compile_training(tiny_loss_model("{init: 1, growth_interval: 1000}"));
  ir::Graph scaled = napkin::testing::compile_training(tiny_loss_model("{init: 65536, growth_interval: 2}"));
  std::string reference_text = tiny_loss_model("{}");
  reference_text.replace(reference_text.find("{policy: fp16-mixed, loss_scale: {}}"), 36, "fp32");
  ir::Graph reference = napkin::testing::compile_training(reference_text);
  ValueId w = reference.params[0].value;

  Interpreter r(reference, Numerics::Float64);
  r.set(interp::initial_values(reference, 0));
  r.set(interp::random_inputs(reference, 0));
  r.run();
  const std::vector<double> w0 = r.get(w), true_grad = r.get(reference.find_output("grad.w"));
  REQUIRE(max_abs(true_grad) > 0);
  REQUIRE(max_abs(true_grad) < 1e-6);  // the premise: every true gradient is tiny

  // Scale 1: every f16 gradient is 0, found_inf is false, w does not move.
  Interpreter a = run_step(unscaled);
  CHECK(max_abs(a.get(unscaled.find_output("grad.w"))) == 0);
  CHECK(a.get(unscaled.find_output("loss_scale.found_inf"))[0] == 0);
  const std::vector<double> a_w0 = a.get(unscaled.params[0].value);
  a.apply_updates();
  CHECK(a.get(unscaled.params[0].value) == a_w0);

  // Scale 65536: the gradients are the fp32 ones within f16 rounding, and w moves by lr · grad.
  Interpreter b = run_step(scaled);
  CHECK(b.get(scaled.find_output("loss_scale.scale"))[0] == 65536);
  std::vector<double> grad = b.get(scaled.find_output("grad.w"));
  CHECK(relative_error(grad, true_grad) <= 1e-2);
  b.apply_updates();
  std::vector<double> w1 = b.get(scaled.params[0].value);
  for (size_t i = 0; i < w1.size(); ++i) CHECK(w1[i] == doctest::Approx(w0[i] - 0.1 * grad[i]).epsilon(1e-6));
  CHECK(w1 != w0);
  // One good step of two: no growth yet; the second doubles the scale.
  CHECK(b.get(state_named(scaled, "loss_scale.scale"))[0] == 65536);
  CHECK(b.get(state_named(scaled, "loss_scale.good_steps"))[0] == 1);
  b.run();
  CHECK(b.get(scaled.find_output("loss_scale.scale"))[0] == 65536);
  b.apply_updates();
  CHECK(b.get(state_named(scaled, "loss_scale.scale"))[0] == 131072);
  CHECK(b.get(state_named(scaled, "loss_scale.good_steps"))[0] == 0);
}

TEST_CASE("loss scaling: a step with an Inf gradient is skipped and the scale backs off") {
  ir::Graph g = napkin::testing::compile_training(tiny_loss_model("{init: 1024, backoff: 0.25, growth_interval: 2}"));
  ValueId x = g.inputs[0], w = g.params[0].value;
  std::vector<double> huge = interp::random_inputs(g, 0).at(x);
  huge[3] = 1e6;  // past f16's 65504: its cast is Inf, so are y, the loss and the gradients
  Interpreter it = run_step(g, {{x, huge}});
  const std::vector<double> w0_f32 = it.get(w);  // as the step read it: rounded to f32
  CHECK(it.get(g.find_output("loss_scale.found_inf"))[0] == 1);
  it.apply_updates();
  CHECK(it.get(w) == w0_f32);
  CHECK(it.get(state_named(g, "loss_scale.scale"))[0] == 256);
  CHECK(it.get(state_named(g, "loss_scale.good_steps"))[0] == 0);
  // The next, finite step uses the backed-off scale and trains.
  it.set(x, interp::random_inputs(g, 0).at(x));
  it.run();
  CHECK(it.get(g.find_output("loss_scale.scale"))[0] == 256);
  CHECK(it.get(g.find_output("loss_scale.found_inf"))[0] == 0);
  it.apply_updates();
  CHECK(it.get(w) != w0_f32);
  CHECK(it.get(state_named(g, "loss_scale.good_steps"))[0] == 1);
}

TEST_CASE("loss scaling: found_inf reads the gradients in the optimizer phase, after ranks and micro-batches are summed") {
  // The gradient stage (runtime/gradient_stage.h) runs between the backward and the optimizer: an overflow in
  // any micro-batch of any rank must reach found_inf, so found_inf is computed from what the optimizer reads.
  ir::Graph g = napkin::testing::compile_training(tiny_loss_model("{init: 1024}"));
  const ValueId found_inf = g.find_output("loss_scale.found_inf");
  REQUIRE(found_inf != ir::kNoValue);
  CHECK(g.node(g.value(found_inf).producer).phase == ir::Phase::Optimizer);
  for (const auto& [label, v] : g.outputs) {
    if (label.rfind("grad.", 0) != 0) continue;
    CHECK(g.node(g.value(v).producer).phase == ir::Phase::Backward);  // the unscaling: backward work
    for (ir::NodeId id : g.schedule())
      for (ValueId in : g.node(id).inputs)
        if (in == v) CHECK(g.node(id).phase == ir::Phase::Optimizer);  // nothing in the backward reads it again
  }
}

namespace {

const char* kFp8Model = R"(
dims: {m: 6, k: 64, n: 5}
inputs:
  a: {shape: [m, k]}
params:
  w: {shape: [k, n], init: normal(1.0)}
forward:
  - y: a @ w
loss: mean(y * y)
optimizer: sgd(lr=0.1)
precision: fp8-mixed
)";

}  // namespace

TEST_CASE("fp8: E4M3 forward operands, E5M2 gradients, each with an amax scale") {
  ir::Graph g = napkin::testing::compile_training(kFp8Model);
  std::map<std::pair<ir::Phase, DType>, int> quantized;
  for (ir::NodeId id : g.schedule()) {
    const ir::Node& n = g.node(id);
    if (n.op == ir::Op::Cast && (dtype(g, n.out()) == DType::F8E4M3 || dtype(g, n.out()) == DType::F8E5M2))
      ++quantized[{n.phase, dtype(g, n.out())}];
  }
  // Forward: a and w in E4M3. Backward: dW = aᵀ·dy reads a (E4M3) and dy (E5M2); da is not needed.
  CHECK(quantized == std::map<std::pair<ir::Phase, DType>, int>{{{ir::Phase::Forward, DType::F8E4M3}, 2},
                                                                {{ir::Phase::Backward, DType::F8E4M3}, 1},
                                                                {{ir::Phase::Backward, DType::F8E5M2}, 1}});
}

TEST_CASE("fp8: a matmul's error is within the E4M3 bound, and tiny magnitudes are not flushed") {
  ir::Graph g = napkin::testing::compile_training(kFp8Model);
  std::vector<ir::NodeId> mm = nodes_of(g, ir::Op::MatMul, ir::Phase::Forward);
  REQUIRE(mm.size() == 1);
  ValueId a = g.inputs[0], w = g.params[0].value, y = g.node(mm[0]).out();
  const int64_t m = 6, k = 64, n = 5;
  for (double magnitude : {1.0, 1e-6, 1e4}) {
    CAPTURE(magnitude);
    std::vector<double> av = interp::random_inputs(g, 0).at(a);
    for (double& v : av) v *= magnitude;
    Interpreter it = run_step(g, {{a, av}});
    std::vector<double> aa = it.get(a), ww = it.get(w), yy = it.get(y);
    double amax_a = max_abs(aa), amax_w = max_abs(ww);
    // Per element, quantize-dequantize errs by at most 2^-4 relative (E4M3 keeps 3 bits) plus half the
    // smallest subnormal step (2^-10 · s), plus the bf16 roundings of the input and of q · s (2^-9 each).
    const double u = std::pow(2.0, -4) + 2 * std::pow(2.0, -9);
    const double sub_a = std::pow(2.0, -10) * amax_a / 448, sub_w = std::pow(2.0, -10) * amax_w / 448;
    double worst_ratio = 0;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double exact = 0, bound = 0;
        for (int64_t p = 0; p < k; ++p) {
          double x = aa[i * k + p], v = ww[p * n + j];
          double ex = u * std::fabs(x) + sub_a, ev = u * std::fabs(v) + sub_w;
          exact += aa[i * k + p] * ww[p * n + j];
          bound += ex * std::fabs(v) + std::fabs(x) * ev + ex * ev;
        }
        bound += std::pow(2.0, -9) * std::fabs(exact) * 1.01;  // the bf16 result
        double err = std::fabs(yy[i * n + j] - exact);
        CHECK(err <= bound);
        worst_ratio = std::max(worst_ratio, err / bound);
      }
    // Element by element the dequantized operand errs by up to E4M3's half step, and some
    // elements come close to it: quantized to E4M3, not kept in bf16 (2^-9) nor cut to E5M2 (2^-3).
    std::vector<double> dequantized = it.get(g.node(mm[0]).in(0));
    double worst_element = 0;
    for (size_t i = 0; i < aa.size(); ++i) {
      double half_step = std::pow(2.0, -4) * std::fabs(aa[i]);
      double err = std::fabs(dequantized[i] - aa[i]);
      CHECK(err <= half_step + 2 * std::pow(2.0, -9) * std::fabs(aa[i]) + sub_a);
      if (std::fabs(aa[i]) > 0.1 * amax_a) worst_element = std::max(worst_element, err / half_step);
    }
    CHECK(worst_element > 0.5);
    // Not flushed: E4M3 alone (smallest subnormal 2^-9 ≈ 0.002) would zero 1e-6 · N(0, 1).
    CHECK(max_abs(yy) > 0.1 * magnitude);
    MESSAGE("magnitude " << magnitude << ": worst error / bound " << worst_ratio);
  }
}

TEST_CASE("AMP audit: one line under fp32 - casts, rules and the fp32 comparison under bf16-mixed") {
  ir::Graph fp32 = compile_model("mlp", "fp32");
  analysis::StepCost c32 = analysis::analyze_step(fp32, nullptr);
  analysis::MemoryReport m32 = analysis::analyze_memory(fp32);
  CHECK(report::render_amp_audit_text(fp32, c32, m32, nullptr, true) == "\nAMP audit: precision fp32, no casts inserted\n");

  ir::Graph mixed = compile_model("mlp", "bf16-mixed");
  analysis::StepCost c = analysis::analyze_step(mixed, nullptr);
  analysis::MemoryReport m = analysis::analyze_memory(mixed);
  std::string text = report::render_amp_audit_text(mixed, c, m, &fp32, false);
  INFO(text);
  CHECK(text.find("casts inserted                            8  (2 gelu input for its gradient, 3 matmul input, 3 param low-precision copy)") !=
        std::string::npos);
  // Each cast is listed with show_ops (napkin report --ops) only.
  CHECK(text.find("f32 ->bf16  w1") == std::string::npos);
  CHECK(text.find("(each cast: napkin report --ops") != std::string::npos);
  CHECK(report::render_amp_audit_text(mixed, c, m, &fp32, true).find("f32 ->bf16  w1") != std::string::npos);
  CHECK(text.find("contraction      matmul           bf16        3") != std::string::npos);
  CHECK(text.find("forward   bf16 -> f32       3") != std::string::npos);
  CHECK(text.find("backward  bf16 -> f32       5") != std::string::npos);
  // The comparison's fp32 column is the fp32 step's own analysis.
  double fp32_bytes = c32.total.bytes_read + c32.total.bytes_written;
  CHECK(text.find(ir::with_commas(fp32_bytes)) != std::string::npos);
  CHECK(text.find(ir::with_commas(static_cast<double>(m32.peak.bytes))) != std::string::npos);
  CHECK(text.find("forward ops, one by one") == std::string::npos);  // only with show_ops
  CHECK(report::render_amp_audit_text(mixed, c, m, &fp32, true).find("forward ops, one by one") != std::string::npos);
  CHECK(text.find("as written") == std::string::npos);  // inserted casts are listed, not counted as ops

  nlohmann::json j;
  report::add_amp_audit_json(j, mixed, c, m, &fp32);
  CHECK(j["amp_audit"]["casts"].size() == 8);
  CHECK(j["amp_audit"]["vs_fp32"]["bytes_moved"]["fp32"].get<double>() == fp32_bytes);
}
