// napkin hf import and export (docs/huggingface.md) on small checkpoints the
// tests write in transformers' layout: GPT-2 (models/gpt2-124m.yaml at small
// dims: tied head, the old files' attention-mask buffers) and a tiny Llama
// (tests/models/llama-hf.yaml: transposed and plain weights, bf16 and f16),
// and experts stacked on a parameter's first axis from one tensor each
// (tests/models/experts-hf.yaml, Mixtral's names).
// The checkpoint names and layouts are written out here from transformers'
// state dicts, not read from the models' huggingface: sections, so a wrong
// section fails. Round trips are compared bit for bit.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "frontend/huggingface_map.h"
#include "runtime/checkpoint.h"
#include "runtime/float_formats.h"
#include "runtime/safetensors.h"
#include "support/test_io.h"

namespace {

namespace fs = std::filesystem;
namespace rt = napkin::runtime;
using napkin::testing::run_in_source_tree;
using napkin::testing::TempDir;

// One tensor of a checkpoint the test writes.
struct Tensor {
  std::string name;
  std::string dtype;  // napkin's name: "f32", "bf16", ...
  std::vector<int64_t> shape;
  std::vector<char> bytes;
};

size_t numel(const std::vector<int64_t>& shape) {
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  return n;
}

// Values spread over many binades (subnormals of f16 and bf16 included) and
// both signs, from a seed; never NaN or infinite.
std::vector<char> values(const std::string& dtype, size_t n, uint32_t seed) {
  const size_t item = rt::safetensors_itemsize(dtype).value();
  std::vector<char> out(n * item);
  uint64_t state = 0x9E3779B97F4A7C15ull * (seed + 1);
  for (size_t i = 0; i < n; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    const double unit = static_cast<double>(state >> 11) / 9007199254740992.0;  // [0, 1)
    const int binade = static_cast<int>((state >> 3) % 40) - 30;                  // 2^-30 .. 2^9
    const float v = static_cast<float>((state & 1 ? -1 : 1) * (1 + unit) * std::ldexp(1.0, binade));
    if (dtype == "f32") {
      std::memcpy(out.data() + 4 * i, &v, 4);
    } else {
      const uint16_t bits = dtype == "bf16" ? rt::float_to_bf16_bits(v) : rt::float_to_f16_bits(std::fmod(v, 60000.0f));
      std::memcpy(out.data() + 2 * i, &bits, 2);
    }
  }
  return out;
}

Tensor make(const std::string& name, const std::string& dtype, std::vector<int64_t> shape, uint32_t seed) {
  return {name, dtype, shape, values(dtype, numel(shape), seed)};
}

void write_checkpoint_file(const std::string& path, const std::vector<Tensor>& tensors) {
  std::vector<rt::TensorData> views;
  for (const Tensor& t : tensors) views.push_back({t.name, t.dtype, t.shape, t.bytes.data()});
  rt::write_safetensors_file(path, views, {{"format", "pt"}});
}

// Every tensor of a safetensors file, by name.
std::map<std::string, Tensor> read_all(const std::string& path) {
  rt::SafetensorsFile file(path);
  std::map<std::string, Tensor> out;
  for (const auto& t : file.tensors()) out[t.name] = {t.name, t.dtype, t.shape, std::vector<char>(t.data, t.data + t.bytes)};
  return out;
}

// GPT-2's state dict as transformers' GPT2LMHeadModel has it (Conv1D weights
// [in, out]), with the old files' causal-mask buffers and the tied head.
std::vector<Tensor> gpt2_checkpoint(int64_t V, int64_t T, int64_t d, int64_t layers, const std::string& dtype) {
  std::vector<Tensor> t;
  uint32_t seed = 0;
  t.push_back(make("transformer.wte.weight", dtype, {V, d}, seed++));
  t.push_back(make("transformer.wpe.weight", dtype, {T, d}, seed++));
  for (int64_t i = 0; i < layers; ++i) {
    const std::string h = fmt::format("transformer.h.{}.", i);
    t.push_back(make(h + "ln_1.weight", dtype, {d}, seed++));
    t.push_back(make(h + "ln_1.bias", dtype, {d}, seed++));
    t.push_back(make(h + "attn.c_attn.weight", dtype, {d, 3 * d}, seed++));
    t.push_back(make(h + "attn.c_attn.bias", dtype, {3 * d}, seed++));
    t.push_back(make(h + "attn.c_proj.weight", dtype, {d, d}, seed++));
    t.push_back(make(h + "attn.c_proj.bias", dtype, {d}, seed++));
    t.push_back(make(h + "ln_2.weight", dtype, {d}, seed++));
    t.push_back(make(h + "ln_2.bias", dtype, {d}, seed++));
    t.push_back(make(h + "mlp.c_fc.weight", dtype, {d, 4 * d}, seed++));
    t.push_back(make(h + "mlp.c_fc.bias", dtype, {4 * d}, seed++));
    t.push_back(make(h + "mlp.c_proj.weight", dtype, {4 * d, d}, seed++));
    t.push_back(make(h + "mlp.c_proj.bias", dtype, {d}, seed++));
    t.push_back(make(h + "attn.bias", "f32", {1, 1, T, T}, seed++));
    t.push_back(make(h + "attn.masked_bias", "f32", {}, seed++));
  }
  t.push_back(make("transformer.ln_f.weight", dtype, {d}, seed++));
  t.push_back(make("transformer.ln_f.bias", dtype, {d}, seed++));
  Tensor head = t[0];
  head.name = "lm_head.weight";
  t.push_back(head);
  return t;
}

// gpt2-124m's parameter for each GPT-2 tensor (block i's as h.i.*), from
// transformers' names; the masks and the tied head have none.
std::map<std::string, std::string> gpt2_parameters(int64_t layers) {
  std::map<std::string, std::string> p = {{"transformer.wte.weight", "wte"},
                                          {"transformer.wpe.weight", "wpe"},
                                          {"transformer.ln_f.weight", "lnf_g"},
                                          {"transformer.ln_f.bias", "lnf_b"}};
  const std::vector<std::pair<std::string, std::string>> block = {
      {"ln_1.weight", "ln1_g"},        {"ln_1.bias", "ln1_b"},        {"attn.c_attn.weight", "attn_w"},
      {"attn.c_attn.bias", "attn_b"},  {"attn.c_proj.weight", "proj_w"}, {"attn.c_proj.bias", "proj_b"},
      {"ln_2.weight", "ln2_g"},        {"ln_2.bias", "ln2_b"},        {"mlp.c_fc.weight", "fc_w"},
      {"mlp.c_fc.bias", "fc_b"},       {"mlp.c_proj.weight", "fc_proj_w"}, {"mlp.c_proj.bias", "fc_proj_b"}};
  for (int64_t i = 0; i < layers; ++i)
    for (const auto& [hf, napkin] : block) p[fmt::format("transformer.h.{}.{}", i, hf)] = fmt::format("h.{}.{}", i, napkin);
  return p;
}

constexpr const char* kGpt2 = "models/gpt2-124m.yaml";
constexpr const char* kGpt2Dims = "batch=2,seq=8,vocab=16,d=32,heads=2,layers=2";

// tests/models/llama-hf.yaml's dims: V 32, T 8, d 16, 4 heads of 4, 2 kv heads, hidden 24, 2 layers.
constexpr int64_t kV = 32, kD = 16, kKv = 8, kHidden = 24, kLayers = 2;
constexpr const char* kLlama = "tests/models/llama-hf.yaml";

// LlamaForCausalLM's state dict (every weight [out, in]) at llama-hf's sizes
// and `vocab`, and the rotary buffers older files hold.
std::vector<Tensor> llama_checkpoint(const std::string& dtype, int64_t vocab = kV) {
  std::vector<Tensor> t;
  uint32_t seed = 100;
  t.push_back(make("model.embed_tokens.weight", dtype, {vocab, kD}, seed++));
  for (int64_t i = 0; i < kLayers; ++i) {
    const std::string l = fmt::format("model.layers.{}.", i);
    t.push_back(make(l + "input_layernorm.weight", dtype, {kD}, seed++));
    t.push_back(make(l + "self_attn.q_proj.weight", dtype, {kD, kD}, seed++));
    t.push_back(make(l + "self_attn.k_proj.weight", dtype, {kKv, kD}, seed++));
    t.push_back(make(l + "self_attn.v_proj.weight", dtype, {kKv, kD}, seed++));
    t.push_back(make(l + "self_attn.o_proj.weight", dtype, {kD, kD}, seed++));
    t.push_back(make(l + "self_attn.rotary_emb.inv_freq", "f32", {2}, seed++));
    t.push_back(make(l + "post_attention_layernorm.weight", dtype, {kD}, seed++));
    t.push_back(make(l + "mlp.gate_proj.weight", dtype, {kHidden, kD}, seed++));
    t.push_back(make(l + "mlp.up_proj.weight", dtype, {kHidden, kD}, seed++));
    t.push_back(make(l + "mlp.down_proj.weight", dtype, {kD, kHidden}, seed++));
  }
  t.push_back(make("model.norm.weight", dtype, {kD}, seed++));
  t.push_back(make("lm_head.weight", dtype, {vocab, kD}, seed++));
  return t;
}

// llama-hf's parameter for each tensor, and whether the model stores it [in, out].
std::map<std::string, std::pair<std::string, bool>> llama_parameters() {
  std::map<std::string, std::pair<std::string, bool>> p = {{"model.embed_tokens.weight", {"wte", false}},
                                                           {"model.norm.weight", {"norm_g", false}},
                                                           {"lm_head.weight", {"head", true}}};
  const std::vector<std::tuple<std::string, std::string, bool>> block = {
      {"input_layernorm.weight", "attn_norm", false}, {"self_attn.q_proj.weight", "wq", true},
      {"self_attn.k_proj.weight", "wk", false},       {"self_attn.v_proj.weight", "wv", false},
      {"self_attn.o_proj.weight", "wo", true},        {"post_attention_layernorm.weight", "mlp_norm", false},
      {"mlp.gate_proj.weight", "w_gate", false},      {"mlp.up_proj.weight", "w_up", true},
      {"mlp.down_proj.weight", "w_down", false}};
  for (int64_t i = 0; i < kLayers; ++i)
    for (const auto& [hf, napkin, transposed] : block)
      p[fmt::format("model.layers.{}.{}", i, hf)] = {fmt::format("layers.{}.{}", i, napkin), transposed};
  return p;
}

// An f16 value by the IEEE formula, independent of runtime/float_formats.
double f16_value(uint16_t bits) {
  const int exponent = (bits >> 10) & 0x1f, mantissa = bits & 0x3ff;
  const double sign = bits & 0x8000 ? -1 : 1;
  if (exponent == 0) return sign * std::ldexp(mantissa, -24);
  return sign * std::ldexp(1024 + mantissa, exponent - 25);
}

// Element i of a checkpoint tensor (f32, bf16, f16) as a double, decoded by hand.
double element(const Tensor& t, size_t i) {
  if (t.dtype == "f32") {
    float v;
    std::memcpy(&v, t.bytes.data() + 4 * i, 4);
    return v;
  }
  uint16_t bits;
  std::memcpy(&bits, t.bytes.data() + 2 * i, 2);
  if (t.dtype == "f16") return f16_value(bits);
  const uint32_t wide = uint32_t(bits) << 16;  // bf16 is the top half of an f32
  float v;
  std::memcpy(&v, &wide, 4);
  return v;
}

// The parameter `napkin` (f32) holds the checkpoint tensor `hf`, widened exactly
// and transposed when `transposed`.
void check_widened(const Tensor& napkin, const Tensor& hf, bool transposed) {
  REQUIRE(napkin.dtype == "f32");
  std::vector<int64_t> shape = hf.shape;
  if (transposed) std::swap(shape[0], shape[1]);
  REQUIRE(napkin.shape == shape);
  const size_t rows = shape.size() == 2 ? static_cast<size_t>(shape[0]) : 1, cols = numel(shape) / rows;
  size_t wrong = 0;
  for (size_t r = 0; r < rows; ++r)
    for (size_t c = 0; c < cols; ++c) {
      const double want = element(hf, transposed ? c * rows + r : r * cols + c);
      wrong += element(napkin, r * cols + c) != want;
    }
  CHECK_MESSAGE(wrong == 0, napkin.name << ": " << wrong << " elements differ from " << hf.name);
}

// A Mixtral's sizes: tests/models/experts-hf.yaml's by default.
struct MixtralSizes {
  int64_t vocab = 16, d = 8, hidden = 12, experts = 3;
  int64_t kv = 0;  // the k and v projections' rows; 0 for no attention (experts-hf has none)
};
constexpr const char* kExpertsModel = "tests/models/experts-hf.yaml";

// MixtralForCausalLM's state dict as save_pretrained writes it (one tensor
// per expert, every weight [out, in]) at `s` and llama-hf's 2 layers.
std::vector<Tensor> mixtral_checkpoint(const std::string& dtype, const MixtralSizes& s = {}) {
  std::vector<Tensor> t;
  uint32_t seed = 200;
  t.push_back(make("model.embed_tokens.weight", dtype, {s.vocab, s.d}, seed++));
  for (int64_t i = 0; i < kLayers; ++i) {
    const std::string l = fmt::format("model.layers.{}.", i);
    if (s.kv > 0) {
      t.push_back(make(l + "input_layernorm.weight", dtype, {s.d}, seed++));
      t.push_back(make(l + "self_attn.q_proj.weight", dtype, {s.d, s.d}, seed++));
      t.push_back(make(l + "self_attn.k_proj.weight", dtype, {s.kv, s.d}, seed++));
      t.push_back(make(l + "self_attn.v_proj.weight", dtype, {s.kv, s.d}, seed++));
      t.push_back(make(l + "self_attn.o_proj.weight", dtype, {s.d, s.d}, seed++));
    }
    t.push_back(make(l + "post_attention_layernorm.weight", dtype, {s.d}, seed++));
    t.push_back(make(l + "block_sparse_moe.gate.weight", dtype, {s.experts, s.d}, seed++));
    for (int64_t e = 0; e < s.experts; ++e) {
      const std::string x = fmt::format("{}block_sparse_moe.experts.{}.", l, e);
      t.push_back(make(x + "w1.weight", dtype, {s.hidden, s.d}, seed++));
      t.push_back(make(x + "w2.weight", dtype, {s.d, s.hidden}, seed++));
      t.push_back(make(x + "w3.weight", dtype, {s.hidden, s.d}, seed++));
    }
  }
  t.push_back(make("model.norm.weight", dtype, {s.d}, seed++));
  t.push_back(make("lm_head.weight", dtype, {s.vocab, s.d}, seed++));
  return t;
}

// Where a model holds each of a Mixtral checkpoint's tensors: the parameter,
// the index along its first axis (-1: the whole parameter), and whether that
// slice is stored [in, out] (transposed from transformers' [out, in]).
struct Place {
  std::string param;
  int64_t index;
  bool transposed;
};

// experts-hf's places (its MoE norm is `norm`, its w_up [experts, d, hidden])
// or, `moe_yaml`, models/moe.yaml's (attention, `moe_norm`, nothing transposed).
std::map<std::string, Place> mixtral_places(int64_t experts, bool moe_yaml) {
  std::map<std::string, Place> p = {{"model.embed_tokens.weight", {"wte", -1, false}},
                                    {"model.norm.weight", {"norm_g", -1, false}},
                                    {"lm_head.weight", {"head", -1, false}}};
  for (int64_t i = 0; i < kLayers; ++i) {
    const std::string l = fmt::format("model.layers.{}.", i), layer = fmt::format("layers.{}.", i);
    if (moe_yaml) {
      p[l + "input_layernorm.weight"] = {layer + "attn_norm", -1, false};
      for (const char* x : {"q", "k", "v", "o"})
        p[fmt::format("{}self_attn.{}_proj.weight", l, x)] = {fmt::format("{}w{}", layer, x), -1, false};
    }
    p[l + "post_attention_layernorm.weight"] = {layer + (moe_yaml ? "moe_norm" : "norm"), -1, false};
    p[l + "block_sparse_moe.gate.weight"] = {layer + "router", -1, false};
    for (int64_t e = 0; e < experts; ++e) {
      const std::string x = fmt::format("{}block_sparse_moe.experts.{}.", l, e);
      p[x + "w1.weight"] = {layer + "w_gate", e, false};
      p[x + "w2.weight"] = {layer + "w_down", e, false};
      p[x + "w3.weight"] = {layer + "w_up", e, !moe_yaml};
    }
  }
  return p;
}

// Index `index` of `t`'s first axis, a tensor of its own.
Tensor slice_of(const Tensor& t, int64_t index) {
  const std::vector<int64_t> shape(t.shape.begin() + 1, t.shape.end());
  const size_t bytes = numel(shape) * rt::safetensors_itemsize(t.dtype).value();
  const auto begin = t.bytes.begin() + static_cast<std::ptrdiff_t>(bytes * static_cast<size_t>(index));
  return {fmt::format("{}[{}]", t.name, index), t.dtype, shape, std::vector<char>(begin, begin + static_cast<std::ptrdiff_t>(bytes))};
}

std::string napkin_binary() { return NAPKIN_BINARY; }

napkin::testing::CommandResult hf(const std::string& arguments) {
  return run_in_source_tree(fmt::format("{} hf {}", napkin_binary(), arguments));
}

// The model's parameters as a trainer's --init and napkin sample ask for them.
std::vector<rt::TensorRef> parameter_refs(const std::string& model, const std::map<std::string, int64_t>& dims,
                                          std::vector<std::vector<char>>& storage) {
  napkin::ir::Diagnostics diag;
  auto loaded = napkin::frontend::load_huggingface_model(std::string(NAPKIN_SOURCE_DIR) + "/" + model, diag, {dims});
  REQUIRE_MESSAGE(loaded, diag.render());
  const napkin::ir::Graph& g = loaded->graph;
  storage.clear();
  storage.reserve(g.params.size());
  std::vector<rt::TensorRef> refs;
  for (const napkin::ir::Param& p : g.params) {
    const napkin::ir::Value& v = g.value(p.value);
    storage.emplace_back(numel(v.type.sizes()) * 4);
    refs.push_back({v.name, "f32", v.type.sizes(), storage.back().data()});
  }
  return refs;
}

const std::map<std::string, int64_t> kGpt2DimMap = {{"batch", 2}, {"seq", 8}, {"vocab", 16}, {"d", 32}, {"heads", 2}, {"layers", 2}};

}  // namespace

