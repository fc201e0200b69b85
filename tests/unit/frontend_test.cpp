// The model language: dims, params and init, blocks with per-layer names,
// einops lowering to views, multiple assignment, and error collection.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cmath>
#include <map>
#include <optional>
#include <utility>

#include "analysis/cost.h"
#include "ir/printer.h"
#include "ir/rope.h"
#include "support/test_models.h"

using namespace napkin;
using napkin::testing::compile;
using napkin::testing::compile_errors;

namespace {
const char* kHeader = R"yaml(
model: t
optimizer: sgd(lr=0.1)
)yaml";

int count_ops(const ir::Graph& g, ir::Op op) {
  int n = 0;
  for (ir::NodeId id : g.schedule()) n += g.node(id).op == op;
  return n;
}
}  // namespace

TEST_CASE("dims: expressions of other dims, in any order") {
  ir::Graph g = compile(std::string(kHeader) + R"yaml(
dims: {head_dim: d / heads, d: 256, heads: 4, hidden: 4 * d}
inputs: {x: {shape: [head_dim, hidden]}}
loss: mean(x)
)yaml");
  const ir::TensorType& t = g.value(g.inputs[0]).type;
  CHECK(t.sizes() == std::vector<int64_t>{64, 1024});
  CHECK(t.dims[0].name == "head_dim");
}

TEST_CASE("dims: powers of 0, 1 and -1 with huge exponents fold at once") {
  // 1 ** (2 ** 48) used to loop 2^48 times (the loop stopped only
  // when the power passed 2^48, which these bases never do).
  ir::Graph g = compile(std::string(kHeader) + R"yaml(
dims:
  a: 1 ** 281474976710656
  z: 0 ** (2 ** 48) + 3
  m: (-1) ** (2 ** 47 + 1) + 2
  p: 0 ** 0
  q: (-1) ** (2 ** 47) + 4
inputs: {x: {shape: [a, z, m, p, q]}}
loss: mean(x)
)yaml");
  CHECK(g.value(g.inputs[0]).type.sizes() == std::vector<int64_t>{1, 3, 1, 1, 5});
}

TEST_CASE("dims: a long chain of dims resolves without deep recursion") {
  // d0: d1, d1: d2, ... used to resolve by recursion through eval, and 30000
  // dims overflowed the stack (3000 under ASan).
  std::string yaml = std::string(kHeader) + "dims:\n";
  const int n = 30000;
  for (int i = 0; i + 1 < n; ++i) yaml += "  d" + std::to_string(i) + ": d" + std::to_string(i + 1) + " + 1\n";
  yaml += "  d" + std::to_string(n - 1) + ": 1\ninputs: {x: {shape: [d0]}}\nloss: mean(x)\n";
  ir::Graph g = compile(yaml);
  CHECK(g.value(g.inputs[0]).type.sizes() == std::vector<int64_t>{n});
}

TEST_CASE("blocks: thousands of block definitions read in linear time and memory") {
  // read_blocks used to copy each filled BlockDef into the map, and assigning
  // a YAML::Node that already refers to a node merges the whole
  // document's node memory into it: 5000 blocks took 60 s and 11 GB.
  std::string yaml = std::string(kHeader) + "blocks:\n";
  for (int i = 0; i < 5000; ++i) yaml += "  b" + std::to_string(i) + ": {forward: [x: x + 1]}\n";
  yaml += "inputs: {x: {shape: [4]}}\nforward: [y: \"repeat(b4999, 2, x)\"]\nloss: mean(y)\n";
  ir::Graph g = compile(yaml);
  CHECK(count_ops(g, ir::Op::Add) == 2);
}

TEST_CASE("params: init specs, xavier fan-in and truncation") {
  ir::Graph g = compile(std::string(kHeader) + R"yaml(
dims: {d: 256, k: 64}
inputs: {x: {shape: [8, d]}}
params:
  w: {shape: [d, k], init: xavier}
  v: {shape: [d, k], init: "trunc_normal(0.02, -0.04, 0.04)"}
  b: {shape: [k], init: normal(1 / sqrt(d))}
loss: mean(x @ w + x @ v + b)
)yaml");
  REQUIRE(g.params.size() == 3);
  const ir::InitSpec& w = g.params[0].init;
  CHECK(w.kind == ir::InitSpec::Kind::Xavier);
  CHECK(w.fan_in == 256);
  CHECK(w.std == doctest::Approx(1.0 / 16));
  CHECK(w.hi == doctest::Approx(3.0 / 16));
  CHECK(g.params[1].init.lo == doctest::Approx(-0.04));
  CHECK(g.params[2].init.std == doctest::Approx(1.0 / 16));
  CHECK(g.param_count() == 256 * 64 * 2 + 64);
}

TEST_CASE("blocks: repeat stamps per-layer parameter names") {
  ir::Graph g = compile(std::string(kHeader) + R"yaml(
dims: {d: 8, layers: 3}
inputs: {x: {shape: [2, d]}}
blocks:
  block:
    params: {w_qkv: {shape: [d, d], init: normal(0.02)}}
    forward:
      - x: relu(x @ w_qkv)
forward:
  - y: repeat(block, layers, x)
loss: mean(y)
)yaml");
  REQUIRE(g.params.size() == 3);
  CHECK(g.value(g.params[0].value).name == "blocks.0.w_qkv");
  CHECK(g.value(g.params[2].value).name == "blocks.2.w_qkv");
  // Nodes inside an instance carry its scope.
  int scoped = 0;
  for (ir::NodeId id : g.schedule()) scoped += g.node(id).scope == "blocks.1";
  CHECK(scoped == 2);  // matmul and relu
}

