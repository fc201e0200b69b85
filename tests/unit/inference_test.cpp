// The inference program of `napkin sample` (passes/derive_inference.h): its
// prefill and its KV-cache decode step, compiled by the CPU backend (LLVM,
// JIT) and run by the runtime, against the reference interpreter's forward
// of the whole sequence; the sampler's draws; and the models it refuses.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "analysis/devices.h"
#include "analysis/inference.h"
#include "frontend/frontend.h"
#include "interp/interpreter.h"
#include "ir/rope.h"
#include "passes/derive_inference.h"
#include "passes/pipeline.h"
#include "runtime/cpu_engine.h"
#include "runtime/sampler.h"
#include "runtime/tensor_element.h"
#include "support/compiled_step.h"
#include "support/test_models.h"

namespace {

using namespace napkin;

// A model file at `dims`, lowered (the frontend's forward graph).
ir::Graph lowered(const std::string& model, const std::map<std::string, int64_t>& dims) {
  ir::Diagnostics diag;
  frontend::LoadOptions options;
  options.dim_overrides = dims;
  std::optional<ir::Graph> g = frontend::load_model_file(testing::source_path(model), diag, options);
  INFO(diag.render());
  REQUIRE(g.has_value());
  return std::move(*g);
}

// The compiled inference program of a lowered model, and the interpreter's
// forward graph (attention fused and the precision policy applied, as the
// derivation starts from) for the oracle.
struct Decoder {
  ir::Graph forward;
  std::unique_ptr<testing::CompiledStep> step;
  int64_t batch = 0, context = 0, vocab = 0;

  explicit Decoder(const ir::Graph& g) : forward(g) {
    ir::Diagnostics diag;
    passes::PipelineOptions no_classifier;
    no_classifier.fuse_classifier = false;  // the oracle keeps its logits
    no_classifier.fuse_rope = false;        // and rotates q and k by the rope op itself
    REQUIRE(passes::run_forward_pipeline(forward, diag, no_classifier));
    ir::Graph inference = g;
    REQUIRE(passes::run_inference_pipeline(inference, diag));
    INFO(diag.render());
    REQUIRE_FALSE(diag.has_errors());
    step = std::make_unique<testing::CompiledStep>(std::move(inference));
    step->ex->run_setup();  // the parameters are in: what they alone give, once
    const runtime::TensorSpec* tokens = step->program.find("prefill.tokens");
    REQUIRE(tokens != nullptr);
    batch = tokens->shape[0];
    context = tokens->shape[1];
    vocab = step->program.find("decode.logits")->shape[2];
  }

  char* at(const char* name) { return step->ex->arena() + step->program.find(name)->offset; }
  runtime::DType dtype(const char* name) { return step->program.find(name)->dtype; }
  void put(const char* name, int64_t i, double v) { runtime::write_element(at(name), dtype(name), i, v); }
  double get(const char* name, int64_t i) { return runtime::read_element(at(name), dtype(name), i); }

  // The prefill over sequences[b] (padded with token 0 to the context).
  void prefill(const std::vector<std::vector<int64_t>>& sequences) {
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t i = 0; i < context; ++i)
        put("prefill.tokens", b * context + i, i < static_cast<int64_t>(sequences[b].size()) ? sequences[b][i] : 0);
    for (int64_t i = 0; i < context; ++i) put("prefill.positions", i, static_cast<double>(i));
    step->ex->run_forward();
  }
  // One decode step: token[b] at `position`.
  void decode(const std::vector<int64_t>& token, int64_t position) {
    for (int64_t b = 0; b < batch; ++b) put("decode.tokens", b, static_cast<double>(token[b]));
    put("decode.positions", 0, static_cast<double>(position));
    step->ex->run_kernels(step->program.num_forward_kernels, static_cast<int>(step->program.kernels.size()));
  }
  std::vector<double> prefill_row(int64_t b, int64_t row) {
    std::vector<double> out(static_cast<size_t>(vocab));
    for (int64_t v = 0; v < vocab; ++v) out[v] = get("prefill.logits", (b * context + row) * vocab + v);
    return out;
  }
  std::vector<double> decode_row(int64_t b) {
    std::vector<double> out(static_cast<size_t>(vocab));
    for (int64_t v = 0; v < vocab; ++v) out[v] = get("decode.logits", b * vocab + v);
    return out;
  }