TEST_CASE("hf import: a GPT-2 checkpoint's tensors become gpt2-124m's parameters bit for bit, and --init and sample take the file") {
  TempDir dir("hf-gpt2");
  const std::vector<Tensor> checkpoint = gpt2_checkpoint(16, 8, 32, 2, "f32");
  fs::create_directory(dir / "gpt2");
  write_checkpoint_file(dir / "gpt2/model.safetensors", checkpoint);
  auto run = hf(fmt::format("import {} {} -o {} --dims {}", kGpt2, dir / "gpt2", dir / "w.safetensors", kGpt2Dims));
  REQUIRE_MESSAGE(run.status == 0, run.out);
  CHECK(run.out.find("ignored 4 tensors that are no parameters") != std::string::npos);
  CHECK(run.out.find("transformer.h.1.attn.masked_bias") != std::string::npos);
  CHECK(run.out.find("tied lm_head.weight = transformer.wte.weight: equal") != std::string::npos);

  const std::map<std::string, Tensor> imported = read_all(dir / "w.safetensors");
  const std::map<std::string, std::string> parameter = gpt2_parameters(2);
  CHECK(imported.size() == parameter.size());
  for (const Tensor& t : checkpoint) {
    auto p = parameter.find(t.name);
    if (p == parameter.end()) continue;
    REQUIRE_MESSAGE(imported.count(p->second), p->second);
    const Tensor& got = imported.at(p->second);
    CHECK(got.dtype == "f32");
    CHECK(got.shape == t.shape);
    CHECK_MESSAGE(got.bytes == t.bytes, p->second << " differs from " << t.name);
  }
  CHECK(rt::SafetensorsFile(dir / "w.safetensors").metadata().at("source") == "huggingface");

  // The original GPT-2 files hold GPT2Model's tensors: no "transformer." and no head.
  std::vector<Tensor> base;
  for (Tensor t : checkpoint)
    if (t.name.starts_with("transformer.")) {
      t.name = t.name.substr(std::string("transformer.").size());
      base.push_back(t);
    }
  write_checkpoint_file(dir / "base.safetensors", base);
  auto headless = hf(fmt::format("import {} {} -o {} --dims {}", kGpt2, dir / "base.safetensors", dir / "base-w.safetensors",
                                 kGpt2Dims));
  REQUIRE_MESSAGE(headless.status == 0, headless.out);
  CHECK(headless.out.find("read the base model's tensors as transformer.NAME") != std::string::npos);
  const std::map<std::string, Tensor> from_base = read_all(dir / "base-w.safetensors");
  REQUIRE(from_base.size() == imported.size());
  for (const auto& entry : imported) CHECK_MESSAGE(from_base.at(entry.first).bytes == entry.second.bytes, entry.first);

  // What a trainer's --init and napkin sample call with the model's parameters.
  std::vector<std::vector<char>> storage;
  std::vector<rt::TensorRef> refs = parameter_refs(kGpt2, kGpt2DimMap, storage);
  CHECK(rt::read_weights(dir / "w.safetensors", refs).empty());
  CHECK_FALSE(rt::read_model_weights(dir / "w.safetensors", refs, "any hash").has_value());
  for (size_t i = 0; i < refs.size(); ++i) CHECK(storage[i] == imported.at(refs[i].name).bytes);
  napkin::testing::write_bytes(dir / "prompt.txt", "1 5");
  auto sample = run_in_source_tree(fmt::format("{} sample {} --dims {} --checkpoint {} --prompt-ids {} --tokens 2 "
                                               "--temperature 0",
                                               napkin_binary(), kGpt2, kGpt2Dims, dir / "w.safetensors", dir / "prompt.txt"));
  CHECK_MESSAGE(sample.status == 0, sample.out);
  CHECK(sample.out.find("weights from " + dir / "w.safetensors") != std::string::npos);

  // The output may not be an input, and the input must exist.
  auto onto_input = hf(fmt::format("import {} {} -o {} --dims {}", kGpt2, dir / "gpt2", dir / "gpt2/model.safetensors", kGpt2Dims));
  CHECK(onto_input.status == 1);
  CHECK(onto_input.out.find("is also an input") != std::string::npos);
  auto nothing = hf(fmt::format("import {} {} -o {} --dims {}", kGpt2, dir / "none", dir / "x.safetensors", kGpt2Dims));
  CHECK(nothing.status == 1);
  CHECK(nothing.out.find(dir / "none" + ": no such file or directory") != std::string::npos);
}

