// The rope op against the rotation a user writes by hand, and its kernels
// against the interpreter.
//
// A tiny Llama (GQA, RMSNorm, SwiGLU) is written twice: with q and k turned by
// `rope(...)`, and with the rotation spelled out as tests/models/llama-rope.yaml
// does (inverse frequencies from arange, Llama 3.1's scaling as where()s, an
// outer product with the positions, cos and sin tables, the pairs swapped by
// split/neg/concat), in both pairings, with and without scaled frequencies.
// Both take the same parameters and data, so their losses and gradients must
// agree: in the float64 interpreter, and in the compiled CPU trainer in f32.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "interp/gradient_check.h"
#include "support/compiled_step.h"
#include "support/test_models.h"

using namespace napkin;

namespace {

struct Variant {
  std::string style;  // "half" or "interleaved"
  bool scaled = false;  // Llama 3.1's frequency scaling
};

// head_dim 8: frequencies 1, 0.1, 0.01, 0.001 (wavelengths 6.3, 63, 628, 6283),
// so the scaling (context 2048, factors 1 and 4, /8) keeps the first two,
// interpolates the third and divides the fourth.
constexpr const char* kScaling = "factor=8, low_freq_factor=1, high_freq_factor=4, original_context=2048";

std::string llama(const Variant& v, bool by_op) {
  const bool interleaved = v.style == "interleaved";
  std::string rotate, tables;
  if (by_op) {
    const std::string args = fmt::format("theta=10000, style={}{}", v.style, v.scaled ? std::string(", ") + kScaling : "");
    rotate = fmt::format(
        "      - q: rope(q, {0})\n"
        "      - k: rope(k, {0})\n",
        args);
  } else {
    for (const char* t : {"q", "k"}) {
      if (interleaved)
        rotate += fmt::format(
            "      - {0}p: rearrange({0}, \"b h s (f two) -> b h s f two\", two=2)\n"
            "      - {0}1, {0}2: split({0}p, 2, axis=-1)\n"
            "      - {0}: {0} * rcos + rearrange(concat(neg({0}2), {0}1, axis=-1), \"b h s f two -> b h s (f two)\") * rsin\n",
            t);
      else
        rotate += fmt::format(
            "      - {0}1, {0}2: split({0}, 2, axis=-1)\n"
            "      - {0}: {0} * rcos + concat(neg({0}2), {0}1, axis=-1) * rsin\n",
            t);
    }
    tables = "  - inv_freq: exp(cast(arange(half), f32) * (-2 * log(10000) / head_dim))\n";
    if (v.scaled)  // transformers' _compute_llama3_parameters
      tables +=
          "  - wavelen: 2 * 3.141592653589793 / inv_freq\n"
          "  - smooth: (2048 / wavelen - 1) / (4 - 1)\n"
          "  - inv_freq: where(wavelen < 2048 / 4, inv_freq, where(wavelen > 2048 / 1, inv_freq / 8, "
          "(1 - smooth) * inv_freq / 8 + smooth * inv_freq))\n";
    tables += "  - angles: einsum(cast(arange(seq), f32), inv_freq, \"s, f -> s f\")\n";
    tables += interleaved ? "  - a1: rearrange(angles, \"s f -> s f 1\")\n"
                            "  - emb: rearrange(concat(a1, a1, axis=-1), \"s f two -> s (f two)\")\n"
                          : "  - emb: concat(angles, angles, axis=-1)\n";
    tables += "  - rcos: cos(emb)\n  - rsin: sin(emb)\n";
  }
  return fmt::format(R"yaml(model: llama-{0}
dims: {{batch: 2, seq: 8, vocab: 32, d: 32, heads: 4, kv_heads: 2, head_dim: d / heads, half: head_dim / 2, hidden: 48, layers: 2}}
inputs:
  tokens:  {{shape: [batch, seq], dtype: i32}}
  targets: {{shape: [batch, seq], dtype: i32}}
params:
  wte:    {{shape: [vocab, d], init: normal(0.5)}}
  norm_g: {{shape: [d], init: ones}}
  head:   {{shape: [d, vocab], init: normal(0.2)}}
blocks:
  layer:
    args: [{1}]
    params:
      attn_norm: {{shape: [d], init: ones}}
      wq:        {{shape: [d, d], init: normal(0.3)}}
      wkv:       {{shape: [d, 2 * kv_heads * head_dim], init: normal(0.3)}}
      wo:        {{shape: [d, d], init: normal(0.2)}}
      mlp_norm:  {{shape: [d], init: ones}}
      w_gate:    {{shape: [d, hidden], init: normal(0.2)}}
      w_up:      {{shape: [d, hidden], init: normal(0.2)}}
      w_down:    {{shape: [hidden, d], init: normal(0.2)}}
    forward:
      - h: rmsnorm(x, attn_norm)
      - q: rearrange(einsum(h, wq, "b s d, d e -> b s e"), "b s (h hd) -> b h s hd", h=heads)
      - k, v: rearrange(einsum(h, wkv, "b s d, d e -> b s e"), "b s (two h hd) -> two b h s hd", two=2, h=kv_heads)
{2}      - y: rearrange(attention(q, k, v), "b h s hd -> b s (h hd)")
      - x: x + einsum(y, wo, "b s e, e d -> b s d")
      - h: rmsnorm(x, mlp_norm)
      - x: x + einsum(silu(einsum(h, w_gate, "b s d, d f -> b s f")) * einsum(h, w_up, "b s d, d f -> b s f"), w_down, "b s f, f d -> b s d")
forward:
{3}  - x: embedding(wte, tokens)
  - x: repeat(layer, layers, {1})
  - logits: einsum(rmsnorm(x, norm_g), head, "b s d, d v -> b s v")
loss: cross_entropy(logits, targets)
optimizer: sgd(lr=0.1)
precision: fp32
)yaml",
                     by_op ? "rope" : "hand", by_op ? "x" : "x, rcos, rsin", rotate, tables);
}

}  // namespace