  // A CPU engine of the same program with the same parameters: what
  // `napkin sample` runs (runtime::generate).
  std::unique_ptr<runtime::Engine> engine() {
    auto* fns = static_cast<const runtime::KernelCode*>(step->jit->lookup("napkin_kernel_fns"));
    auto e = std::make_unique<runtime::CpuEngine>(step->program, fns, 2);
    for (const runtime::TensorSpec* t : step->program.with_role(runtime::TensorRole::Param))
      std::copy_n(step->ex->arena() + t->offset, t->bytes, e->host(*t));
    return e;
  }

  // The interpreter's logits of the whole (padded) sequences, in float64,
  // with the compiled program's parameters.
  std::vector<double> oracle_logits(const std::vector<std::vector<int64_t>>& sequences) {
    interp::Interpreter in(forward, interp::Numerics::Float64);
    for (const ir::Param& p : forward.params) {
      const runtime::TensorSpec* t = step->program.find(forward.value(p.value).name);
      std::vector<double> data(static_cast<size_t>(t->numel()));
      for (int64_t i = 0; i < t->numel(); ++i) data[i] = runtime::read_element(step->ex->arena() + t->offset, t->dtype, i);
      in.set(p.value, data);
    }
    for (ir::ValueId v : forward.inputs) {  // tokens and targets: the sequences (the targets are not read)
      std::vector<double> data(static_cast<size_t>(batch * context), 0.0);
      for (int64_t b = 0; b < batch; ++b)
        for (size_t i = 0; i < sequences[b].size(); ++i) data[b * context + i] = static_cast<double>(sequences[b][i]);
      in.set(v, data);
    }
    in.run();
    // The logits: what the loss's cross_entropy reads (the loss may add other terms: moe_load_balance()).
    for (ir::NodeId id : forward.schedule())
      if (forward.node(id).op == ir::Op::CrossEntropy) return in.get(forward.node(id).in(0));
    FAIL("the forward graph has no cross_entropy");
    return {};
  }
};

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

int64_t argmax(const std::vector<double>& v) { return std::max_element(v.begin(), v.end()) - v.begin(); }

// gpt.yaml at odd sizes: 3 heads of 7, a context of 11, a batch of 2.
const std::map<std::string, int64_t> kOddGpt = {{"batch", 2}, {"seq", 11}, {"d", 21}, {"heads", 3}, {"layers", 2}};

}  // namespace

TEST_CASE("inference: the prefill's logits are the interpreter's forward of the same tokens (gpt at odd sizes)") {
  Decoder d(lowered("models/gpt.yaml", kOddGpt));
  std::vector<std::vector<int64_t>> seqs = {{3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5}, {2, 7, 1, 8, 2, 8, 1, 8, 2, 8, 4}};
  d.prefill(seqs);
  std::vector<double> want = d.oracle_logits(seqs), got;
  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t i = 0; i < d.context; ++i) {
      std::vector<double> row = d.prefill_row(b, i);
      got.insert(got.end(), row.begin(), row.end());
    }
  CHECK(max_abs_diff(got, want) < 1e-4);
}