TEST_CASE("hf export: GPT-2 weights leave as transformers saves them (config.json, names, layouts, no tied head), and HF -> napkin -> HF is bit-exact") {
  TempDir dir("hf-gpt2-out");
  const std::vector<Tensor> checkpoint = gpt2_checkpoint(16, 8, 32, 2, "f32");
  write_checkpoint_file(dir / "in.safetensors", checkpoint);
  auto in = hf(fmt::format("import {} {} -o {} --dims {}", kGpt2, dir / "in.safetensors", dir / "w.safetensors", kGpt2Dims));
  REQUIRE_MESSAGE(in.status == 0, in.out);
  auto out = hf(fmt::format("export {} {} -o {} --dims {}", kGpt2, dir / "w.safetensors", dir / "out", kGpt2Dims));
  REQUIRE_MESSAGE(out.status == 0, out.out);

  rt::SafetensorsFile file(dir / "out/model.safetensors");
  CHECK(file.metadata() == std::map<std::string, std::string>{{"format", "pt"}});
  const std::map<std::string, Tensor> exported = read_all(dir / "out/model.safetensors");
  size_t expected = 0;
  for (const Tensor& t : checkpoint) {
    if (t.name.ends_with(".attn.bias") || t.name.ends_with("masked_bias") || t.name == "lm_head.weight") {
      CHECK_FALSE(exported.count(t.name));
      continue;
    }
    ++expected;
    REQUIRE_MESSAGE(exported.count(t.name), t.name);
    const Tensor& got = exported.at(t.name);
    CHECK(got.dtype == "f32");
    CHECK(got.shape == t.shape);
    CHECK_MESSAGE(got.bytes == t.bytes, t.name);
  }
  CHECK(exported.size() == expected);

  const nlohmann::json config = nlohmann::json::parse(napkin::testing::read_bytes(dir / "out/config.json"));
  CHECK(config["architectures"] == nlohmann::json::array({"GPT2LMHeadModel"}));
  CHECK(config["model_type"] == "gpt2");
  CHECK(config["vocab_size"] == 16);
  CHECK(config["n_positions"] == 8);
  CHECK(config["n_embd"] == 32);
  CHECK(config["n_layer"] == 2);
  CHECK(config["n_head"] == 2);
  CHECK(config["n_inner"] == 128);
  CHECK(config["eos_token_id"] == 15);
  CHECK(config["activation_function"] == "gelu_new");
  CHECK(config["layer_norm_epsilon"].is_number_float());
  CHECK(config["layer_norm_epsilon"].get<double>() == 1e-5);
  CHECK(config["tie_word_embeddings"] == true);
  CHECK(config["torch_dtype"] == "float32");
  CHECK(config["dtype"] == "float32");
}

