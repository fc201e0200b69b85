// passes/fuse_classifier: which language-model heads become one
// linear_cross_entropy node and why the others do not, under fp32 and
// bf16-mixed; that the fused step stores no [rows, V] value forward or
// backward; the report's figures for the head (weight-matmul FLOPs kept,
// the backward's recompute counted apart).
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "analysis/cost.h"
#include "analysis/memory.h"
#include "frontend/frontend.h"
#include "passes/fuse_classifier.h"
#include "passes/pipeline.h"
#include "support/test_models.h"

namespace napkin {
namespace {

// A two-layer language model; `head` is its logits line, `precision` its policy.
std::string lm(const std::string& head, const std::string& precision = "fp32") {
  return R"(
model: lm
dims: {batch: 2, seq: 3, vocab: 11, d: 4}
inputs:
  tokens:  {shape: [batch, seq], dtype: i32}
  targets: {shape: [batch, seq], dtype: i32}
params:
  emb: {shape: [vocab, d], init: normal(0.1)}
  w:   {shape: [d, vocab], init: normal(0.1)}
  b:   {shape: [vocab], init: zeros}
forward:
  - x: tanh(embedding(emb, tokens))
)" + head + R"(
loss: cross_entropy(logits, targets)
optimizer: sgd(lr=0.1)
precision: )" + precision + "\n";
}

struct Built {
  ir::Graph g;
  std::vector<passes::ClassifierSite> sites;
};

Built build(const std::string& yaml, bool fuse = true) {
  ir::Diagnostics diag;
  std::optional<ir::Graph> g = frontend::load_model_text(yaml, "lm.yaml", diag);
  REQUIRE(g.has_value());
  Built b{std::move(*g), {}};
  passes::PipelineOptions options;
  options.fuse_classifier = fuse;
  std::optional<passes::PipelineResult> result = passes::run_training_pipeline(b.g, diag, options);
  INFO(diag.render());
  REQUIRE(result.has_value());
  b.sites = result->classifier_sites;
  return b;
}

int count(const ir::Graph& g, ir::Op op) {
  int n = 0;
  for (ir::NodeId id : g.schedule()) n += g.node(id).op == op;
  return n;
}

// Whether any value of the step has `numel` elements (the logits' [rows, V]).
bool has_value_of(const ir::Graph& g, int64_t numel) {
  for (ir::NodeId id : g.schedule())
    for (ir::ValueId v : g.node(id).outputs)
      if (g.value(v).type.numel() == numel) return true;
  return false;
}

TEST_CASE("fuse_classifier: an einsum head with w as [V, d] or [d, V], and a matmul head, become one op") {
  for (const std::string& head : {std::string("  - logits: einsum(x, emb, \"b s d, v d -> b s v\")"),
                                  std::string("  - logits: einsum(x, w, \"b s d, d v -> b s v\")"),
                                  std::string("  - logits: x @ w")}) {
    for (std::string precision : {"fp32", "bf16-mixed"}) {
      INFO(head << " " << precision);
      Built b = build(lm(head, precision));
      REQUIRE(b.sites.size() == 1);
      CHECK(b.sites[0].fused);
      CHECK(b.sites[0].loc.line == 14);  // the loss line
      CHECK(count(b.g, ir::Op::LinearCrossEntropy) == 1);
      CHECK(count(b.g, ir::Op::LinearCrossEntropyGrad) == 1);
      CHECK(count(b.g, ir::Op::CrossEntropy) == 0);
      CHECK(count(b.g, ir::Op::CrossEntropyGrad) == 0);
      CHECK_FALSE(has_value_of(b.g, 2 * 3 * 11));  // no logits, no logit gradient
      // Under bf16-mixed the op reads the bf16 operands the matmul read; its loss stays f32.
      const ir::DType low = std::string(precision) == "fp32" ? ir::DType::F32 : ir::DType::BF16;
      for (ir::NodeId id : b.g.schedule()) {
        const ir::Node& n = b.g.node(id);
        if (n.op != ir::Op::LinearCrossEntropy) continue;
        CHECK(b.g.value(n.in(0)).type.dtype == low);
        CHECK(b.g.value(n.in(1)).type.dtype == low);
        CHECK(b.g.value(n.out(0)).type.dtype == ir::DType::F32);
        CHECK(b.g.value(n.out(1)).type.dtype == ir::DType::F32);
      }
      Built unfused = build(lm(head, precision), false);
      CHECK(count(unfused.g, ir::Op::CrossEntropy) == 1);
      CHECK(has_value_of(unfused.g, 2 * 3 * 11));
    }
  }
}

TEST_CASE("fuse_classifier: heads it leaves alone, each with its reason") {
  struct Case {
    std::string head, reason;
  };
  const std::vector<Case> cases = {
      {"  - logits: x @ w + b", "the logits are not made by a matmul or einsum"},
      {"  - h: x @ w\n  - logits: h * 1.5 + h", "the logits are not made by a matmul or einsum"},
      {"  - logits: rearrange(einsum(x, w, \"b s d, d v -> s b v\"), \"s b v -> b s v\")",
       "the logits are a view of another value"},
  };
  for (const Case& c : cases) {
    INFO(c.head);
    Built b = build(lm(c.head));
    REQUIRE(b.sites.size() == 1);
    CHECK_FALSE(b.sites[0].fused);
    CHECK(b.sites[0].reason == c.reason);
    CHECK(count(b.g, ir::Op::LinearCrossEntropy) == 0);
  }
}

TEST_CASE("fuse_classifier: logits another op also reads stay unfused") {
  std::string yaml = lm("  - logits: x @ w");
  yaml.replace(yaml.find("loss: cross_entropy(logits, targets)"), 36,
               "loss: cross_entropy(logits, targets) + mean(logits) * 0.0");
  Built b = build(yaml);
  REQUIRE(b.sites.size() == 1);
  CHECK_FALSE(b.sites[0].fused);
  CHECK(b.sites[0].reason == "the logits are read by another op");
}

TEST_CASE("fuse_classifier: the head keeps its weight-matmul FLOPs, the backward's recompute is counted apart") {
  Built fused = build(lm("  - logits: x @ w"));
  Built unfused = build(lm("  - logits: x @ w"), false);
  analysis::StepCost f = analysis::analyze_step(fused.g, nullptr);
  analysis::StepCost u = analysis::analyze_step(unfused.g, nullptr);
  const double rows = 6, vocab = 11, d = 4;
  // Forward: x·w, 2·rows·V·d, as the matmul; backward: dx and dw, 4·rows·V·d.
  CHECK(f.phase(ir::Phase::Forward).param_matmul_flops == u.phase(ir::Phase::Forward).param_matmul_flops);
  CHECK(f.phase(ir::Phase::Backward).param_matmul_flops == u.phase(ir::Phase::Backward).param_matmul_flops);
  CHECK(f.phase(ir::Phase::Forward).param_matmul_flops == 2 * rows * vocab * d);
  CHECK(f.phase(ir::Phase::Backward).recompute_flops == 2 * rows * vocab * d);
  CHECK(u.phase(ir::Phase::Backward).recompute_flops == 0);
  CHECK(f.params_in_matmuls == u.params_in_matmuls);
  // The fused step moves fewer bytes: the logits and their gradient are never stored.
  CHECK(f.total.bytes_read + f.total.bytes_written < u.total.bytes_read + u.total.bytes_written);
}

}  // namespace
}  // namespace napkin