TEST_CASE("inference: each decode step's logits equal the prefill's of the whole sequence (KV cache against none)") {
  for (const std::string model : {"models/gpt.yaml", "models/lm-gqa.yaml"}) {
    CAPTURE(model);
    std::map<std::string, int64_t> dims = kOddGpt;
    if (model.find("gqa") != std::string::npos)
      dims = {{"batch", 2}, {"seq", 9}, {"d", 24}, {"heads", 4}, {"kv_heads", 2}, {"hidden", 40}, {"layers", 2}, {"vocab", 61}};
    Decoder d(lowered(model, dims));
    // fp32 (gpt): the kernels' summation order; bf16-mixed (lm-gqa, grouped
    // kv heads): the head's matmul rounds the logits to bf16, so one rounding
    // apart is 2^-7 at |1|.
    const double tolerance = d.forward.config.precision.policy == ir::PrecisionPolicy::FP32 ? 1e-5 : 2.0 / 128;
    runtime::Rng rng(5, 0);
    std::vector<std::vector<int64_t>> seqs(static_cast<size_t>(d.batch));
    for (auto& s : seqs)
      for (int64_t i = 0; i < d.context; ++i) s.push_back(static_cast<int64_t>(rng.uniform01() * static_cast<double>(d.vocab)));
    // The full sequences through the prefill: the reference rows.
    d.prefill(seqs);
    std::vector<std::vector<std::vector<double>>> full(static_cast<size_t>(d.batch));
    for (int64_t b = 0; b < d.batch; ++b)
      for (int64_t i = 0; i < d.context; ++i) full[b].push_back(d.prefill_row(b, i));
    // A prompt of 3 through the prefill (the rest padded), then one decode step per position.
    const int64_t prompt = 3;
    std::vector<std::vector<int64_t>> head(seqs.size());
    for (size_t b = 0; b < seqs.size(); ++b) head[b].assign(seqs[b].begin(), seqs[b].begin() + prompt);
    d.prefill(head);
    for (int64_t b = 0; b < d.batch; ++b) CHECK(max_abs_diff(d.prefill_row(b, prompt - 1), full[b][prompt - 1]) < tolerance);
    for (int64_t pos = prompt; pos < d.context; ++pos) {
      std::vector<int64_t> token;
      for (const auto& s : seqs) token.push_back(s[pos]);
      d.decode(token, pos);
      for (int64_t b = 0; b < d.batch; ++b) {
        CAPTURE(pos);
        CHECK(max_abs_diff(d.decode_row(b), full[b][pos]) < tolerance);
      }
    }
  }
}

TEST_CASE("inference: greedy decoding with the KV cache picks the interpreter's argmax of the whole sequence, token for token") {
  Decoder d(lowered("models/gpt.yaml", kOddGpt));
  std::vector<std::vector<int64_t>> seqs = {{10, 20}, {30, 40}};
  d.prefill(seqs);
  for (int64_t b = 0; b < d.batch; ++b) seqs[b].push_back(argmax(d.prefill_row(b, 1)));
  for (int64_t pos = 2; pos + 1 < d.context; ++pos) {
    d.decode({seqs[0].back(), seqs[1].back()}, pos);
    for (int64_t b = 0; b < d.batch; ++b) seqs[b].push_back(argmax(d.decode_row(b)));
  }
  // The interpreter over the whole generated sequences: at every position its
  // argmax is the token that followed it (where its top two are apart).
  std::vector<double> logits = d.oracle_logits(seqs);
  int compared = 0;
  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t i = 1; i + 1 < static_cast<int64_t>(seqs[b].size()); ++i) {
      std::vector<double> row(logits.begin() + (b * d.context + i) * d.vocab, logits.begin() + (b * d.context + i + 1) * d.vocab);
      std::vector<double> sorted = row;
      std::sort(sorted.rbegin(), sorted.rend());
      if (sorted[0] - sorted[1] < 1e-4) continue;
      CAPTURE(b);
      CAPTURE(i);
      CHECK(argmax(row) == seqs[b][i + 1]);
      ++compared;
    }
  CHECK(compared >= 14);
}