TEST_CASE("einops: rearrange into heads is a view - merging a contiguous (b h s hd) copies") {
  ir::Graph g = compile(std::string(kHeader) + R"yaml(
dims: {b: 2, s: 4, d: 6, heads: 2}
inputs: {qkv: {shape: [b, s, 3*d]}}
forward:
  - q, k, v: rearrange(qkv, "b s (three h hd) -> three b h s hd", three=3, h=heads)
  - back: rearrange(q, "b h s hd -> b s (h hd)")
  - o: q * 2
  - y: rearrange(o, "b h s hd -> b s (h hd)")
loss: mean(y + back + k[0, 0, 0, 0] + v[1, 1, 1, 1])
)yaml");
  // Splitting qkv into heads and merging q back are free: q's elements still sit
  // in (b s h hd) order. o is contiguous in (b h s hd) order, so merging its
  // heads needs one copy.
  CHECK(count_ops(g, ir::Op::Copy) == 1);
  for (ir::NodeId id : g.schedule()) {
    const ir::Node& n = g.node(id);
    if (n.op == ir::Op::Select && g.value(n.out()).type.rank() == 4) {
      CHECK(g.value(n.out()).is_view());
      CHECK(g.value(n.out()).type.sizes() == std::vector<int64_t>{2, 2, 4, 3});
    }
  }
}

TEST_CASE("einsum: FLOP-relevant attrs and output naming") {
  ir::Graph g = compile(std::string(kHeader) + R"yaml(
dims: {b: 2, i: 3, j: 5, d: 4}
inputs: {q: {shape: [b, i, d]}, k: {shape: [b, j, d]}}
forward:
  - s: einsum(q, k, "b i d, b j d -> b i j")
loss: mean(s)
)yaml");
  ir::NodeId id = g.value(g.find_output("loss")).producer;
  const ir::Node& mean = g.node(id);
  const ir::Value& s = g.value(mean.in(0));
  CHECK(s.name == "s");
  CHECK(s.type.sizes() == std::vector<int64_t>{2, 3, 5});
  CHECK(s.type.dims[2].name == "j");
}

TEST_CASE("numbers fold at compile time") {
  ir::Graph g = compile(std::string(kHeader) + R"yaml(
dims: {d: 64}
inputs: {x: {shape: [d]}}
loss: mean(x / sqrt(d))
)yaml");
  // sqrt(d) is the constant 8, not a sqrt node.
  CHECK(count_ops(g, ir::Op::Sqrt) == 0);
  bool found = false;
  for (ir::NodeId id : g.schedule())
    if (g.node(id).op == ir::Op::Constant) found = g.node(id).attrs.get_double("value") == 8.0;
  CHECK(found);
}

TEST_CASE("every error in a file is reported, with file:line:col and a caret") {
  std::string out = compile_errors(R"yaml(model: t
dims: {d: 8}
inputs: {x: {shape: [d, dd]}}
params:
  w: {shape: [d, 4], init: xavier}
forward:
  - h: relu(x @ w)
  - y: softmaxx(h)
loss: mean(h)
optimizer: adamx(lr=1)
)yaml",
                                   "bad.yaml");
  CHECK(out.find("bad.yaml:3:25: error: unknown dim 'dd'; did you mean 'd'?") != std::string::npos);
  CHECK(out.find("bad.yaml:8:8: error: unknown function 'softmaxx'; did you mean 'softmax'?") != std::string::npos);
  CHECK(out.find("bad.yaml:10:12: error: unknown optimizer 'adamx'; did you mean 'adam") != std::string::npos);
  // The source line and a caret under the column.
  CHECK(out.find("    inputs: {x: {shape: [d, dd]}}\n                            ^\n") != std::string::npos);
  CHECK(out.find("3 errors generated.") != std::string::npos);
}

TEST_CASE("training settings are parsed and validated") {
  ir::Graph g = compile(R"yaml(
model: t
inputs: {x: {shape: [4]}}
params: {w_b: {shape: [4], init: zeros}}
loss: mean(x + w_b)
optimizer: adamw(3e-4, betas=[0.9, 0.95], weight_decay=0.1, grad_clip=1.0, schedule=cosine, warmup=10, no_decay=["*_b"])
precision: {policy: fp16-mixed, loss_scale: {init: 1024, growth_interval: 100}}
train: {steps: 20, seed: 7, checkpoint: {every: 5, dir: ck}, eval: {every: 10}}
)yaml");
  const auto& c = g.config;
  CHECK(c.optimizer.kind == ir::OptimizerKind::AdamW);
  CHECK(c.optimizer.lr == doctest::Approx(3e-4));
  CHECK(c.optimizer.beta2 == doctest::Approx(0.95));
  CHECK(c.optimizer.schedule == "cosine");
  CHECK(c.optimizer.warmup_steps == 10);
  CHECK(c.optimizer.no_decay == std::vector<std::string>{"*_b"});
  CHECK(c.precision.policy == ir::PrecisionPolicy::FP16Mixed);
  CHECK(c.precision.loss_scale.init_scale == 1024);
  CHECK(c.precision.loss_scale.growth_interval == 100);
  CHECK(c.train.steps == 20);
  CHECK(c.train.seed == 7);
  CHECK(c.train.checkpoint_every == 5);
  CHECK(c.train.checkpoint_dir == "ck");
  CHECK(c.train.eval_every == 10);
}

