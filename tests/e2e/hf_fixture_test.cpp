// napkin against transformers, offline: tests/e2e/data/hf/FAMILY holds what
// bench/hf_parity.py --write-fixtures saved from transformers itself (its
// save_pretrained files config.json and model.safetensors of a small
// LlamaForCausalLM / GPT2LMHeadModel, a prompt, and transformers' logits on
// that prompt, at the dims in dims.txt). napkin imports the weights, computes
// the prompt's logits with the compiled prefill (napkin sample --logits), in
// fp32, and exports them back: the logits agree with transformers' to 1e-5
// relative, and the exported file holds transformers' tensors bit for bit.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <regex>
#include <string>

#include "runtime/npy.h"
#include "runtime/safetensors.h"
#include "support/test_io.h"

namespace {

namespace rt = napkin::runtime;
using napkin::testing::read_bytes;
using napkin::testing::run_in_source_tree;
using napkin::testing::TempDir;
using napkin::testing::write_bytes;

std::string trimmed(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

// The model file at fp32 (the fixture's logits are transformers' fp32 forward).
std::string fp32_copy(const TempDir& dir, const std::string& model) {
  const std::string text = read_bytes(std::string(NAPKIN_SOURCE_DIR) + "/" + model);
  const std::string out = dir / "model.yaml";
  write_bytes(out, std::regex_replace(text, std::regex("\nprecision:[^\n]*"), "\nprecision: fp32"));
  return out;
}

void check_family(const std::string& family, const std::string& model) {
  const std::string fixture = "tests/e2e/data/hf/" + family;
  const std::string source = std::string(NAPKIN_SOURCE_DIR) + "/" + fixture;
  const std::string dims = trimmed(read_bytes(source + "/dims.txt"));
  TempDir dir("hf-fixture-" + family);
  const std::string yaml = fp32_copy(dir, model);
  const std::string weights = dir / "weights.safetensors";
  auto run = [&](const std::string& command) {
    napkin::testing::CommandResult r = run_in_source_tree(fmt::format("XDG_CACHE_HOME={} {}", dir / "cache", command));
    INFO(command);
    INFO(r.out);
    REQUIRE(r.status == 0);
    return r;
  };
  run(fmt::format("{} hf import {} {} --dims {} -o {}", NAPKIN_BINARY, yaml, fixture, dims, weights));

  run(fmt::format("{} sample {} --dims {} --checkpoint {} --prompt-ids {}/prompt.txt --tokens 1 --temperature 0 "
                  "--logits {}",
                  NAPKIN_BINARY, yaml, dims, weights, fixture, dir / "logits.npy"));
  const rt::NpyArray expected = rt::read_npy(source + "/logits.npy");
  const rt::NpyArray got = rt::read_npy(dir / "logits.npy");
  REQUIRE(got.shape == expected.shape);
  const auto* e = reinterpret_cast<const float*>(expected.data);
  const auto* g = reinterpret_cast<const float*>(got.data);
  double largest = 0, worst = 0;
  for (int64_t i = 0; i < expected.numel; ++i) {
    largest = std::max(largest, std::fabs(static_cast<double>(e[i])));
    worst = std::max(worst, std::fabs(static_cast<double>(g[i]) - e[i]));
  }
  INFO(fmt::format("{}: max |napkin - transformers| = {:.3g}, max |transformers| = {:.3g}", family, worst, largest));
  CHECK(worst <= 1e-5 * largest);

  run(fmt::format("{} hf export {} {} --dims {} -o {}", NAPKIN_BINARY, yaml, weights, dims, dir / "export"));
  const rt::SafetensorsFile original(source + "/model.safetensors");
  const rt::SafetensorsFile exported(dir / "export/model.safetensors");
  CHECK(exported.tensors().size() == original.tensors().size());
  for (const auto& t : original.tensors()) {
    INFO(t.name);
    const rt::SafetensorsFile::Tensor* back = exported.find(t.name);
    REQUIRE(back != nullptr);
    CHECK(back->dtype == t.dtype);
    CHECK(back->shape == t.shape);
    REQUIRE(back->bytes == t.bytes);
    CHECK(std::equal(t.data, t.data + t.bytes, back->data));
  }
}

}  // namespace

TEST_CASE("hf fixture: a transformers Llama's weights give its logits in napkin, and export back bit for bit") {
  check_family("llama", "models/llama.yaml");
}

TEST_CASE("hf fixture: a transformers GPT-2's weights give its logits in napkin, and export back bit for bit") {
  check_family("gpt2", "models/gpt2-124m.yaml");
}