namespace {


// Greedy text by `napkin sample`'s generation (runtime::generate) on a fresh
// engine, the prompt entering the cache by `path`, up to the end of the
// context; batch entry 0's sequence.
std::vector<int64_t> greedy_text(Decoder& d, const std::vector<int64_t>& prompt, runtime::PromptPath path) {
  std::unique_ptr<runtime::Engine> engine = d.engine();
  runtime::SampleOptions o;
  o.tokens = d.context - static_cast<int64_t>(prompt.size());  // no window: the interpreter sees it all
  o.temperature = 0;
  o.prompt_path = path;
  const runtime::Generated g = runtime::generate(*engine, prompt, o);
  if (path != runtime::PromptPath::Auto) CHECK(g.prompt_by_steps == (path == runtime::PromptPath::Steps));
  CHECK(g.windows == 0);
  return g.sequences[0];
}

// How many of `text`'s generated tokens are the interpreter's argmax of the
// whole text at the position before (all of them are, the CHECKs say),
// leaving out positions whose top two logits are within `tie`.
int interpreter_agrees(Decoder& d, const std::vector<int64_t>& text, size_t prompt, double tie) {
  const std::vector<double> logits = d.oracle_logits(std::vector<std::vector<int64_t>>(d.batch, text));
  int compared = 0;
  for (size_t i = prompt - 1; i + 1 < text.size(); ++i) {
    std::vector<double> row(logits.begin() + static_cast<int64_t>(i) * d.vocab,
                            logits.begin() + static_cast<int64_t>(i + 1) * d.vocab);
    std::vector<double> sorted = row;
    std::sort(sorted.rbegin(), sorted.rend());
    if (sorted[0] - sorted[1] < tie) continue;
    CAPTURE(i);
    CHECK(argmax(row) == text[i + 1]);
    ++compared;
  }
  return compared;
}

// The cached attentions of an inference program that rotate q and k
// themselves (rope fused); checks that no rope node is left beside them.
int rotating_cached_attentions(const Decoder& d) {
  int fused = 0;
  for (ir::NodeId id : d.step->g.schedule()) {
    const ir::Node& n = d.step->g.node(id);
    CHECK(n.op != ir::Op::Rope);
    fused += n.op == ir::Op::CachedAttention && ir::has_rope(n.attrs, "rope_");
  }
  return fused;
}

}  // namespace

TEST_CASE("inference: computed rotary positions give the interpreter's greedy text on every prompt path (prefill, steps, auto)") {
  // tests/e2e/data/rotary.yaml: rotary frequencies computed in the graph (Llama's RoPE).
  Decoder d(lowered("tests/e2e/data/rotary.yaml", {{"batch", 2}, {"seq", 12}, {"vocab", 40}}));
  const std::vector<int64_t> prompt = {7, 3, 12};
  const std::vector<int64_t> by_prefill = greedy_text(d, prompt, runtime::PromptPath::Prefill);
  const std::vector<int64_t> by_steps = greedy_text(d, prompt, runtime::PromptPath::Steps);
  const std::vector<int64_t> by_auto = greedy_text(d, prompt, runtime::PromptPath::Auto);
  CHECK(by_steps == by_prefill);
  CHECK(by_auto == by_prefill);
  CHECK(interpreter_agrees(d, by_prefill, prompt.size(), 1e-4) >= 6);
}

TEST_CASE("inference: rope fused into attention gives the interpreter's greedy text on every prompt path (prefill, steps, auto)") {
  // tests/e2e/data/rope.yaml: rope(q), rope(k) fused into the attention, so the
  // cached attention rotates q and the new k at the decode step's position.
  const ir::Graph g = lowered("tests/e2e/data/rope.yaml", {{"batch", 2}, {"seq", 12}, {"vocab", 40}});
  Decoder d(g);
  CHECK(rotating_cached_attentions(d) == 2);  // the prefill's and the decode step's
  const std::vector<int64_t> prompt = {7, 3, 12};
  const std::vector<int64_t> by_prefill = greedy_text(d, prompt, runtime::PromptPath::Prefill);
  const std::vector<int64_t> by_steps = greedy_text(d, prompt, runtime::PromptPath::Steps);
  const std::vector<int64_t> by_auto = greedy_text(d, prompt, runtime::PromptPath::Auto);
  CHECK(by_steps == by_prefill);
  CHECK(by_auto == by_prefill);
  CHECK(interpreter_agrees(d, by_prefill, prompt.size(), 1e-4) >= 6);
}

