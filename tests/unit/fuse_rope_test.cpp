// passes/fuse_rope: which attention(rope(q), rope(k), v) sites the attention
// takes the rotation into (and which it leaves to the rope kernel: other
// parameters, explicit positions, a rotated value read elsewhere, a rope over
// another axis, the pass off); that a Llama-like model's step has no rope
// kernel and trains as the same model with the pass off does, step for step
// (a fused qkv too, whose attention stores o seq-major and packs dq, dk, dv);
// the attention's cost with the rotation; and that `napkin check`
// (gradients against float64 finite differences) and the CPU kernels against
// the interpreter pass with the rope fused.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "analysis/step_kernels.h"
#include "interp/gradient_check.h"
#include "ir/fusion_group.h"
#include "ir/rope.h"
#include "passes/pipeline.h"
#include "support/compiled_step.h"
#include "support/test_models.h"

namespace napkin {
namespace {

// One grouped-query attention layer; `qk` is the line that makes the
// attention's q and k from the unrotated q0, k0 (and may read the input pos).
std::string model(const std::string& qk, const std::string& extra = "") {
  return R"yaml(
model: rope_site
dims: {batch: 2, seq: 8, vocab: 16, d: 16, heads: 4, kv_heads: 2, head_dim: d / heads}
inputs:
  tokens:  {shape: [batch, seq], dtype: i32}
  targets: {shape: [batch, seq], dtype: i32}
  pos:     {shape: [seq], dtype: i32}
params:
  wte: {shape: [vocab, d], init: normal(0.5)}
  wq:  {shape: [heads * head_dim, d], init: normal(0.3)}
  wk:  {shape: [kv_heads * head_dim, d], init: normal(0.3)}
  wv:  {shape: [kv_heads * head_dim, d], init: normal(0.3)}
  wo:  {shape: [d, heads * head_dim], init: normal(0.3)}
forward:
  - x: embedding(wte, tokens)
  - q0: rearrange(einsum(x, wq, "b s d, e d -> b s e"), "b s (h hd) -> b h s hd", h=heads)
  - k0: rearrange(einsum(x, wk, "b s d, e d -> b s e"), "b s (h hd) -> b h s hd", h=kv_heads)
  - v: rearrange(einsum(x, wv, "b s d, e d -> b s e"), "b s (h hd) -> b h s hd", h=kv_heads)
)yaml" + qk + R"yaml(
  - o: attention(q, k, v)
  - x: x + einsum(rearrange(o, "b h s hd -> b s (h hd)"), wo, "b s e, d e -> b s d")
  - logits: einsum(x, wte, "b s d, v d -> b s v")
)yaml" + extra + R"yaml(
loss: cross_entropy(logits, targets)
optimizer: sgd(lr=0.1)
)yaml";
}

int count(const ir::Graph& g, ir::Op op) {
  int n = 0;
  for (ir::NodeId id : g.schedule()) n += g.node(id).op == op;
  return n;
}

// The forward graph's attention node.
const ir::Node& attention(const ir::Graph& g) {
  for (ir::NodeId id : g.schedule())
    if (g.node(id).op == ir::Op::Attention) return g.node(id);
  FAIL("no attention");
  return g.node(g.schedule().front());
}

TEST_CASE("fuse_rope: rope of q and k with equal parameters is applied by the attention, no rope node left") {
  for (const char* style : {"half", "interleaved"}) {
    CAPTURE(style);
    const std::string args = std::string("theta=500000, style=") + style + ", factor=8, original_context=4";
    const ir::Graph g =
        testing::compile(model("  - q: rope(q0, " + args + ")\n  - k: rope(k0, " + args + ")"));
    CHECK(count(g, ir::Op::Rope) == 0);
    const ir::Node& a = attention(g);
    REQUIRE(ir::has_rope(a.attrs, "rope_"));
    const ir::RopeParams p = ir::rope_params(a.attrs, "rope_");
    CHECK(p.style == (std::string(style) == "half" ? ir::RopeStyle::Half : ir::RopeStyle::Interleaved));
    CHECK(p.theta == 500000);
    CHECK(p.factor == 8);
    CHECK(p.original_context == 4);
    CHECK(g.value(a.in(0)).name.find("q0") != std::string::npos);  // the unrotated q
  }
}

TEST_CASE("fuse_rope: ropes the attention cannot apply stay rope nodes") {
  struct Case {
    const char* why;
    std::string qk, extra;
  };
  const Case cases[] = {
      {"different theta", "  - q: rope(q0, theta=10000)\n  - k: rope(k0, theta=500000)", ""},
      {"different pairing", "  - q: rope(q0)\n  - k: rope(k0, style=interleaved)", ""},
      {"explicit positions", "  - q: rope(q0, positions=pos)\n  - k: rope(k0, positions=pos)", ""},
      {"q's rotation read elsewhere", "  - q: rope(q0)\n  - k: rope(k0)", "  - logits: logits + mean(q)"},
      {"a rope over the sequence axis", "  - q: rope(q0, axis=-2, seq_axis=-1)\n  - k: rope(k0, axis=-2, seq_axis=-1)",
       ""},
      {"only k rotated", "  - q: q0 * 1\n  - k: rope(k0)", ""},
  };
  for (const Case& c : cases) {
    CAPTURE(c.why);
    const ir::Graph g = testing::compile(model(c.qk, c.extra));
    CHECK_FALSE(ir::has_rope(attention(g).attrs, "rope_"));
    CHECK(count(g, ir::Op::Rope) >= 1);
  }
  // The pass off (--unfused-rope).
  passes::PipelineOptions off;
  off.fuse_rope = false;
  ir::Graph g = testing::compile_training(model("  - q: rope(q0)\n  - k: rope(k0)"), "inline.yaml", off);
  CHECK(count(g, ir::Op::Rope) > 0);
  CHECK_FALSE(ir::has_rope(attention(g).attrs, "rope_"));
}

// A Llama-like model (RMSNorm, grouped-query attention with rope, SwiGLU,
// untied head) in blocks, at `precision`.
std::string llama(const std::string& precision) {
  return R"yaml(
model: tiny_llama
dims: {batch: 2, seq: 8, vocab: 32, d: 16, heads: 4, kv_heads: 2, head_dim: d / heads, hidden: 24, layers: 2,
       rope_theta: 10000}
inputs:
  tokens:  {shape: [batch, seq], dtype: i32}
  targets: {shape: [batch, seq], dtype: i32}
params:
  wte:    {shape: [vocab, d], init: normal(0.5)}
  norm_g: {shape: [d], init: ones}
  head:   {shape: [vocab, d], init: normal(0.3)}
blocks:
  layer:
    params:
      attn_norm: {shape: [d], init: ones}
      wq:        {shape: [heads * head_dim, d], init: normal(0.3)}
      wk:        {shape: [kv_heads * head_dim, d], init: normal(0.3)}
      wv:        {shape: [kv_heads * head_dim, d], init: normal(0.3)}
      wo:        {shape: [d, heads * head_dim], init: normal(0.3)}
      mlp_norm:  {shape: [d], init: ones}
      w_gate:    {shape: [hidden, d], init: normal(0.3)}
      w_up:      {shape: [hidden, d], init: normal(0.3)}
      w_down:    {shape: [d, hidden], init: normal(0.3)}
    forward:
      - h: rmsnorm(x, attn_norm, eps=1e-5)
      - q: rope(rearrange(einsum(h, wq, "b s d, e d -> b s e"), "b s (h hd) -> b h s hd", h=heads), theta=rope_theta)
      - k: rope(rearrange(einsum(h, wk, "b s d, e d -> b s e"), "b s (h hd) -> b h s hd", h=kv_heads), theta=rope_theta)
      - v: rearrange(einsum(h, wv, "b s d, e d -> b s e"), "b s (h hd) -> b h s hd", h=kv_heads)
      - x: x + einsum(rearrange(attention(q, k, v), "b h s hd -> b s (h hd)"), wo, "b s e, d e -> b s d")
      - h: rmsnorm(x, mlp_norm, eps=1e-5)
      - x: x + einsum(silu(einsum(h, w_gate, "b s d, f d -> b s f")) * einsum(h, w_up, "b s d, f d -> b s f"), w_down, "b s f, d f -> b s d")
forward:
  - x: repeat(layer, layers, embedding(wte, tokens))
  - logits: einsum(rmsnorm(x, norm_g, eps=1e-5), head, "b s d, v d -> b s v")
loss: cross_entropy(logits, targets)
optimizer: adamw(lr=0.01, weight_decay=0.1)
precision: )yaml" + precision + "\n";
}