TEST_CASE("hf import and export: bf16 and f16 widen to f32 exactly, transposed where the model stores [in, out], and narrow back bit for bit") {
  for (const std::string dtype : {"bf16", "f16"}) {
    CAPTURE(dtype);
    TempDir dir("hf-llama");
    const std::vector<Tensor> checkpoint = llama_checkpoint(dtype);
    write_checkpoint_file(dir / "model.safetensors", checkpoint);
    auto in = hf(fmt::format("import {} {} -o {}", kLlama, dir / "model.safetensors", dir / "w.safetensors"));
    REQUIRE_MESSAGE(in.status == 0, in.out);
    CHECK(in.out.find(fmt::format("widened 21 {} tensors exactly", dtype)) != std::string::npos);
    CHECK(in.out.find("transposed 7 tensors") != std::string::npos);
    CHECK(in.out.find("ignored 2 tensors") != std::string::npos);

    const std::map<std::string, Tensor> imported = read_all(dir / "w.safetensors");
    const auto parameter = llama_parameters();
    CHECK(imported.size() == parameter.size());
    for (const Tensor& t : checkpoint) {
      auto p = parameter.find(t.name);
      if (p == parameter.end()) continue;
      REQUIRE_MESSAGE(imported.count(p->second.first), p->second.first);
      check_widened(imported.at(p->second.first), t, p->second.second);
    }

    auto out = hf(fmt::format("export {} {} -o {} --dtype {}", kLlama, dir / "w.safetensors", dir / "out", dtype));
    REQUIRE_MESSAGE(out.status == 0, out.out);
    const std::map<std::string, Tensor> exported = read_all(dir / "out/model.safetensors");
    CHECK(exported.size() == parameter.size());
    for (const Tensor& t : checkpoint) {
      if (!parameter.count(t.name)) continue;
      REQUIRE_MESSAGE(exported.count(t.name), t.name);
      CHECK(exported.at(t.name).dtype == dtype);
      CHECK(exported.at(t.name).shape == t.shape);
      CHECK_MESSAGE(exported.at(t.name).bytes == t.bytes, t.name);
    }
    const nlohmann::json config = nlohmann::json::parse(napkin::testing::read_bytes(dir / "out/config.json"));
    CHECK(config["torch_dtype"] == (dtype == "bf16" ? "bfloat16" : "float16"));
    CHECK(config["dtype"] == config["torch_dtype"]);
    CHECK(config["tie_word_embeddings"] == false);
    CHECK(config["num_key_value_heads"] == 2);
    CHECK(config["rope_theta"] == 10000);
    CHECK(config["rope_scaling"].is_null());
  }
}