TEST_CASE("inference: models/llama.yaml (rope fused, grouped-query, bf16-mixed) writes the interpreter's greedy text by prefill, steps and auto") {
  Decoder d(lowered("models/llama.yaml", {{"batch", 2}, {"seq", 12}, {"d", 32}, {"heads", 4}, {"kv_heads", 2},
                                          {"hidden", 48}, {"layers", 2}}));
  CHECK(rotating_cached_attentions(d) == 4);  // 2 layers, the prefill's and the decode step's
  const std::vector<int64_t> prompt = {'L', 'l', 'a'};
  const std::vector<int64_t> by_prefill = greedy_text(d, prompt, runtime::PromptPath::Prefill);
  CHECK(greedy_text(d, prompt, runtime::PromptPath::Steps) == by_prefill);
  CHECK(greedy_text(d, prompt, runtime::PromptPath::Auto) == by_prefill);
  // bf16 logits: a rounding of 2^-7 at |1| apart, so near ties are left out.
  CHECK(interpreter_agrees(d, by_prefill, prompt.size(), 4.0 / 128) >= 3);
}

TEST_CASE("inference: a standalone rope gets the phase's positions: the interpreter's greedy text on every prompt path") {
  // tests/e2e/data/rope_standalone.yaml: ropes over [b, s, h, hd], which the
  // attention cannot apply; each phase's rope reads its positions input.
  Decoder d(lowered("tests/e2e/data/rope_standalone.yaml", {{"batch", 2}, {"seq", 12}, {"vocab", 40}}));
  int ropes = 0;
  for (ir::NodeId id : d.step->g.schedule()) {
    const ir::Node& n = d.step->g.node(id);
    if (n.op != ir::Op::Rope) continue;
    ++ropes;
    CHECK(ir::rope_params(n.attrs).explicit_positions);
    CHECK(n.inputs.size() == 2);
  }
  CHECK(ropes == 4);  // q and k, prefill and decode
  const std::vector<int64_t> prompt = {7, 3, 12};
  const std::vector<int64_t> by_prefill = greedy_text(d, prompt, runtime::PromptPath::Prefill);
  CHECK(greedy_text(d, prompt, runtime::PromptPath::Steps) == by_prefill);
  CHECK(interpreter_agrees(d, by_prefill, prompt.size(), 1e-4) >= 6);
}

TEST_CASE("inference: top_k works position by position: the interpreter's greedy text on every prompt path") {
  // tests/e2e/data/top_k_lm.yaml: each phase rebuilds top_k with both its
  // outputs (values and indices) at the phase's length.
  Decoder d(lowered("tests/e2e/data/top_k_lm.yaml", {{"batch", 2}, {"seq", 12}}));
  int picks = 0;
  for (ir::NodeId id : d.step->g.schedule()) picks += d.step->g.node(id).op == ir::Op::TopK;
  CHECK(picks == 2);  // prefill and decode
  const std::vector<int64_t> prompt = {7, 3, 12};
  const std::vector<int64_t> by_prefill = greedy_text(d, prompt, runtime::PromptPath::Prefill);
  CHECK(greedy_text(d, prompt, runtime::PromptPath::Steps) == by_prefill);
  CHECK(interpreter_agrees(d, by_prefill, prompt.size(), 1e-4) >= 6);
}