ir::Graph training(const std::string& yaml, bool fuse) {
  passes::PipelineOptions options;
  options.fuse_rope = fuse;
  return testing::compile_training(yaml, "tiny_llama.yaml", options);
}

int rope_kernels(const ir::Graph& g) {
  int n = 0;
  for (const analysis::StepKernel& k : analysis::step_kernels(g, ir::fusion_groups(g))) n += k.kind == analysis::KernelKind::Rope;
  return n;
}

TEST_CASE("fuse_rope: a Llama-like step has no rope kernel and trains as the unfused step, fp32 and bf16-mixed") {
  for (const char* precision : {"fp32", "bf16-mixed"}) {
    CAPTURE(precision);
    testing::CompiledStep fused(training(llama(precision), true)), unfused(training(llama(precision), false));
    CHECK(rope_kernels(fused.g) == 0);
    CHECK(rope_kernels(unfused.g) >= 4);  // two layers' q and k, forward and backward
    CHECK(fused.plan.kernels.size() < unfused.plan.kernels.size());
    // f32: the same arithmetic in another order (the kernels rotate in f32
    // either way); bf16-mixed: the unfused rope rounds q and k to bf16, the
    // fused one feeds the attention unrounded.
    const double tol = std::string(precision) == "fp32" ? 1e-5 : 3e-2;
    for (int step = 0; step < 5; ++step) {
      CAPTURE(step);
      const double a = testing::run_step(fused), b = testing::run_step(unfused);
      CHECK(std::abs(a - b) <= tol * std::abs(b));
    }
    CHECK(testing::worst_state_error(unfused, fused) <= (std::string(precision) == "fp32" ? 1e-4 : 5e-2));
  }
}