TEST_CASE("hf import and export: models/llama.yaml is LlamaForCausalLM tensor for tensor, without a transpose") {
  TempDir dir("hf-llama-yaml");
  // llama.yaml at its small dims: V 37, and tests/models/llama-hf.yaml's other sizes.
  const std::string dims = "batch=2,seq=8,vocab=37,d=16,heads=4,kv_heads=2,hidden=24,layers=2";
  const std::vector<Tensor> checkpoint = llama_checkpoint("bf16", 37);
  write_checkpoint_file(dir / "model.safetensors", checkpoint);
  auto in = hf(fmt::format("import models/llama.yaml {} -o {} --dims {}", dir / "model.safetensors", dir / "w.safetensors", dims));
  REQUIRE_MESSAGE(in.status == 0, in.out);
  const std::map<std::string, Tensor> imported = read_all(dir / "w.safetensors");
  const auto parameter = llama_parameters();
  CHECK(imported.size() == parameter.size());
  for (const Tensor& t : checkpoint) {
    auto p = parameter.find(t.name);
    if (p == parameter.end()) continue;
    REQUIRE_MESSAGE(imported.count(p->second.first), p->second.first);
    check_widened(imported.at(p->second.first), t, false);
  }
  auto out = hf(fmt::format("export models/llama.yaml {} -o {} --dims {} --dtype bf16", dir / "w.safetensors", dir / "out", dims));
  REQUIRE_MESSAGE(out.status == 0, out.out);
  const std::map<std::string, Tensor> exported = read_all(dir / "out/model.safetensors");
  CHECK(exported.size() == parameter.size());
  for (const Tensor& t : checkpoint)
    if (parameter.count(t.name)) CHECK_MESSAGE(exported.at(t.name).bytes == t.bytes, t.name);
  const nlohmann::json config = nlohmann::json::parse(napkin::testing::read_bytes(dir / "out/config.json"));
  CHECK(config["architectures"] == nlohmann::json::array({"LlamaForCausalLM"}));
  CHECK(config["vocab_size"] == 37);
  CHECK(config["num_key_value_heads"] == 2);
  CHECK(config["head_dim"] == 4);
  CHECK(config["max_position_embeddings"] == 8);
  CHECK(config["tie_word_embeddings"] == false);
}

TEST_CASE("hf import: a sharded checkpoint (model.safetensors.index.json) reads as the single file does") {
  TempDir dir("hf-shards");
  const std::vector<Tensor> checkpoint = llama_checkpoint("bf16");
  write_checkpoint_file(dir / "model.safetensors", checkpoint);
  auto single = hf(fmt::format("import {} {} -o {}", kLlama, dir / "model.safetensors", dir / "single.safetensors"));
  REQUIRE_MESSAGE(single.status == 0, single.out);

  fs::create_directory(dir / "sharded");
  const size_t half = checkpoint.size() / 2;
  write_checkpoint_file(dir / "sharded/model-00001-of-00002.safetensors", {checkpoint.begin(), checkpoint.begin() + half});
  write_checkpoint_file(dir / "sharded/model-00002-of-00002.safetensors", {checkpoint.begin() + half, checkpoint.end()});
  nlohmann::json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", nlohmann::json::object()}};
  for (size_t i = 0; i < checkpoint.size(); ++i)
    index["weight_map"][checkpoint[i].name] = fmt::format("model-0000{}-of-00002.safetensors", i < half ? 1 : 2);
  napkin::testing::write_bytes(dir / "sharded/model.safetensors.index.json", index.dump(2));
  auto sharded = hf(fmt::format("import {} {} -o {}", kLlama, dir / "sharded", dir / "sharded.safetensors"));
  REQUIRE_MESSAGE(sharded.status == 0, sharded.out);
  CHECK(sharded.out.find("(2 shards)") != std::string::npos);
  const auto a = read_all(dir / "single.safetensors"), b = read_all(dir / "sharded.safetensors");
  REQUIRE(a.size() == b.size());
  for (const auto& entry : a) CHECK_MESSAGE(b.at(entry.first).bytes == entry.second.bytes, entry.first);

  // The index and its shards must agree, and name files beside it.
  auto broken = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json bad = index;
    edit(bad);
    napkin::testing::write_bytes(dir / "sharded/model.safetensors.index.json", bad.dump());
    return hf(fmt::format("import {} {} -o {}", kLlama, dir / "sharded", dir / "bad.safetensors"));
  };
  auto moved = broken([&](nlohmann::json& j) { j["weight_map"]["model.norm.weight"] = "model-00001-of-00002.safetensors"; });
  CHECK(moved.status == 1);
  CHECK(moved.out.find("model-00002-of-00002.safetensors holds model.norm.weight, which the index puts in "
                       "model-00001-of-00002.safetensors") != std::string::npos);
  CHECK(moved.out.find("model.norm.weight is not in model-00001-of-00002.safetensors, where the index puts it") !=
        std::string::npos);
  auto unlisted = broken([&](nlohmann::json& j) { j["weight_map"].erase("lm_head.weight"); });
  CHECK(unlisted.out.find("holds lm_head.weight, which the index does not list") != std::string::npos);
  auto outside = broken([&](nlohmann::json& j) { j["weight_map"]["lm_head.weight"] = "../model.safetensors"; });
  CHECK(outside.out.find("lm_head.weight: its shard '../model.safetensors' is not a file in the index's directory") !=
        std::string::npos);
  auto absent = broken([&](nlohmann::json& j) { j["weight_map"]["lm_head.weight"] = "model-00003-of-00002.safetensors"; });
  CHECK(absent.status == 1);
  CHECK(absent.out.find("model-00003-of-00002.safetensors: cannot read") != std::string::npos);
  napkin::testing::write_bytes(dir / "sharded/model.safetensors.index.json", "{\"weight_map\": ");
  auto not_json = hf(fmt::format("import {} {} -o {}", kLlama, dir / "sharded", dir / "bad.safetensors"));
  CHECK(not_json.out.find("not a JSON index of shards") != std::string::npos);
  CHECK_FALSE(fs::exists(dir / "bad.safetensors"));

  fs::create_directory(dir / "empty");
  napkin::testing::write_bytes(dir / "empty/pytorch_model.bin", "pickle");
  auto pickle = hf(fmt::format("import {} {} -o {}", kLlama, dir / "empty", dir / "bad.safetensors"));
  CHECK(pickle.status == 1);
  CHECK(pickle.out.find("holds neither model.safetensors nor model.safetensors.index.json: its pytorch_model.bin is a "
                        "pickle") != std::string::npos);
}