TEST_CASE("a model name with ../ or / keeps its default checkpoint dir one directory inside checkpoints/") {
  const std::pair<const char*, const char*> cases[] = {
      {"../escape", "checkpoints/.._escape"}, {"..", "checkpoints/__"}, {".", "checkpoints/_"},
      {"a/../../b", "checkpoints/a_.._.._b"}, {"gpt-char", "checkpoints/gpt-char"}};
  for (const auto& [name, dir] : cases) {
    CAPTURE(name);
    ir::Graph g = compile(fmt::format(R"yaml(
model: "{}"
inputs: {{x: {{shape: [4]}}}}
params: {{w: {{shape: [4], init: zeros}}}}
loss: mean(x + w)
optimizer: sgd(lr=0.1)
)yaml", name));
    CHECK(g.config.train.checkpoint_dir == dir);
  }
}

TEST_CASE("every op the language names lowers (a model using all of them compiles)") {
  ir::Graph g = compile(std::string(kHeader) + R"yaml(
dims: {b: 2, s: 4, d: 8, v: 5}
inputs: {x: {shape: [b, s, d]}, ids: {shape: [b, s], dtype: i32}, t: {shape: [b, s], dtype: i64}}
params:
  g: {shape: [d], init: ones}
  bias: {shape: [d], init: zeros}
  table: {shape: [v, d], init: normal(0.1)}
forward:
  - e: embedding(table, ids) + x
  - a: exp(e) + log(abs(e) + 1) + sqrt(abs(e)) + rsqrt(abs(e) + 1) + tanh(e) + relu(e) + rope(e, seq_axis=s)
  - c: gelu(a) + gelu(a, approximate="none") + sigmoid(a) + silu(a) + pow(a, 2) + a ** 2 - -a
  - m: max(c, 0) + min(c, 1) + maximum(c, 0.5) + minimum(c, 0.5) + where(c > 0, c, 0)
  - n: layernorm(m, g, bias) + rmsnorm(m, g, eps=1e-5)
  - p: softmax(n, axis=-1) + log_softmax(n) + cast(cast(n, bf16), f32)
  - q: matmul(p, transpose(p)) + triu(matmul(p, transpose(p)), k=1)
  - r: causal_mask(q) + sum(q, axis=-1, keepdims=true) + mean(q, axis=[1, 2], keepdims=true)
  - w: concat(r, r, axis=-1)
  - l, h: split(w, 2, axis=-1)
  - z: reduce(l, "b i j -> b i", "max") + reduce(h, "b i j -> b i", "mean") + cast(arange(s), f32)
  - logits: einsum(z, table[0:4, 0:5], "b s, s c -> b c")
loss: cross_entropy(rearrange(logits, "b c -> b 1 c"), t[:, 0:1]) + mse(z, z * 2) + mean(x[0, 1:3, :])
)yaml");
  CHECK(g.schedule().size() > 60);
}

TEST_CASE("rope: arguments by position or keyword, axes by index or name, the style a word or a string, None for none") {
  // A dim named `half` does not hide the style `half`.
  ir::Graph g = compile(std::string(kHeader) + R"yaml(
dims: {batch: 2, heads: 2, seq: 4, half: 4, hd: 2 * half}
inputs: {x: {shape: [batch, heads, seq, hd]}, pos: {shape: [seq], dtype: i64}}
forward:
  - a: rope(x)
  - b: rope(x, 500000, interleaved, axis=hd, seq_axis=seq, factor=8, low_freq_factor=2, high_freq_factor=3, original_context=seq * 4)
  - c: rope(x, style=half, positions=pos, factor=None, axis=-1, seq_axis=2)
  - d: rope(x, theta=seq * 25, style="interleaved", axis=1, seq_axis=-1)
  - y: a + b + c + rearrange(d, "b h s hd -> b h s hd")
loss: mean(y)
)yaml");
  std::vector<const ir::Node*> ropes;
  for (ir::NodeId id : g.schedule())
    if (g.node(id).op == ir::Op::Rope) ropes.push_back(&g.node(id));
  REQUIRE(ropes.size() == 4);
  const ir::RopeParams a = ir::rope_params(ropes[0]->attrs), b = ir::rope_params(ropes[1]->attrs),
                       c = ir::rope_params(ropes[2]->attrs), d = ir::rope_params(ropes[3]->attrs);
  CHECK(a == ir::RopeParams{.axis = 3, .seq_axis = 2});  // the defaults: theta 10000, half, no scaling
  CHECK(b == ir::RopeParams{.style = ir::RopeStyle::Interleaved, .theta = 500000, .factor = 8, .low_freq_factor = 2,
                            .high_freq_factor = 3, .original_context = 16, .axis = 3, .seq_axis = 2});
  CHECK(c == ir::RopeParams{.axis = 3, .seq_axis = 2, .explicit_positions = true});
  CHECK(ropes[2]->inputs.size() == 2u);
  CHECK(d == ir::RopeParams{.style = ir::RopeStyle::Interleaved, .theta = 100, .axis = 1, .seq_axis = 3});
  // The type is x's.
  CHECK(ir::to_string(g.value(ropes[1]->out()).type) == ir::to_string(g.value(ropes[1]->in(0)).type));
}

TEST_CASE("top_k(x, k): the k largest values of each row along the last axis, k by position, keyword or dim") {
  ir::Graph g = compile(std::string(kHeader) + R"yaml(
dims: {batch: 3, experts: 8, k: 2}
inputs: {x: {shape: [batch, experts]}}
forward:
  - a: top_k(x, 2)
  - b: top_k(x=x, k=k)
  - c: top_k(x * 2, k + 1)
loss: mean(a * b) + mean(c)
)yaml");
  std::vector<const ir::Node*> picks;
  for (ir::NodeId id : g.schedule())
    if (g.node(id).op == ir::Op::TopK) picks.push_back(&g.node(id));
  REQUIRE(picks.size() == 3);
  CHECK(picks[0]->attrs.get_int("k") == 2);
  CHECK(picks[1]->attrs.get_int("k") == 2);
  CHECK(picks[2]->attrs.get_int("k") == 3);
  CHECK(ir::to_string(g.value(picks[0]->out(0)).type) == "f32[batch=3, 2]");
  CHECK(ir::to_string(g.value(picks[0]->out(1)).type) == "i32[batch=3, 2]");
  const std::string out = compile_errors(std::string(kHeader) + R"yaml(
inputs: {x: {shape: [3, 4]}, ids: {shape: [3, 4], dtype: i32}}
forward:
  - a: top_k(x, 1.5)
  - b: top_k(ids, 1)
loss: mean(a) + mean(cast(b, f32))
)yaml");
  CHECK(out.find("top_k: k") != std::string::npos);
  CHECK(out.find("top_k needs a floating-point input, got i32") != std::string::npos);
}

TEST_CASE("rope: a rotated axis of odd length through axis=, a float positions tensor and a rank-1 operand are errors") {
  const std::string out = compile_errors(std::string(kHeader) + R"yaml(
dims: {s: 4, d: 6, e: 3}
inputs: {x: {shape: [s, d, e]}, p: {shape: [s]}, v: {shape: [d]}}
forward:
  - a: rope(x, axis=e, seq_axis=s)
  - b: rope(x, axis=d, seq_axis=s, positions=p)
  - c: rope(v)
  - y: x
loss: mean(y)
)yaml", "r.yaml");
  INFO(out);
  CHECK(out.find("r.yaml:8:13: error: rope: the rotated axis 2 of f32[s=4, d=6, e=3] has odd size 3") != std::string::npos);
  CHECK(out.find("r.yaml:9:46: error: rope: positions f32[s=4] are not one i32 or i64 per index of seq_axis 0") !=
        std::string::npos);
  CHECK(out.find("r.yaml:10:13: error: rope needs at least 2 axes") != std::string::npos);
  CHECK(out.find("3 errors generated.") != std::string::npos);
}

TEST_CASE("nested repeats name inner parameters under each outer copy") {
  ir::Graph g = compile(std::string(kHeader) + R"yaml(
dims: {d: 4}
inputs: {x: {shape: [2, d]}}
blocks:
  inner:
    params: {w: {shape: [d, d], init: normal(0.02)}}
    forward:
      - x: x @ w
  outer:
    forward:
      - x: repeat(inner, 2, x, prefix="sub")
forward:
  - y: repeat(outer, 2, x)
loss: mean(y)
)yaml");
  std::vector<std::string> names;
  for (const ir::Param& p : g.params) names.push_back(g.value(p.value).name);
  CHECK(names == std::vector<std::string>{"blocks.0.sub.0.w", "blocks.0.sub.1.w", "blocks.1.sub.0.w", "blocks.1.sub.1.w"});
}

TEST_CASE("numbers: 2e3 is a whole dim - % takes the divisor's sign everywhere") {
  ir::Graph g = compile(std::string(kHeader) + R"yaml(
dims: {d: 2e3, r: -7 % 3}
inputs: {x: {shape: [d, r]}}
loss: mean(x * (-7 % 3))
)yaml");
  CHECK(g.value(g.inputs[0]).type.sizes() == std::vector<int64_t>{2000, 2});
  bool found = false;
  for (ir::NodeId id : g.schedule())
    if (g.node(id).op == ir::Op::Constant) found = found || g.node(id).attrs.get_double("value") == 2.0;
  CHECK(found);
}

TEST_CASE("every node of a rearrange carries the rearrange's own line") {
  ir::Graph g = compile(std::string(kHeader) + R"yaml(
dims: {b: 2, h: 3, s: 4, e: 5}
inputs: {x: {shape: [b, h, s, e]}}
forward:
  - o: x * 2
  - y: rearrange(o, "b h s e -> b s (h e)")
loss: mean(y)
)yaml");
  int checked = 0;
  for (ir::NodeId id : g.schedule()) {
    const ir::Node& n = g.node(id);
    if (n.op == ir::Op::Permute || n.op == ir::Op::Copy || n.op == ir::Op::Reshape) {
      CHECK(n.loc.line == 9);
      ++checked;
    }
  }
  CHECK(checked == 3);
}

namespace {
// Lowers `yaml` with dim overrides; returns the graph (empty on errors) and the rendered diagnostics.
std::pair<std::optional<ir::Graph>, std::string> load_with(const std::string& yaml,
                                                           const std::map<std::string, int64_t>& dims,
                                                           const std::string& name = "inline.yaml") {
  ir::Diagnostics diag;
  frontend::LoadOptions options;
  options.dim_overrides = dims;
  std::optional<ir::Graph> g = frontend::load_model_text(yaml, name, diag, options);
  return {std::move(g), diag.render()};
}
}  // namespace

TEST_CASE("frontend: dim overrides replace the file's values and re-derive dependent dims") {
  const std::string yaml = std::string(kHeader) + R"yaml(
dims: {head_dim: d / heads, d: 256, heads: 4, hidden: 4 * d}
inputs: {x: {shape: [head_dim, hidden, heads]}}
loss: mean(x)
)yaml";
  auto [g, out] = load_with(yaml, {{"d", 48}, {"heads", 3}});
  INFO(out);
  REQUIRE(g.has_value());
  CHECK(g->value(g->inputs[0]).type.sizes() == std::vector<int64_t>{16, 192, 3});
  CHECK(g->value(g->inputs[0]).type.dims[0].name == "head_dim");
  // A derived dim may be overridden directly: its expression is not evaluated.
  auto [g2, out2] = load_with(yaml, {{"head_dim", 7}});
  INFO(out2);
  REQUIRE(g2.has_value());
  CHECK(g2->value(g2->inputs[0]).type.sizes() == std::vector<int64_t>{7, 1024, 4});
  // No overrides: the file's own sizes.
  auto [g3, out3] = load_with(yaml, {});
  REQUIRE(g3.has_value());
  CHECK(g3->value(g3->inputs[0]).type.sizes() == std::vector<int64_t>{64, 1024, 4});
}