TEST_CASE("numeric: a model written with rope equals the hand-written rotation: loss and gradients, both styles, scaled and unscaled, f64 interpreter and compiled CPU") {
  std::map<std::string, double> losses;
  for (const Variant& v : {Variant{"half", false}, Variant{"interleaved", false}, Variant{"half", true},
                           Variant{"interleaved", true}}) {
    const std::string label = fmt::format("{}{}", v.style, v.scaled ? ", scaled" : "");
    CAPTURE(label);
    const ir::Graph hand = napkin::testing::compile_training(llama(v, false), "hand.yaml");
    const ir::Graph op = napkin::testing::compile_training(llama(v, true), "rope.yaml");
    // The interpreter: exact arithmetic; the op's f32 frequencies and its
    // cos and sin rounded to f32 are the only difference (~1e-7 relative).
    const napkin::testing::LossAndGradients hand64 = napkin::testing::evaluate_f64(hand),
                                            op64 = napkin::testing::evaluate_f64(op);
    const double f64 = napkin::testing::check_same_loss_and_gradients(hand64, op64, 2e-6);
    losses[label] = op64.loss;
    // The compiled trainer in f32: two graphs, two orders of rounding.
    const double f32 = napkin::testing::check_same_loss_and_gradients(napkin::testing::evaluate_compiled(hand),
                                                                       napkin::testing::evaluate_compiled(op), 2e-5);
    if (std::getenv("NAPKIN_NUMERIC_VERBOSE"))
      std::cout << fmt::format("rope vs hand-written, {:<18} loss {:.6f}  worst error: f64 {:.1e}, compiled f32 {:.1e}\n",
                               label, op64.loss, f64, f32);
  }
  // Each variant computes a different function: the style and the scaling matter.
  CHECK(std::fabs(losses["half"] - losses["interleaved"]) > 1e-4);
  CHECK(std::fabs(losses["half"] - losses["half, scaled"]) > 1e-4);
  CHECK(std::fabs(losses["interleaved"] - losses["interleaved, scaled"]) > 1e-4);
}

TEST_CASE("numeric: napkin check passes tests/models/llama-rope-op.yaml (rope on q and k), fp32 and bf16-mixed") {
  for (ir::PrecisionPolicy policy : {ir::PrecisionPolicy::FP32, ir::PrecisionPolicy::BF16Mixed}) {
    CAPTURE(ir::precision_name(policy));
    frontend::LoadOptions options;
    options.dim_overrides = {{"seq", 8}, {"vocab", 32}, {"d", 16}, {"hidden", 24}};
    ir::Graph g = napkin::testing::compile_model_file(napkin::testing::source_path("tests/models/llama-rope-op.yaml"),
                                                      options, policy);
    interp::GradCheckOptions check;
    check.samples = 4;
    const interp::GradCheckResult r = interp::check_gradients(g, check);
    CHECK(r.tensors.size() == g.params.size());
    for (const interp::TensorCheck& t : r.tensors) {
      CAPTURE(t.name);
      CHECK(t.error_f64 <= t.tolerance_f64);
      CHECK(t.error_native <= t.tolerance_native);
    }
    CHECK(r.passed);
  }
}

// tests/numeric/standalone_rope.yaml: each kernel (the forward rotations and
// the inverse ones of the gradients) against the interpreter on its own inputs.

TEST_CASE("numeric: standalone rope kernels (explicit positions, strided operand), compiled CPU, agree with the interpreter, fp32 and bf16-mixed") {
  for (ir::PrecisionPolicy policy : {ir::PrecisionPolicy::FP32, ir::PrecisionPolicy::BF16Mixed}) {
    CAPTURE(ir::precision_name(policy));
    napkin::testing::CompiledStep step(napkin::testing::compile_model_file(
        napkin::testing::source_path("tests/numeric/standalone_rope.yaml"), {}, policy));
    int rope_kernels = 0;
    napkin::testing::check_each_kernel(step, [&](const napkin::testing::KernelOutputCheck& c) {
      INFO(c.kernel->name << " at " << c.kernel->where << ", " << ir::dtype_name(c.operand->dtype));
      rope_kernels += c.kernel->kind == codegen::KernelKind::Rope;
      CHECK(c.error <= napkin::testing::kernel_tolerance(c.precision));
    });
    CHECK(rope_kernels == 4);  // two forward, two inverse for the gradients
  }
}