TEST_CASE("hf import: every mismatch is listed with the tensor, its expected and found shape and dtype, and nothing is written") {
  TempDir dir("hf-mismatch");
  std::vector<Tensor> checkpoint = llama_checkpoint("f32");
  std::vector<Tensor> bad;
  for (Tensor t : checkpoint) {
    if (t.name == "model.layers.0.self_attn.k_proj.weight") continue;  // missing
    if (t.name == "model.layers.1.mlp.up_proj.weight") t = make(t.name, "f32", {kD, kHidden}, 1);  // napkin's layout, not transformers'
    if (t.name == "model.norm.weight") t.dtype = "i32";                                          // wrong dtype
    if (t.name == "lm_head.weight") t = make(t.name, "f32", {kV, kD + 1}, 2);                     // wrong shape
    bad.push_back(t);
  }
  bad.push_back(make("model.layers.0.self_attn.rotary.cos_cached", "f32", {8, 4}, 3));  // unexpected
  write_checkpoint_file(dir / "model.safetensors", bad);
  auto run = hf(fmt::format("import {} {} -o {}", kLlama, dir / "model.safetensors", dir / "w.safetensors"));
  CHECK(run.status == 1);
  CHECK(run.out.find("does not match llama-hf's huggingface: section (5 problems)") != std::string::npos);
  CHECK(run.out.find("missing: model.layers.0.self_attn.k_proj.weight, expected [8, 16] in f32, bf16 or f16 for "
                     "layers.0.wk (f32[8, 16])") != std::string::npos);
  CHECK(run.out.find("wrong shape: model.layers.1.mlp.up_proj.weight is f32[16, 24], expected [24, 16] in f32, bf16 or "
                     "f16 for layers.1.w_up (f32[16, 24], transposed)") != std::string::npos);
  CHECK(run.out.find("wrong dtype: model.norm.weight is i32[16], expected [16] in f32, bf16 or f16 for norm_g (f32[16])") !=
        std::string::npos);
  CHECK(run.out.find("wrong shape: lm_head.weight is f32[32, 17], expected [32, 16]") != std::string::npos);
  CHECK(run.out.find("unexpected: model.layers.0.self_attn.rotary.cos_cached (f32[8, 4]) is no tensor of this model, "
                     "and no ignore: pattern matches it") != std::string::npos);
  CHECK_FALSE(fs::exists(dir / "w.safetensors"));

  // f64 does not narrow to f32 on import.
  checkpoint[0] = make(checkpoint[0].name, "f64", checkpoint[0].shape, 4);
  write_checkpoint_file(dir / "model.safetensors", checkpoint);
  auto wide = hf(fmt::format("import {} {} -o {}", kLlama, dir / "model.safetensors", dir / "w.safetensors"));
  CHECK(wide.out.find("wrong dtype: model.embed_tokens.weight is f64[32, 16], expected [32, 16] in f32, bf16 or f16") !=
        std::string::npos);
}

TEST_CASE("hf import: a tied tensor the checkpoint holds must equal the one it repeats") {
  TempDir dir("hf-tied");
  std::vector<Tensor> checkpoint = gpt2_checkpoint(16, 8, 32, 2, "f32");
  checkpoint.back().bytes[0] ^= 1;  // lm_head.weight no longer wte
  write_checkpoint_file(dir / "model.safetensors", checkpoint);
  auto run = hf(fmt::format("import {} {} -o {} --dims {}", kGpt2, dir / "model.safetensors", dir / "w.safetensors", kGpt2Dims));
  CHECK(run.status == 1);
  CHECK(run.out.find("tied: lm_head.weight (f32[16, 32]) differs from transformer.wte.weight (f32[16, 32]), which this "
                     "model ties it to (wte)") != std::string::npos);
  checkpoint.pop_back();  // save_pretrained leaves the tied head out
  write_checkpoint_file(dir / "model.safetensors", checkpoint);
  auto untied = hf(fmt::format("import {} {} -o {} --dims {}", kGpt2, dir / "model.safetensors", dir / "w.safetensors", kGpt2Dims));
  CHECK_MESSAGE(untied.status == 0, untied.out);
}

TEST_CASE("hf export: a napkin checkpoint's optimizer state stays behind, and overflow, a bad --dtype, a model without the section and unsafe outputs are errors") {
  TempDir dir("hf-export");
  const std::vector<Tensor> checkpoint = llama_checkpoint("f32");
  write_checkpoint_file(dir / "model.safetensors", checkpoint);
  REQUIRE(hf(fmt::format("import {} {} -o {}", kLlama, dir / "model.safetensors", dir / "w.safetensors")).status == 0);
  std::map<std::string, Tensor> weights = read_all(dir / "w.safetensors");

  // A training checkpoint: the parameters and AdamW's state.
  std::vector<rt::TensorRef> refs;
  std::vector<std::vector<char>> state;
  state.reserve(weights.size());
  for (auto& [name, t] : weights) {
    refs.push_back({name, "f32", t.shape, t.bytes.data()});
    state.push_back(t.bytes);
    refs.push_back({"adam.m." + name, "f32", t.shape, state.back().data()});
  }
  int64_t step = 7;
  refs.push_back({"optimizer.step", "i64", {}, &step});
  const std::string trained = rt::write_checkpoint(dir / "ckpt", 7, refs, "some hash", "0123456789abcdef", {});
  auto run = hf(fmt::format("export {} {} -o {}", kLlama, dir / "ckpt", dir / "out"));  // the directory: its newest
  REQUIRE_MESSAGE(run.status == 0, run.out);
  CHECK(run.out.find("left out the optimizer state (22 tensors)") != std::string::npos);
  CHECK(run.out.find("from " + trained) != std::string::npos);
  const auto exported = read_all(dir / "out/model.safetensors");
  CHECK(exported.size() == 21);
  for (const Tensor& t : checkpoint)
    if (exported.count(t.name)) CHECK_MESSAGE(exported.at(t.name).bytes == t.bytes, t.name);

  // 1e6 is beyond f16's 65504.
  Tensor& norm = weights.at("norm_g");
  const float big = 1e6f;
  std::memcpy(norm.bytes.data() + 4 * 3, &big, 4);
  std::vector<rt::TensorData> views;
  for (const auto& [name, t] : weights) views.push_back({name, t.dtype, t.shape, t.bytes.data()});
  rt::write_safetensors_file(dir / "big.safetensors", views, {});
  auto overflow = hf(fmt::format("export {} {} -o {} --dtype f16", kLlama, dir / "big.safetensors", dir / "f16"));
  CHECK(overflow.status == 1);
  CHECK(overflow.out.find("cannot be exported in f16 (1 problem)\n  norm_g (f32[16]): 1 finite values are too large for f16") !=
        std::string::npos);
  CHECK_FALSE(fs::exists(dir / "f16"));
  CHECK(hf(fmt::format("export {} {} -o {} --dtype bf16", kLlama, dir / "big.safetensors", dir / "bf16")).status == 0);

  fs::create_directory(dir / "no-checkpoints");
  auto empty = hf(fmt::format("export {} {} -o {}", kLlama, dir / "no-checkpoints", dir / "none"));
  CHECK(empty.status == 1);
  CHECK(empty.out.find("a directory without checkpoints") != std::string::npos);

  auto dtype = hf(fmt::format("export {} {} -o {} --dtype i32", kLlama, dir / "w.safetensors", dir / "i32"));
  CHECK(dtype.status == 1);
  CHECK(dtype.out.find("--dtype i32: napkin hf export writes f32, bf16 or f16") != std::string::npos);

  auto no_section = hf(fmt::format("export models/gpt.yaml {} -o {}", dir / "w.safetensors", dir / "gpt"));
  CHECK(no_section.status == 1);
  CHECK(no_section.out.find("models/gpt.yaml:1:1: error: the model has no huggingface: section") != std::string::npos);

  auto onto_file = hf(fmt::format("export {} {} -o {}", kLlama, dir / "w.safetensors", dir / "w.safetensors"));
  CHECK(onto_file.status == 1);
  CHECK(onto_file.out.find("is a file; napkin hf export writes a directory") != std::string::npos);
  auto onto_input = hf(fmt::format("export {} {} -o {}", kLlama, dir / "out/model.safetensors", dir / "out"));
  CHECK(onto_input.status == 1);
  CHECK_MESSAGE(onto_input.out.find("is also an input") != std::string::npos, onto_input.out);
  napkin::testing::write_bytes(dir / "out/model.safetensors.index.json", "{}");
  auto stale = hf(fmt::format("export {} {} -o {}", kLlama, dir / "w.safetensors", dir / "out"));
  CHECK(stale.status == 1);
  CHECK(stale.out.find("holds model.safetensors.index.json") != std::string::npos);

  // A checkpoint of another model: every difference listed.
  auto other = hf(fmt::format("export {} {} -o {} --dims {}", kGpt2, dir / "w.safetensors", dir / "gpt2", kGpt2Dims));
  CHECK(other.status == 1);
  CHECK(other.out.find("wrong shape: wte is f32[32, 16] in the file, f32[16, 32] in this model") != std::string::npos);
  CHECK(other.out.find("missing: wpe (f32[8, 32])") != std::string::npos);
  CHECK(other.out.find("unexpected: layers.0.wq") != std::string::npos);
}