TEST_CASE("frontend: dim overrides shrink gpt.yaml, repeat count included") {
  const std::map<std::string, int64_t> small = {{"d", 32}, {"heads", 2}, {"layers", 1},
                                                {"vocab", 16}, {"seq", 8}, {"batch", 2}};
  ir::Diagnostics diag;
  std::optional<ir::Graph> g =
      frontend::load_model_file(napkin::testing::source_path("models/gpt.yaml"), diag, {small});
  if (g) passes::run_forward_pipeline(*g, diag);
  INFO(diag.render());
  REQUIRE(g.has_value());
  REQUIRE_FALSE(diag.has_errors());
  // By hand from models/gpt.yaml, hidden = 4 * d = 128:
  //   wte 16*32 + wpe 8*32 + lnf_g, lnf_b 2*32                                  =   832
  //   per block: ln1 2*32 + w_qkv 32*96 + w_proj 32*32 + ln2 2*32
  //              + w_fc 32*128 + w_out 128*32                                   = 12416
  CHECK(g->param_count() == 832 + 12416);
  CHECK(g->params.size() == 4 + 8);
  for (const ir::Param& p : g->params) CHECK(g->value(p.value).name.rfind("blocks.1.", 0) == std::string::npos);
  CHECK(g->value(g->inputs[0]).type.sizes() == std::vector<int64_t>{2, 8});
  // layers=2 stamps out two blocks.
  std::map<std::string, int64_t> two = small;
  two["layers"] = 2;
  ir::Diagnostics diag2;
  std::optional<ir::Graph> g2 = frontend::load_model_file(napkin::testing::source_path("models/gpt.yaml"), diag2, {two});
  INFO(diag2.render());
  REQUIRE(g2.has_value());
  CHECK(g2->param_count() == 832 + 2 * 12416);
}