TEST_CASE("inference: a moe() layer is rebuilt at each phase's tokens, every token routed: the interpreter's greedy text on every prompt path") {
  // models/moe.yaml, 2 of 4 experts: a phase routes all of its batch *
  // length tokens (C = T), so a token's result does not depend on the others
  // and the decode steps agree with the prefill, and with the interpreter's
  // forward at capacity factor E/k = 2, which drops nothing either.
  Decoder d(lowered("models/moe.yaml", {{"batch", 2}, {"seq", 12}, {"vocab", 32}, {"d", 16}, {"heads", 2},
                                        {"kv_heads", 1}, {"experts", 4}, {"expert_hidden", 8}, {"layers", 2},
                                        {"capacity_percent", 200}}));
  std::vector<int64_t> capacities;
  for (ir::NodeId id : d.step->g.schedule())
    if (d.step->g.node(id).op == ir::Op::MoeSlots) capacities.push_back(d.step->g.node(id).attrs.get_int("capacity"));
  CHECK(capacities == std::vector<int64_t>{24, 24, 2, 2});  // prefill: 2 x 12 tokens; decode: 2 x 1
  const std::vector<int64_t> prompt = {7, 3, 12};
  const std::vector<int64_t> by_prefill = greedy_text(d, prompt, runtime::PromptPath::Prefill);
  CHECK(greedy_text(d, prompt, runtime::PromptPath::Steps) == by_prefill);
  CHECK(interpreter_agrees(d, by_prefill, prompt.size(), 1e-4) >= 6);
}

TEST_CASE("inference: a mixed-precision model's weight casts are computed before a prompt that goes in by decode steps") {
  // lm-gqa is bf16-mixed: its decode step reads the weights cast to bf16
  // once, by the program's setup, not by each step nor only by the prefill.
  Decoder d(lowered("models/lm-gqa.yaml", {{"batch", 2}, {"seq", 9}, {"d", 24}, {"heads", 4}, {"kv_heads", 2},
                                           {"hidden", 40}, {"layers", 2}, {"vocab", 61}}));
  const std::vector<int64_t> prompt = {5, 17};
  for (runtime::PromptPath path : {runtime::PromptPath::Prefill, runtime::PromptPath::Steps}) {
    CAPTURE(static_cast<int>(path));
    // bf16 logits: a rounding of 2^-7 at |1| apart, so near ties are left out.
    CHECK(interpreter_agrees(d, greedy_text(d, prompt, path), prompt.size(), 4.0 / 128) >= 3);
  }
}

TEST_CASE("inference: a language model with dropout derives its sampler (dropout is the identity, its rng words unread)") {
  // gpt.yaml with dropout on each block's MLP output: napkin train derives
  // this program for --sample-every, napkin sample for itself.
  std::string yaml = testing::read_source("models/gpt.yaml");
  const std::string mlp = R"(- x: x + einsum(h, w_out, "b s f, f d -> b s d"))";
  REQUIRE(yaml.find(mlp) != std::string::npos);
  yaml.replace(yaml.find(mlp), mlp.size(), R"(- x: x + dropout(einsum(h, w_out, "b s f, f d -> b s d"), 0.1))");
  ir::Diagnostics diag;
  frontend::LoadOptions options;
  options.dim_overrides = kOddGpt;
  std::optional<ir::Graph> g = frontend::load_model_text(yaml, "gpt-dropout.yaml", diag, options);
  INFO(diag.render());
  REQUIRE(g.has_value());
  Decoder d(*g);
  // The prefill of whole sequences against decode steps from position 0.
  std::vector<std::vector<int64_t>> seqs = {{3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5}, {2, 7, 1, 8, 2, 8, 1, 8, 2, 8, 4}};
  d.prefill(seqs);
  std::vector<std::vector<double>> rows;
  for (int64_t i = 0; i < d.context; ++i) rows.push_back(d.prefill_row(0, i));
  for (int64_t pos = 0; pos < d.context; ++pos) {
    CAPTURE(pos);
    d.decode({seqs[0][pos], seqs[1][pos]}, pos);
    CHECK(max_abs_diff(d.decode_row(0), rows[pos]) < 1e-5);
  }
}