TEST_CASE("fuse_rope: with a fused qkv, the rope-applying attention stores o seq-major and packs dq, dk, dv, and trains as unfused") {
  // GPT-style: q, k, v split from one projection, so attention_layout makes
  // the attention store o as [b, s, h, hd] and its gradient write dq, dk, dv
  // into the qkv gradient [b, s, 3, h, hd]: the kernels rotate dq and dk back
  // into those strided windows.
  const std::string yaml = R"yaml(
model: rope_qkv
dims: {batch: 2, seq: 8, vocab: 16, d: 16, heads: 2, head_dim: d / heads}
inputs:
  tokens:  {shape: [batch, seq], dtype: i32}
  targets: {shape: [batch, seq], dtype: i32}
params:
  wte:  {shape: [vocab, d], init: normal(0.5)}
  wqkv: {shape: [d, 3 * d], init: normal(0.3)}
  wo:   {shape: [d, d], init: normal(0.3)}
forward:
  - x: embedding(wte, tokens)
  - q, k, v: rearrange(einsum(x, wqkv, "b s d, d e -> b s e"), "b s (three h hd) -> three b h s hd", three=3, h=heads)
  - y: rearrange(attention(rope(q, style=interleaved), rope(k, style=interleaved), v), "b h s hd -> b s (h hd)")
  - x: x + einsum(y, wo, "b s e, e d -> b s d")
  - logits: einsum(x, wte, "b s d, v d -> b s v")
loss: cross_entropy(logits, targets)
optimizer: adamw(lr=0.01)
)yaml";
  testing::CompiledStep fused(training(yaml, true)), unfused(training(yaml, false));
  int packed = 0, seq_major = 0;
  for (ir::NodeId id : fused.g.schedule()) {
    const ir::Node& n = fused.g.node(id);
    if (!ir::has_rope(n.attrs, "rope_")) continue;
    seq_major += n.op == ir::Op::Attention && n.attrs.has("seq_major_out");
    packed += n.op == ir::Op::AttentionGrad && n.attrs.has("packed_grad");
  }
  CHECK(seq_major == 1);
  CHECK(packed == 1);
  CHECK(rope_kernels(fused.g) == 0);
  for (int step = 0; step < 3; ++step) {
    const double a = testing::run_step(fused), b = testing::run_step(unfused);
    CHECK(std::abs(a - b) <= 1e-5 * std::abs(b));
  }
  CHECK(testing::worst_state_error(unfused, fused) <= 1e-4);
}

TEST_CASE("fuse_rope: the attention's cost row counts the rotation's FLOPs: 3 an element of q and k, backward twice") {
  const ir::Graph fused = training(llama("fp32"), true), unfused = training(llama("fp32"), false);
  // batch 2, seq 8, head_dim 4: q 4 heads, k 2 heads.
  const double rotated = 3.0 * (2 * 4 * 8 * 4 + 2 * 2 * 8 * 4);
  auto cost = [](const ir::Graph& g, ir::Op op) {
    for (ir::NodeId id : g.schedule())
      if (g.node(id).op == op) return ir::op_info(op).cost(g, g.node(id));
    FAIL("no node");
    return ir::OpCost{};
  };
  for (ir::Op op : {ir::Op::Attention, ir::Op::AttentionGrad}) {
    const ir::OpCost a = cost(fused, op), b = cost(unfused, op);
    CHECK(a.flops - b.flops == doctest::Approx(rotated));
    CHECK(a.recompute_flops - b.recompute_flops == doctest::Approx(op == ir::Op::Attention ? 0.0 : rotated));
    CHECK(a.bytes_read == b.bytes_read);
    CHECK(a.bytes_written == b.bytes_written);
  }
}

TEST_CASE("fuse_rope: napkin check passes a model with rope fused, and its CPU kernels agree with the interpreter") {
  const ir::Graph g = training(llama("fp32"), true);
  int fused = 0;
  for (ir::NodeId id : g.schedule())
    fused += (g.node(id).op == ir::Op::Attention || g.node(id).op == ir::Op::AttentionGrad) &&
             ir::has_rope(g.node(id).attrs, "rope_");
  CHECK(fused == 4);  // two layers' attention and attention_grad
  interp::GradCheckOptions options;
  options.samples = 8;
  const interp::GradCheckResult r = interp::check_gradients(g, options);
  for (const interp::TensorCheck& t : r.tensors) {
    CAPTURE(t.name);
    CAPTURE(t.error_f64);
    CHECK(t.passed);
  }
  CHECK(r.passed);

  testing::CompiledStep step{ir::Graph(g)};
  int checked = 0;
  testing::check_each_kernel(step, [&](const testing::KernelOutputCheck& c) {
    INFO(c.kernel->name << " output " << c.output << " at " << c.kernel->where);
    CHECK(c.error <= testing::kernel_tolerance(c.precision));
    ++checked;
  });
  CHECK(checked > 20);
}

}  // namespace
}  // namespace napkin