TEST_CASE("frontend: dim overrides of undeclared dims or bad values are errors") {
  const std::string yaml = std::string(kHeader) + R"yaml(
dims: {d: 8, heads: 2, layers: 3}
inputs: {x: {shape: [d]}}
loss: mean(x)
)yaml";
  auto [g, out] = load_with(yaml, {{"layer", 2}, {"zzz", 5}, {"heads", 0}}, "m.yaml");
  CHECK_FALSE(g.has_value());
  CHECK(out.find("m.yaml:1:1: error: --dims sets 'layer', but the model has no such dim; did you mean 'layers'?") !=
        std::string::npos);
  CHECK(out.find("m.yaml:1:1: error: --dims sets 'zzz', but the model has no such dim\n") != std::string::npos);
  CHECK(out.find("hint: declared dims: d, heads, layers") != std::string::npos);
  CHECK(out.find("--dims sets 'heads' to 0, but a dim must be positive") != std::string::npos);
  CHECK(out.find("3 errors generated.") != std::string::npos);
  // A model without dims has nothing to override.
  auto [g2, out2] = load_with(std::string(kHeader) + "inputs: {x: {shape: [4]}}\nloss: mean(x)\n", {{"d", 4}});
  CHECK_FALSE(g2.has_value());
  CHECK(out2.find("the model declares no dims") != std::string::npos);
}

TEST_CASE("frontend: dim overrides that make a division inexact say so at the file's location") {
  const std::string yaml = R"yaml(model: t
optimizer: sgd(lr=0.1)
dims: {d: 32, heads: 4, head_dim: d / heads, hidden: 4 * d}
inputs: {x: {shape: [d, head_dim]}, y: {shape: [hidden / 7]}}
loss: mean(x) + mean(y)
)yaml";
  auto [g, out] = load_with(yaml, {{"d", 30}}, "m.yaml");
  CHECK_FALSE(g.has_value());
  INFO(out);
  CHECK(out.find("m.yaml:3:35: error: 'd / heads' is 30 / 4, which does not divide exactly (with d=30 from --dims)") !=
        std::string::npos);
  // A derived dim carries the overrides it comes from.
  CHECK(out.find("'hidden / 7' is 120 / 7, which does not divide exactly (with d=30 from --dims)") != std::string::npos);
  CHECK(out.find("2 errors generated.") != std::string::npos);
  // Without overrides the same kind of message has no note.
  auto [g2, out2] = load_with(yaml, {});
  CHECK(out2.find("'hidden / 7' is 128 / 7, which does not divide exactly\n") != std::string::npos);
}