TEST_CASE("inference: sample_token is greedy at temperature 0 and with top-k 1, repeatable by seed, and draws by the softmax") {
  const std::vector<double> logits = {0.5, 2.0, -1.0, 2.0, 1.0};
  runtime::Rng g(1, 0);
  CHECK(runtime::sample_token(logits, 0.0, 0, g) == 1);  // the first of the two largest
  CHECK(runtime::sample_token(logits, 0.7, 1, g) == 1);
  runtime::Rng a(1, 0), b(1, 0), c(2, 0);
  std::vector<int64_t> x, y, z;
  for (int i = 0; i < 50; ++i) {
    x.push_back(runtime::sample_token(logits, 1.0, 0, a));
    y.push_back(runtime::sample_token(logits, 1.0, 0, b));
    z.push_back(runtime::sample_token(logits, 1.0, 0, c));
  }
  CHECK(x == y);
  CHECK(x != z);
  // Frequencies over many draws against softmax(logits / 0.8), top-3 kept.
  runtime::Rng r(9, 3);
  std::vector<int> counts(logits.size(), 0);
  const int draws = 200000;
  for (int i = 0; i < draws; ++i) ++counts[static_cast<size_t>(runtime::sample_token(logits, 0.8, 3, r))];
  std::vector<double> p(logits.size(), 0.0);
  double sum = 0;
  for (size_t i : {1, 3, 4}) sum += p[i] = std::exp(logits[i] / 0.8);
  for (size_t i = 0; i < p.size(); ++i) {
    CAPTURE(i);
    const double expected = p[i] / sum * draws;
    CHECK(std::abs(counts[i] - expected) <= 5 * std::sqrt(expected + 1));  // five standard deviations
  }
  CHECK(counts[0] == 0);
  CHECK(counts[2] == 0);
}

TEST_CASE("inference: sample_token at a tiny temperature (1e-310, 1e-320) draws among the largest logits, never overflows") {
  const std::vector<double> one_largest = {0.5, 2.0, -1.0, 1.9, 1.0};
  const std::vector<double> two_largest = {0.5, 2.0, -1.0, 2.0, 1.0};
  for (double t : {1e-300, 1e-310, 1e-320, 4.9e-324}) {
    CAPTURE(t);
    runtime::Rng r(4, 0);
    for (int i = 0; i < 20; ++i) {
      CHECK(runtime::sample_token(one_largest, t, 0, r) == 1);
      const int64_t tied = runtime::sample_token(two_largest, t, 0, r);
      CHECK((tied == 1 || tied == 3));
    }
  }
}

TEST_CASE("inference: a model that is not a language model, or mixes positions otherwise than by attention, is refused at its line") {
  ir::Diagnostics diag;
  ir::Graph mlp = lowered("models/mlp.yaml", {});
  CHECK_FALSE(passes::run_inference_pipeline(mlp, diag));
  CHECK(diag.render().find("is not a language model") != std::string::npos);

  // A mean over the sequence (a bag of tokens) mixes positions.
  const std::string bag = R"(model: bag
dims: {batch: 2, seq: 5, vocab: 16, d: 8}
inputs:
  tokens: {shape: [batch, seq], dtype: i32}
  targets: {shape: [batch, seq], dtype: i32}
params:
  wte: {shape: [vocab, d], init: normal(0.02)}
forward:
  - x: embedding(wte, tokens)
  - m: reduce(x, "b s d -> b d", "mean")
  - y: x + rearrange(m, "b d -> b 1 d")
  - logits: einsum(y, wte, "b s d, v d -> b s v")
loss: cross_entropy(logits, targets)
optimizer: sgd(lr=0.1)
)";
  ir::Diagnostics d2;
  std::optional<ir::Graph> g = frontend::load_model_text(bag, "bag.yaml", d2);
  INFO(d2.render());
  REQUIRE(g.has_value());
  CHECK_FALSE(passes::run_inference_pipeline(*g, d2));
  const std::string text = d2.render();
  CHECK(text.find("bag.yaml:10") != std::string::npos);
  CHECK(text.find("position by position") != std::string::npos);
}

namespace {

// The inference program of `model` at `dims` and `batch` (and at twice the batch), analyzed on `device`.
analysis::InferenceCost inference_cost(const std::string& model, std::map<std::string, int64_t> dims, int64_t batch,
                                       const char* device) {
  auto derived = [&](int64_t b) {
    dims["batch"] = b;
    ir::Graph g = lowered(model, dims);
    ir::Diagnostics diag;
    REQUIRE(passes::run_inference_pipeline(g, diag));
    return g;
  };
  const ir::Graph one = derived(batch), two = derived(2 * batch);
  return analysis::analyze_inference(one, two, *analysis::find_device(device));
}

}  // namespace

