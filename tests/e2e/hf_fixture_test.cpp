// napkin against transformers, offline: tests/e2e/data/hf/FAMILY holds what
// bench/hf_parity.py --write-fixtures saved from transformers itself (its
// save_pretrained files config.json and model.safetensors of a small
// LlamaForCausalLM / GPT2LMHeadModel / MixtralForCausalLM, a prompt, and
// transformers' logits on that prompt, at the dims in dims.txt). napkin
// imports the weights, computes the prompt's logits with the compiled prefill
// (napkin sample --logits), in fp32, and exports them back: the logits agree
// with transformers' to 1e-5 relative, and the exported file holds
// transformers' tensors bit for bit. Mixtral's fixture also holds 20 AdamW
// steps of transformers (its load-balancing loss included), which napkin's
// trainer repeats from the imported weights to 1e-4 relative.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <cmath>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <vector>
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

// train.json: transformers' losses over `steps` AdamW steps (constant lr,
// betas 0.9/0.95, eps 1e-8, weight decay 0.1 but on `no_decay`, clipping at
// 1) from the fixture's weights on tokens.u16 read in order; napkin's trainer
// from the imported weights on the same tokens agrees at every step to 1e-4.
template <typename Run>
void check_training(const std::string& fixture, const std::string& dims, const std::string& yaml,
                    const std::string& weights, const TempDir& dir, const Run& run) {
  const nlohmann::json train = nlohmann::json::parse(read_bytes(std::string(NAPKIN_SOURCE_DIR) + "/" + fixture +
                                                                "/train.json"));
  std::string globs;
  for (const auto& g : train["no_decay"]) globs += (globs.empty() ? "\"" : ", \"") + g.get<std::string>() + "\"";
  const std::string text = std::regex_replace(
      read_bytes(yaml), std::regex("\noptimizer:[^\n]*"),
      fmt::format("\noptimizer: adamw(lr={}, betas=[0.9, 0.95], eps=1e-8, weight_decay=0.1, grad_clip=1.0, "
                  "no_decay=[{}])",
                  train["lr"].get<double>(), globs));
  const std::string trained = dir / "train.yaml";
  write_bytes(trained, text);
  const int steps = train["steps"];
  run(fmt::format("{} train {} --dims {} -- --init {} --data {}/tokens.u16 --order sequential --steps {} "
                  "--log-every 1 --metrics {} --checkpoint-every 0 --eval-every 0 --quiet --seed 0",
                  NAPKIN_BINARY, trained, dims, weights, fixture, steps, dir / "metrics.jsonl"));
  std::vector<double> losses;
  std::istringstream lines(read_bytes(dir / "metrics.jsonl"));
  for (std::string line; std::getline(lines, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains("loss") && j.contains("step")) losses.push_back(j["loss"]);
  }
  const std::vector<double> expected = train["losses"];
  REQUIRE(losses.size() == expected.size());
  double worst = 0;
  for (size_t i = 0; i < losses.size(); ++i) {
    INFO("step " << i + 1 << ": napkin " << losses[i] << ", transformers " << expected[i]);
    const double error = std::fabs(losses[i] - expected[i]) / std::fabs(expected[i]);
    CHECK(error <= 1e-4);
    worst = std::max(worst, error);
  }
  MESSAGE(fixture << ": " << steps << " AdamW steps, worst relative loss difference to transformers " << worst);
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
  if (std::filesystem::exists(source + "/train.json")) check_training(fixture, dims, yaml, weights, dir, run);
}

}  // namespace

TEST_CASE("hf fixture: a transformers Llama's weights give its logits in napkin, and export back bit for bit") {
  check_family("llama", "models/llama.yaml");
}

TEST_CASE("hf fixture: a transformers GPT-2's weights give its logits in napkin, and export back bit for bit") {
  check_family("gpt2", "models/gpt2-124m.yaml");
}

TEST_CASE("hf fixture: a transformers Mixtral's weights give its logits in napkin, export back bit for bit, and train as transformers trains it for 20 steps") {
  check_family("mixtral", "models/moe.yaml");
}