TEST_CASE("frontend: dim overrides parse from name=value,name=value") {
  std::string error;
  auto ok = frontend::parse_dim_overrides(" d = 32 ,layers=2,  vocab=64 ", error);
  REQUIRE(ok.has_value());
  CHECK(*ok == std::map<std::string, int64_t>{{"d", 32}, {"layers", 2}, {"vocab", 64}});
  auto one = frontend::parse_dim_overrides("head_dim=281474976710656", error);
  REQUIRE(one.has_value());
  CHECK(one->at("head_dim") == (int64_t{1} << 48));

  auto bad = [&](const std::string& text) {
    error.clear();
    CHECK_FALSE(frontend::parse_dim_overrides(text, error).has_value());
    CHECK_FALSE(error.empty());
    return error;
  };
  CHECK(bad("").find("no dims given") != std::string::npos);
  CHECK(bad("   ").find("no dims given") != std::string::npos);
  CHECK(bad("d=32,").find("empty entry") != std::string::npos);
  CHECK(bad("d=32,,layers=2").find("empty entry") != std::string::npos);
  CHECK(bad("d:32") == "'d:32' is not name=value: write e.g. d=32");
  CHECK(bad("=32").find("has no dim name") != std::string::npos);
  CHECK(bad("d=").find("dim 'd' has no value") != std::string::npos);
  CHECK(bad("3d=4").find("'3d' is not a dim name") != std::string::npos);
  CHECK(bad("d x=4").find("'d x' is not a dim name") != std::string::npos);
  CHECK(bad("d=-3") == "the value of dim 'd' must be a positive integer, got '-3'");
  CHECK(bad("d=3.5").find("must be a positive integer") != std::string::npos);
  CHECK(bad("d=1e3").find("must be a positive integer") != std::string::npos);
  CHECK(bad("d=0") == "the value of dim 'd' must be positive, got 0");
  CHECK(bad("d=99999999999999999999999").find("out of range") != std::string::npos);
  CHECK(bad("d=32, d=16") == "dim 'd' is given twice");
}

namespace {
// The nodes of `op` in schedule order.
std::vector<const ir::Node*> nodes_of(const ir::Graph& g, ir::Op op) {
  std::vector<const ir::Node*> nodes;
  for (ir::NodeId id : g.schedule())
    if (g.node(id).op == op) nodes.push_back(&g.node(id));
  return nodes;
}

std::vector<std::string> param_names(const ir::Graph& g) {
  std::vector<std::string> names;
  for (const ir::Param& p : g.params) names.push_back(g.value(p.value).name);
  return names;
}
}  // namespace

TEST_CASE("blocks: a block with two arguments is called like a function - each call its own copy") {
  ir::Graph g = compile(std::string(kHeader) + R"yaml(
dims: {n: 2, d: 4}
inputs: {x: {shape: [n, d]}, s: {shape: [n, d]}}
blocks:
  res:
    args: [x, skip]
    params: {w: {shape: [d, d], init: normal(0.02)}}
    forward:
      - y: relu(x @ w) + skip
forward:
  - h: res(x, s)
  - h: res(h, skip=x)
loss: mean(h)
)yaml");
  // Calls are numbered per block: res.0, res.1, each with its own parameters.
  CHECK(param_names(g) == std::vector<std::string>{"res.0.w", "res.1.w"});
  auto adds = nodes_of(g, ir::Op::Add);
  REQUIRE(adds.size() == 2);
  CHECK(adds[0]->scope == "res.0");
  CHECK(adds[0]->inputs[1] == g.inputs[1]);  // skip = s
  CHECK(adds[1]->scope == "res.1");
  CHECK(adds[1]->inputs[1] == g.inputs[0]);  // skip = x, by keyword
}

TEST_CASE("blocks: repeat feeds the output to the first argument and the others unchanged to every copy") {
  ir::Graph g = compile(std::string(kHeader) + R"yaml(
dims: {n: 2, d: 4, layers: 3}
inputs: {x: {shape: [n, d]}, mask: {shape: [n, d]}}
blocks:
  layer:
    args: [x, mask]
    params: {w: {shape: [d, d], init: normal(0.02)}}
    forward:
      - x: (x @ w) * mask
forward:
  - y: repeat(layer, layers, x, mask, prefix="enc")
loss: mean(y)
)yaml");
  CHECK(param_names(g) == std::vector<std::string>{"enc.0.w", "enc.1.w", "enc.2.w"});
  auto matmuls = nodes_of(g, ir::Op::MatMul);
  auto muls = nodes_of(g, ir::Op::Mul);
  REQUIRE(matmuls.size() == 3);
  REQUIRE(muls.size() == 3);
  CHECK(matmuls[0]->inputs[0] == g.inputs[0]);
  for (int i = 0; i < 3; ++i) {
    CHECK(muls[i]->inputs[1] == g.inputs[1]);  // every copy gets the same mask
    if (i > 0) CHECK(matmuls[i]->inputs[0] == muls[i - 1]->out());  // and the previous copy's output
  }
}