TEST_CASE("inference report: KV cache, parameters and decode FLOPs against the hand formulas") {
  // gpt.yaml: d = 64, 4 heads, 2 layers, context 32, vocab 256, fp32; tied embedding.
  const int64_t d = 64, layers = 2, T = 32, V = 256, B = 3;
  analysis::InferenceCost c = inference_cost("models/gpt.yaml", {{"seq", T}, {"d", d}, {"heads", 4}, {"layers", layers}}, B, "h100");
  CHECK(c.batch == B);
  CHECK(c.context == T);
  CHECK(c.layers == layers);
  CHECK(c.kv_bytes_per_sequence == 2.0 * layers * T * d * 4);  // 2 · layers · T · d · bytes
  CHECK(c.kv_bytes_per_token == 2.0 * layers * d * 4);
  CHECK(c.kv_bytes == B * c.kv_bytes_per_sequence);
  const double blocks = layers * (d * 3 * d + d * d + d * 4 * d + 4 * d * d + 4 * d);  // weights, gains and biases
  CHECK(c.params == static_cast<int64_t>(blocks + V * d + T * d + 2 * d));
  CHECK(c.param_bytes == 4.0 * static_cast<double>(c.params));
  // A decode step per token: 2 FLOPs per weight of every matmul (the blocks'
  // and the tied head's), plus q·k and p·v over the whole cache (4·T·d a
  // layer), plus the softmax and the elementwise work (a few percent).
  const double matmuls = 2.0 * (layers * 12 * d * d + V * d) + 4.0 * layers * T * d;
  CHECK(c.decode_flops_per_sequence >= matmuls);
  CHECK(c.decode_flops_per_sequence <= 1.05 * matmuls);
  CHECK(c.prefill.tokens == B * T);
  CHECK(c.decode.tokens == B);
  CHECK(c.prefill.tokens_per_second() == doctest::Approx(B * T / c.prefill.seconds));
  // The affine split: the weights once (at least the blocks' matmul weights), each sequence's cache read whole.
  CHECK(c.decode_weight_bytes >= 4.0 * layers * 12 * d * d);
  CHECK(c.decode_weight_bytes <= 1.2 * c.param_bytes);
  CHECK(c.decode_bytes_per_sequence >= c.kv_bytes_per_sequence);
  CHECK(c.decode.intensity() < c.ridge);  // memory-bound at batch 3
  CHECK(std::isinf(c.compute_bound_batch));  // each sequence's cache and activations outweigh its FLOPs at d = 64

  // Wider and shorter (d = 256, context 8), on the CPU row: decoding turns
  // compute-bound at the batch where b·F / (W + b·S) reaches the ridge.
  analysis::InferenceCost w = inference_cost("models/gpt.yaml", {{"seq", 8}, {"d", 256}, {"heads", 4}, {"layers", 1}}, 1, "cpu");
  REQUIRE(std::isfinite(w.compute_bound_batch));
  auto intensity = [&](double b) {
    return b * w.decode_flops_per_sequence / (w.decode_weight_bytes + b * w.decode_bytes_per_sequence);
  };
  CHECK(w.compute_bound_batch > 1);
  CHECK(intensity(w.compute_bound_batch) >= w.ridge);
  CHECK(intensity(w.compute_bound_batch - 1) < w.ridge);

  // lm-gqa: 2 kv heads of 64 under 8 query heads, bf16 caches.
  analysis::InferenceCost g = inference_cost("models/lm-gqa.yaml", {{"seq", 64}, {"layers", 2}}, 1, "h100");
  CHECK(g.kv_bytes_per_sequence == 2.0 * 2 * 64 * (2 * 64) * 2);
}