TEST_CASE("hf import and export: one checkpoint tensor per expert stacks on the parameter's first axis (transposed per expert where asked) and unstacks bit for bit") {
  for (const std::string dtype : {"f32", "bf16"}) {
    CAPTURE(dtype);
    TempDir dir("hf-experts");
    const std::vector<Tensor> checkpoint = mixtral_checkpoint(dtype);
    write_checkpoint_file(dir / "model.safetensors", checkpoint);
    auto in = hf(fmt::format("import {} {} -o {}", kExpertsModel, dir / "model.safetensors", dir / "w.safetensors"));
    REQUIRE_MESSAGE(in.status == 0, in.out);
    CHECK(in.out.find("wrote " + dir / "w.safetensors" + ": 13 parameter tensors") != std::string::npos);
    // 3 stacked parameters in each of 2 layers, of 3 experts each.
    CHECK(in.out.find("stacked 18 tensors into 6 parameters on their first axis") != std::string::npos);
    CHECK(in.out.find("transposed 6 tensors") != std::string::npos);

    const std::map<std::string, Tensor> imported = read_all(dir / "w.safetensors");
    CHECK(imported.size() == 13);
    REQUIRE(imported.count("layers.1.w_up"));
    CHECK(imported.at("layers.1.w_up").shape == std::vector<int64_t>{3, 8, 12});
    CHECK(imported.at("layers.0.w_gate").shape == std::vector<int64_t>{3, 12, 8});
    CHECK(imported.at("layers.0.w_down").shape == std::vector<int64_t>{3, 8, 12});
    const std::map<std::string, Place> places = mixtral_places(3, false);
    CHECK(places.size() == checkpoint.size());
    for (const Tensor& t : checkpoint) {
      const Place& place = places.at(t.name);
      REQUIRE_MESSAGE(imported.count(place.param), place.param);
      const Tensor& param = imported.at(place.param);
      check_widened(place.index < 0 ? param : slice_of(param, place.index), t, place.transposed);
    }

    auto out = hf(fmt::format("export {} {} -o {} --dtype {}", kExpertsModel, dir / "w.safetensors", dir / "out", dtype));
    REQUIRE_MESSAGE(out.status == 0, out.out);
    CHECK(out.out.find(fmt::format(": {} tensors of experts-hf", checkpoint.size())) != std::string::npos);
    const std::map<std::string, Tensor> exported = read_all(dir / "out/model.safetensors");
    CHECK(exported.size() == checkpoint.size());
    for (const Tensor& t : checkpoint) {
      REQUIRE_MESSAGE(exported.count(t.name), t.name);
      CHECK(exported.at(t.name).dtype == dtype);
      CHECK(exported.at(t.name).shape == t.shape);
      CHECK_MESSAGE(exported.at(t.name).bytes == t.bytes, t.name);
    }
    const nlohmann::json config = nlohmann::json::parse(napkin::testing::read_bytes(dir / "out/config.json"));
    CHECK(config["architectures"] == nlohmann::json::array({"MixtralForCausalLM"}));
    CHECK(config["num_local_experts"] == 3);
  }
}

TEST_CASE("hf import: a stacked parameter's experts may lie in different shards") {
  TempDir dir("hf-experts-shards");
  const std::vector<Tensor> checkpoint = mixtral_checkpoint("bf16");
  write_checkpoint_file(dir / "model.safetensors", checkpoint);
  auto single = hf(fmt::format("import {} {} -o {}", kExpertsModel, dir / "model.safetensors", dir / "single.safetensors"));
  REQUIRE_MESSAGE(single.status == 0, single.out);

  // Even experts (and what is no expert) in the first shard, odd ones in the second.
  fs::create_directory(dir / "sharded");
  std::vector<Tensor> shards[2];
  nlohmann::json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", nlohmann::json::object()}};
  const std::map<std::string, Place> places = mixtral_places(3, false);
  for (const Tensor& t : checkpoint) {
    const int shard = places.at(t.name).index >= 0 ? static_cast<int>(places.at(t.name).index % 2) : 0;
    shards[shard].push_back(t);
    index["weight_map"][t.name] = fmt::format("model-0000{}-of-00002.safetensors", shard + 1);
  }
  for (int shard = 0; shard < 2; ++shard)
    write_checkpoint_file(dir / fmt::format("sharded/model-0000{}-of-00002.safetensors", shard + 1), shards[shard]);
  napkin::testing::write_bytes(dir / "sharded/model.safetensors.index.json", index.dump(2));
  auto sharded = hf(fmt::format("import {} {} -o {}", kExpertsModel, dir / "sharded", dir / "sharded.safetensors"));
  REQUIRE_MESSAGE(sharded.status == 0, sharded.out);
  CHECK(sharded.out.find("(2 shards)") != std::string::npos);
  const auto a = read_all(dir / "single.safetensors"), b = read_all(dir / "sharded.safetensors");
  REQUIRE(a.size() == b.size());
  for (const auto& entry : a) CHECK_MESSAGE(b.at(entry.first).bytes == entry.second.bytes, entry.first);
}