TEST_CASE("blocks: a model parameter used in a block is one tensor shared by every copy and call") {
  ir::Graph g = compile(std::string(kHeader) + R"yaml(
dims: {n: 2, d: 4, layers: 3}
inputs: {x: {shape: [n, d]}}
params:
  w: {shape: [d, d], init: normal(0.02)}
blocks:
  layer:
    params: {g: {shape: [d], init: ones}}
    forward:
      - x: tanh(x @ w) * g
forward:
  - y: repeat(layer, layers, x)
  - y: layer(y)
loss: mean(y @ w)
)yaml");
  CHECK(param_names(g) == std::vector<std::string>{"w", "blocks.0.g", "blocks.1.g", "blocks.2.g", "layer.0.g"});
  // Counted once: w, then one g per copy.
  CHECK(g.param_count() == 4 * 4 + 4 * 4);
  analysis::StepCost c = analysis::analyze_step(g, nullptr);
  CHECK(c.params == 4 * 4 + 4 * 4);
  auto matmuls = nodes_of(g, ir::Op::MatMul);
  REQUIRE(matmuls.size() == 5);
  for (const ir::Node* m : matmuls) CHECK(m->inputs[1] == g.params[0].value);
}

TEST_CASE("einsum: three operands lower to two contractions in greedy FLOP order") {
  // A[i, j] B[j, k] C[k, l] with i = k = 64 and j = l = 2. Contracting A B first
  // (left to right) costs 2·i·j·k + 2·i·k·l = 32768 FLOPs; B C first costs
  // 2·j·k·l + 2·i·j·l = 1024, and is what the greedy order picks.
  ir::Graph g = compile(std::string(kHeader) + R"yaml(
dims: {i: 64, j: 2, k: 64, l: 2}
inputs: {a: {shape: [i, j]}, b: {shape: [j, k]}, c: {shape: [k, l]}}
forward:
  - y: einsum(a, b, c, "i j, j k, k l -> l i")
loss: mean(y)
)yaml");
  auto einsums = nodes_of(g, ir::Op::Einsum);
  REQUIRE(einsums.size() == 2);
  CHECK(einsums[0]->inputs == std::vector<ir::ValueId>{g.inputs[1], g.inputs[2]});
  CHECK(einsums[0]->attrs.get_string("spec") == "j k, k l -> j l");
  CHECK(einsums[1]->inputs[0] == g.inputs[0]);
  CHECK(einsums[1]->attrs.get_string("spec") == "i j, j l -> l i");
  const ir::TensorType& y = g.value(einsums[1]->out()).type;
  CHECK(y.sizes() == std::vector<int64_t>{2, 64});
  CHECK(y.dims[0].name == "l");
  analysis::StepCost c = analysis::analyze_step(g, nullptr);
  double flops = 0;
  for (const auto& row : c.rows)
    if (g.node(row.node).op == ir::Op::Einsum) flops += row.cost.flops;
  CHECK(flops == 2 * 2 * 64 * 2 + 2 * 64 * 2 * 2);
}

TEST_CASE("einsum: an axis in three operands stays until its last operand is contracted") {
  // x[b, i], w[i, j], y[b, j] -> [b]: every pair spans b, i and j, 2·8·4·4 =
  // 256 FLOPs; x w and w y leave 32 elements, x y 128, and of the two the
  // leftmost pair x w goes first. Its result keeps b (y and the output need
  // it) and j (y needs it) and sums i.
  ir::Graph g = compile(std::string(kHeader) + R"yaml(
dims: {b: 8, i: 4, j: 4}
inputs: {x: {shape: [b, i]}, w: {shape: [i, j]}, y: {shape: [b, j]}}
forward:
  - z: einsum(x, w, y, "b i, i j, b j -> b")
loss: mean(z)
)yaml");
  auto einsums = nodes_of(g, ir::Op::Einsum);
  REQUIRE(einsums.size() == 2);
  CHECK(einsums[0]->attrs.get_string("spec") == "b i, i j -> b j");
  CHECK(einsums[1]->attrs.get_string("spec") == "b j, b j -> b");
}

TEST_CASE("einsum: one operand sums the axes the output drops and permutes the rest") {
  ir::Graph g = compile(std::string(kHeader) + R"yaml(
dims: {b: 2, s: 3, d: 4}
inputs: {x: {shape: [b, s, d]}}
forward:
  - t: einsum(x, "b s d -> d b")
  - p: einsum(x, "b s d -> s b d")
  - same: einsum(x, "b s d -> b s d")
loss: mean(t) + mean(p) + mean(same)
)yaml");
  CHECK(count_ops(g, ir::Op::Einsum) == 0);
  auto sums = nodes_of(g, ir::Op::ReduceSum);
  REQUIRE(sums.size() == 1);
  CHECK(sums[0]->attrs.get_ints("axes") == std::vector<int64_t>{1});
  CHECK(count_ops(g, ir::Op::Permute) == 2);
}

TEST_CASE("blocks: a misspelt block call suggests the block - errors in its body point into the body") {
  std::string out = compile_errors(std::string(kHeader) + R"yaml(
dims: {n: 2, d: 4, e: 3}
inputs: {x: {shape: [n, d]}, g: {shape: [e]}}
blocks:
  layer:
    args: [x, gain]
    forward:
      - y: layernorm(x, gain, gain)
forward:
  - h: lyer(x, g)
  - h:                    layer(x, g)
loss: mean(h)
)yaml", "b.yaml");
  INFO(out);
  CHECK(out.find("b.yaml:13:8: error: unknown function 'lyer'; did you mean 'layer'?") != std::string::npos);
  // The gain's error points at 'gain' in the block's line, whatever the column
  // of the call's argument.
  CHECK(out.find("b.yaml:11:25: error: layernorm: gain has shape f32[e=3]") != std::string::npos);
}

TEST_CASE("einsum: the pattern may be given as pattern= after any number of operands") {
  ir::Graph g = compile(std::string(kHeader) + R"yaml(
dims: {i: 2, j: 3, k: 4}
inputs: {a: {shape: [i, j]}, b: {shape: [j, k]}, c: {shape: [k]}}
forward:
  - two: einsum(a, b, pattern="i j, j k -> i k")
  - three: einsum(a, b, c, pattern="i j, j k, k -> i")
loss: mean(two) + mean(three)
)yaml");
  CHECK(count_ops(g, ir::Op::Einsum) == 3);
}

TEST_CASE("einsum: a missing or misplaced pattern - an integer operand of a chain - are errors at the operand") {
  std::string out = compile_errors(std::string(kHeader) + R"yaml(
dims: {i: 2, j: 3}
inputs: {a: {shape: [i, j]}, b: {shape: [j, i]}, n: {shape: [i, j], dtype: i32}}
forward:
  - p: einsum(a)
  - q: einsum(a, "i j -> j i", b)
  - r: einsum(a, b, a, nope)
  - s: einsum(n, "i j -> i")
  - t: einsum(a, b, n, "i j, j k, k l -> i l")
loss: mean(a)
)yaml", "e.yaml");
  INFO(out);
  CHECK(out.find("e.yaml:8:8: error: einsum needs a pattern string after its operands") != std::string::npos);
  CHECK(out.find("e.yaml:9:32: error: einsum needs a pattern string after its operands") != std::string::npos);
  CHECK(out.find("e.yaml:10:24: error: undefined name 'nope'") != std::string::npos);
  CHECK(out.find("e.yaml:11:15: error: einsum needs floating-point operands, got i32[i=2, j=3]") != std::string::npos);
  CHECK(out.find("e.yaml:12:21: error: einsum: dtype mismatch: operand 1 is f32 but operand 3 is i32") !=
        std::string::npos);
  CHECK(out.find("5 errors generated.") != std::string::npos);
}

TEST_CASE("blocks: an argument that is not a name or is a dim is an error where args: lists it") {
  std::string out = compile_errors(std::string(kHeader) + R"yaml(
dims: {n: 2, d: 4}
inputs: {x: {shape: [n, d]}}
blocks:
  a:
    args: [x, [y]]
    forward:
      - y: x
  b:
    args: [x, d]
    forward:
      - y: x
forward:
  - h: a(x, x)
  - g: b(x, x)
loss: mean(h) + mean(g)
)yaml", "a.yaml");
  INFO(out);
  CHECK(out.find("a.yaml:9:15: error: an argument of block 'a' must be a name") != std::string::npos);
  CHECK(out.find("a.yaml:13:15: error: the argument 'd' of block 'b' is already a dim") != std::string::npos);
  CHECK(out.find("2 errors generated.") != std::string::npos);
}

TEST_CASE("blocks: a block reads top-level inputs and forward values bound at its call - its own names shadow them") {
  ir::Graph g = compile(std::string(kHeader) + R"yaml(
dims: {n: 2, d: 4, layers: 3}
inputs: {x: {shape: [n, d]}, s: {shape: [n, d]}}
blocks:
  layer:
    params: {w: {shape: [d, d], init: normal(0.02)}}
    forward:
      - x: (x @ w) * scale + s
  inner:
    forward:
      - y: x * scale
  outer:
    args: [s]
    forward:
      - y: inner(s) + s
forward:
  - scale: tanh(s)
  - h: repeat(layer, layers, x)
  - scale: scale * 2
  - k: outer(h)
loss: mean(k)
)yaml");
  auto muls = nodes_of(g, ir::Op::Mul);
  auto adds = nodes_of(g, ir::Op::Add);
  REQUIRE(muls.size() == 5);  // one per layer copy, scale * 2, inner's
  const ir::ValueId first_scale = nodes_of(g, ir::Op::Tanh)[0]->out();
  for (int i = 0; i < 3; ++i) {
    CHECK(muls[i]->scope == fmt::format("blocks.{}", i));
    CHECK(muls[i]->inputs[1] == first_scale);  // every copy reads the value bound at the call
    CHECK(adds[i]->inputs[1] == g.inputs[1]);  // and the input s
  }
  // The nested block reads the model's newest scale at the outer call; the
  // outer block's argument s shadows the model's input s.
  CHECK(muls[4]->scope == "outer.0.inner.0");
  CHECK(muls[4]->inputs[1] == muls[3]->out());
  CHECK(muls[4]->inputs[0] == adds[2]->out());
  CHECK(adds[3]->inputs[1] == adds[2]->out());
}

TEST_CASE("blocks: a top-level name assigned only after the block's call is an error naming both lines") {
  std::string out = compile_errors(std::string(kHeader) + R"yaml(
dims: {n: 2, d: 4}
inputs: {x: {shape: [n, d]}}
blocks:
  layer:
    forward:
      - y: x * later + self
forward:
  - self: layer(x)
  - later: x * 2
loss: mean(self) + mean(later)
)yaml", "s.yaml");
  INFO(out);
  CHECK(out.find("s.yaml:10:16: error: 'later' is not yet assigned at the block's call on line 12: the model "
                 "assigns it only on line 13") != std::string::npos);
  CHECK(out.find("s.yaml:10:24: error: 'self' is not yet assigned at the block's call on line 12: the model "
                 "assigns it on that line itself") != std::string::npos);
  CHECK(out.find("call the block below the line that assigns it, or pass the value as an argument") !=
        std::string::npos);
  CHECK(out.find("2 errors generated.") != std::string::npos);
}