TEST_CASE("hf import: a missing expert, an expert of the wrong shape and experts beyond the dims are listed by name, and nothing is written") {
  TempDir dir("hf-experts-bad");
  std::vector<Tensor> bad;
  for (Tensor t : mixtral_checkpoint("f32")) {
    if (t.name == "model.layers.1.block_sparse_moe.experts.2.w1.weight") continue;  // missing
    if (t.name == "model.layers.0.block_sparse_moe.experts.1.w2.weight")
      t = make(t.name, "f32", {12, 8}, 1);  // [in, out]: not transformers' layout
    if (t.name == "model.layers.0.block_sparse_moe.experts.0.w3.weight")
      t = make(t.name, "f32", {8, 12}, 2);  // napkin's layout of the slice, not transformers'
    bad.push_back(t);
  }
  write_checkpoint_file(dir / "model.safetensors", bad);
  auto run = hf(fmt::format("import {} {} -o {}", kExpertsModel, dir / "model.safetensors", dir / "w.safetensors"));
  CHECK(run.status == 1);
  CHECK(run.out.find("does not match experts-hf's huggingface: section (3 problems)") != std::string::npos);
  CHECK(run.out.find("missing: model.layers.1.block_sparse_moe.experts.2.w1.weight, expected [12, 8] in f32, bf16 or "
                     "f16 for index 2 of layers.1.w_gate (f32[3, 12, 8], stacked on its first axis)") != std::string::npos);
  CHECK(run.out.find("wrong shape: model.layers.0.block_sparse_moe.experts.1.w2.weight is f32[12, 8], expected [8, 12] "
                     "in f32, bf16 or f16 for index 1 of layers.0.w_down (f32[3, 8, 12], stacked on its first axis)") !=
        std::string::npos);
  CHECK(run.out.find("wrong shape: model.layers.0.block_sparse_moe.experts.0.w3.weight is f32[8, 12], expected [12, 8] "
                     "in f32, bf16 or f16 for index 0 of layers.0.w_up (f32[3, 8, 12], stacked on its first axis, "
                     "transposed)") != std::string::npos);
  CHECK_FALSE(fs::exists(dir / "w.safetensors"));

  // A checkpoint of 4 experts at dims that say 3: each extra expert's tensors
  // are named, with the dims as the likely mistake (the router's shape too).
  write_checkpoint_file(dir / "model.safetensors", mixtral_checkpoint("f32", {.experts = 4}));
  auto more = hf(fmt::format("import {} {} -o {}", kExpertsModel, dir / "model.safetensors", dir / "w.safetensors"));
  CHECK(more.status == 1);
  CHECK(more.out.find("(8 problems)") != std::string::npos);
  CHECK(more.out.find("unexpected: model.layers.1.block_sparse_moe.experts.3.w3.weight (f32[12, 8]) is no tensor of "
                      "this model, and no ignore: pattern matches it; layers.1.w_up stacks 3 tensors (indices 0 to 2) at "
                      "these dims: are the dims (--dims) those of the checkpoint?") != std::string::npos);
  CHECK(more.out.find("wrong shape: model.layers.0.block_sparse_moe.gate.weight is f32[4, 8], expected [3, 8]") !=
        std::string::npos);
  auto right_dims = hf(fmt::format("import {} {} -o {} --dims experts=4", kExpertsModel, dir / "model.safetensors",
                                   dir / "w.safetensors"));
  CHECK_MESSAGE(right_dims.status == 0, right_dims.out);
  CHECK(read_all(dir / "w.safetensors").at("layers.0.w_down").shape == std::vector<int64_t>{4, 8, 12});
}

TEST_CASE("hf import and export: models/moe.yaml is MixtralForCausalLM tensor for tensor, its experts stacked") {
  TempDir dir("hf-moe-yaml");
  // moe.yaml at small dims: llama-hf's attention, 3 experts of 24.
  const std::string dims =
      "batch=2,seq=8,vocab=32,d=16,heads=4,kv_heads=2,experts=3,top_k=2,expert_hidden=24,capacity_percent=150,layers=2";
  const MixtralSizes sizes{.vocab = 32, .d = 16, .hidden = 24, .experts = 3, .kv = 8};
  const std::vector<Tensor> checkpoint = mixtral_checkpoint("bf16", sizes);
  write_checkpoint_file(dir / "model.safetensors", checkpoint);
  auto in = hf(fmt::format("import models/moe.yaml {} -o {} --dims {}", dir / "model.safetensors", dir / "w.safetensors", dims));
  REQUIRE_MESSAGE(in.status == 0, in.out);
  CHECK(in.out.find("stacked 18 tensors into 6 parameters") != std::string::npos);
  const std::map<std::string, Tensor> imported = read_all(dir / "w.safetensors");
  CHECK(imported.size() == 3 + 2 * 10);
  const std::map<std::string, Place> places = mixtral_places(3, true);
  CHECK(places.size() == checkpoint.size());
  for (const Tensor& t : checkpoint) {
    const Place& place = places.at(t.name);
    REQUIRE_MESSAGE(imported.count(place.param), place.param);
    const Tensor& param = imported.at(place.param);
    check_widened(place.index < 0 ? param : slice_of(param, place.index), t, place.transposed);
  }
  auto out = hf(fmt::format("export models/moe.yaml {} -o {} --dims {} --dtype bf16", dir / "w.safetensors", dir / "out", dims));
  REQUIRE_MESSAGE(out.status == 0, out.out);
  const std::map<std::string, Tensor> exported = read_all(dir / "out/model.safetensors");
  CHECK(exported.size() == checkpoint.size());
  for (const Tensor& t : checkpoint) {
    REQUIRE_MESSAGE(exported.count(t.name), t.name);
    CHECK_MESSAGE(exported.at(t.name).bytes == t.bytes, t.name);
  }
  const nlohmann::json config = nlohmann::json::parse(napkin::testing::read_bytes(dir / "out/config.json"));
  CHECK(config["architectures"] == nlohmann::json::array({"MixtralForCausalLM"}));
  CHECK(config["model_type"] == "mixtral");
  CHECK(config["num_local_experts"] == 3);
  CHECK(config["num_experts_per_tok"] == 2);
  CHECK(config["intermediate_size"] == 24);
  CHECK(config["output_router_logits"] == true);
  CHECK(config["router_aux_loss_coef"].get<double>() == 0.02);
  CHECK(config["sliding_window"].is_null());
  CHECK(config["tie_word_embeddings"] == false);
}
