// Generated trainers end to end: build a model with `napkin build`, train it
// on real files, and check what a user relies on: the loss of every step
// matches PyTorch (reference files from tests/e2e/make_reference.py), a run
// resumed from a checkpoint is bit-identical to an uninterrupted one, and bad
// input (a corrupt checkpoint, wrong --init weights, missing data, a NaN)
// stops with a clear message, a non-zero exit and nothing overwritten.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>

#include "runtime/safetensors.h"
#include "support/checkpoint_content.h"
#include "support/test_io.h"
#include "support/test_models.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

using napkin::testing::read_bytes;
using napkin::testing::write_bytes;
using Run = napkin::testing::CommandResult;
Run sh(const std::string& command) { return napkin::testing::run_in_source_tree(command); }

// Builds models/<model>.yaml at `dims` into dir/trainer.
std::string build(const std::string& model, const std::string& dims, const fs::path& dir) {
  std::string trainer = (dir / "trainer").string();
  Run r = sh(fmt::format("{} build {} --dims {} -o {} --quiet", NAPKIN_BINARY, model, dims, trainer));
  INFO(r.out);
  REQUIRE(r.status == 0);
  return trainer;
}

std::vector<double> logged_losses(const fs::path& metrics) {
  std::vector<double> losses;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    json j = json::parse(line);
    if (j.contains("loss")) losses.push_back(j["loss"]);
  }
  return losses;
}

const char* kGptDims = "batch=4,seq=32,d=64,heads=4,layers=2";
const char* kGptData = "--data tests/e2e/data/gpt/tokens.u16";

}  // namespace

TEST_CASE("e2e: mlp and gpt losses match PyTorch step by step for 50 steps from the same weights and data") {
  for (const char* model : {"mlp", "gpt"}) {
    CAPTURE(model);
    json expected = json::parse(napkin::testing::read_source(fmt::format("tests/e2e/data/{}/expected.json", model)));
    napkin::testing::TempDir tmp(std::string("e2e-") + model);
    fs::path dir = tmp.path;
    std::string trainer = build(expected["model"], expected["dims"], dir);
    std::string args;
    for (const auto& a : expected["trainer_args"]) args += " " + a.get<std::string>();
    Run r = sh(fmt::format("{}{} --metrics {} --checkpoint-dir {} --quiet", trainer, args, (dir / "m.jsonl").string(),
                           (dir / "ckpt").string()));
    INFO(r.out);
    REQUIRE(r.status == 0);
    std::vector<double> got = logged_losses(dir / "m.jsonl");
    std::vector<double> want = expected["losses"];
    REQUIRE(got.size() == want.size());
    double worst = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      double rel = std::fabs(got[i] - want[i]) / std::fabs(want[i]);
      worst = std::max(worst, rel);
      INFO("step " << i + 1 << ": napkin " << got[i] << " vs torch " << want[i]);
      CHECK(rel < 1e-4);  // fp32; measured: mlp 9.5e-7, gpt 1.8e-7
    }
    CHECK(got.back() < got.front());  // and it learns
    MESSAGE(std::string(model) << ": worst relative difference to PyTorch over 50 steps " << worst);
  }
}

TEST_CASE("e2e: 10 steps + resume + 10 steps writes the same checkpoint tensors and metadata as 20 steps") {
  napkin::testing::TempDir tmp("e2e-resume");
  fs::path dir = tmp.path;
  std::string trainer = build("models/gpt.yaml", kGptDims, dir);
  std::string common = fmt::format("{} {} --quiet --order random", trainer, kGptData);
  Run whole = sh(fmt::format("{} --steps 20 --checkpoint-dir {} --checkpoint-every 20", common, (dir / "whole").string()));
  INFO(whole.out);
  REQUIRE(whole.status == 0);
  Run first = sh(fmt::format("{} --steps 10 --checkpoint-dir {} --checkpoint-every 10", common, (dir / "split").string()));
  REQUIRE(first.status == 0);
  Run second = sh(fmt::format("{} --steps 20 --resume {} --checkpoint-dir {} --checkpoint-every 10", common,
                              (dir / "split").string(), (dir / "split").string()));
  INFO(second.out);
  REQUIRE(second.status == 0);
  // The same tensors and metadata; only the run id (and so the checksum) differs.
  std::string a = napkin::testing::checkpoint_content(dir / "whole" / "step-000020.safetensors");
  std::string b = napkin::testing::checkpoint_content(dir / "split" / "step-000020.safetensors");
  REQUIRE(a.size() > 100000);
  CHECK(a == b);
}

TEST_CASE("e2e: a corrupt, truncated or foreign checkpoint is refused and nothing is overwritten") {
  napkin::testing::TempDir tmp("e2e-corrupt");
  fs::path dir = tmp.path;
  std::string trainer = build("models/gpt.yaml", kGptDims, dir);
  std::string ckpts = (dir / "ckpt").string();
  REQUIRE(sh(fmt::format("{} {} --quiet --steps 2 --checkpoint-dir {} --checkpoint-every 2", trainer, kGptData, ckpts)).status == 0);
  fs::path saved = dir / "ckpt" / "step-000002.safetensors";
  std::string good = read_bytes(saved);

  SUBCASE("a flipped byte") {
    std::string bad = good;
    bad[bad.size() - 100] ^= 0x40;
    write_bytes(saved, bad);
    Run r = sh(fmt::format("{} {} --quiet --steps 4 --resume {}", trainer, kGptData, ckpts));
    CHECK(r.status == 1);
    CHECK(r.out.find("checksum") != std::string::npos);
    CHECK(read_bytes(saved) == bad);  // not replaced by a run that never started
  }
  SUBCASE("truncated") {
    write_bytes(saved, good.substr(0, good.size() / 2));
    Run r = sh(fmt::format("{} {} --quiet --steps 4 --resume {}", trainer, kGptData, ckpts));
    CHECK(r.status == 1);
    CHECK(r.out.find("error:") != std::string::npos);
  }
  SUBCASE("written by another model") {
    fs::create_directories(dir / "other");
    std::string other_trainer = build("models/gpt.yaml", "batch=4,seq=32,d=64,heads=2,layers=2", dir / "other");
    Run r = sh(fmt::format("{} {} --quiet --steps 4 --resume {}", other_trainer, kGptData, ckpts));
    CHECK(r.status == 1);
    CHECK(r.out.find("different model") != std::string::npos);
  }
}

TEST_CASE("e2e: --init names missing and mis-shaped weights - a NaN stops training (claiming no checkpoint it has not) and --debug-nan names the op") {
  napkin::testing::TempDir tmp("e2e-init");
  fs::path dir = tmp.path;
  std::string trainer = build("models/mlp.yaml", "batch=16,d_in=64,hidden=32", dir);
  std::string data = "--data-file images=tests/e2e/data/mlp/images.npy --data-file labels=tests/e2e/data/mlp/labels.npy";
  napkin::runtime::SafetensorsFile init(napkin::testing::source_path("tests/e2e/data/mlp/init.safetensors"));

  // The reference weights with w2 dropped and b3 the wrong shape.
  std::vector<napkin::runtime::TensorData> tensors;
  std::vector<float> wrong_b3(7, 0.0f);
  for (const auto& t : init.tensors()) {
    if (t.name == "w2") continue;
    if (t.name == "b3") tensors.push_back({"b3", "f32", {7}, wrong_b3.data()});
    else tensors.push_back({t.name, t.dtype, t.shape, t.data});
  }
  napkin::runtime::write_safetensors_file((dir / "bad.safetensors").string(), tensors, {});
  Run r = sh(fmt::format("{} {} --quiet --steps 1 --init {}", trainer, data, (dir / "bad.safetensors").string()));
  CHECK(r.status == 1);
  CHECK(r.out.find("w2") != std::string::npos);
  CHECK(r.out.find("b3") != std::string::npos);

  // One NaN weight: the first loss is NaN; the run stops before any update.
  std::vector<napkin::runtime::TensorData> nan_tensors;
  std::vector<float> w1;
  for (const auto& t : init.tensors()) {
    if (t.name == "w1") {
      const float* p = reinterpret_cast<const float*>(t.data);
      w1.assign(p, p + 64 * 32);
      w1[5] = std::numeric_limits<float>::quiet_NaN();
      nan_tensors.push_back({t.name, t.dtype, t.shape, w1.data()});
    } else {
      nan_tensors.push_back({t.name, t.dtype, t.shape, t.data});
    }
  }
  napkin::runtime::write_safetensors_file((dir / "nan.safetensors").string(), nan_tensors, {});
  std::string ckpts = (dir / "ckpt").string();
  r = sh(fmt::format("{} {} --quiet --steps 3 --init {} --checkpoint-dir {} --checkpoint-every 1", trainer, data,
                     (dir / "nan.safetensors").string(), ckpts));
  CHECK(r.status == 1);
  CHECK(r.out.find("step 1: the loss is nan") != std::string::npos);
  CHECK_FALSE(fs::exists(dir / "ckpt" / "step-000001.safetensors"));
  // No checkpoint to go back to, and the message claims none.
  CHECK(r.out.find("(no checkpoint saved yet)") != std::string::npos);
  CHECK(r.out.find("last checkpoint") == std::string::npos);
  r = sh(fmt::format("{} {} --quiet --steps 3 --init {}", trainer, data, (dir / "nan.safetensors").string()));
  CHECK(r.status == 1);
  CHECK(r.out.find("(no --checkpoint-dir: nothing saved)") != std::string::npos);
  CHECK(r.out.find("last checkpoint") == std::string::npos);
  r = sh(fmt::format("{} {} --quiet --steps 3 --init {} --debug-nan", trainer, data, (dir / "nan.safetensors").string()));
  CHECK(r.status == 1);
  CHECK(r.out.find("produced the first NaN") != std::string::npos);
  CHECK(r.out.find("models/mlp.yaml:") != std::string::npos);  // the op's YAML line

  r = sh(fmt::format("{} --quiet --steps 1 --data-file images=no/such.npy --data-file labels=tests/e2e/data/mlp/labels.npy", trainer));
  CHECK(r.status == 1);
  CHECK(r.out.find("no/such.npy") != std::string::npos);
}

TEST_CASE("e2e: gpt and GPT-2 bf16-mixed train the same 50 steps with the fused kernels as with every one of them unfused") {
  // The fused attention, classifier, f32 weight-gradient GEMMs and GEMM
  // epilogues (GPT-2: biases, residuals, the gelu and its gradient) against
  // the spelled-out step they replace (cast sinking changes no bit:
  // tests/unit/sink_casts_test.cpp).
  napkin::testing::TempDir tmp("e2e-fused-vs-unfused");
  fs::path dir = tmp.path;
  std::string text = napkin::testing::read_source("models/gpt.yaml");
  const std::string fp32 = "\nprecision: fp32\n";
  REQUIRE(text.find(fp32) != std::string::npos);
  text.replace(text.find(fp32), fp32.size(), "\nprecision: bf16-mixed\n");
  write_bytes((dir / "gpt-bf16.yaml").string(), text);
  struct Case {
    std::string name, model, dims;
  };
  for (const Case& c : {Case{"gpt", (dir / "gpt-bf16.yaml").string(), kGptDims},
                        Case{"gpt2", std::string(NAPKIN_SOURCE_DIR) + "/models/gpt2-124m.yaml",
                             "vocab=256,d=64,heads=4,layers=2,batch=4,seq=32"}}) {
    CAPTURE(c.name);
    std::vector<std::vector<double>> losses;
    for (const char* flags : {"", " --unfused-attention --unfused-classifier --unfused-epilogues"}) {
      CAPTURE(flags);
      const fs::path sub = dir / c.name / (std::string(flags).empty() ? "fused" : "unfused");
      fs::create_directories(sub);
      const std::string trainer = (sub / "trainer").string();
      Run b = sh(fmt::format("{} build {} --dims {}{} -o {} --quiet", NAPKIN_BINARY, c.model, c.dims, flags, trainer));
      INFO(b.out);
      REQUIRE(b.status == 0);
      Run r = sh(fmt::format("{} {} --steps 50 --seed 1 --threads 2 --log-every 1 --eval-every 0 --checkpoint-every 0 "
                             "--metrics {} --checkpoint-dir {} --quiet",
                             trainer, kGptData, (sub / "m.jsonl").string(), (sub / "ckpt").string()));
      INFO(r.out);
      REQUIRE(r.status == 0);
      losses.push_back(logged_losses(sub / "m.jsonl"));
      REQUIRE(losses.back().size() == 50);
    }
    double worst = 0;
    for (size_t i = 0; i < 50; ++i) {
      const double rel = std::fabs(losses[0][i] - losses[1][i]) / std::fabs(losses[1][i]);
      worst = std::max(worst, rel);
      INFO("step " << i + 1 << ": fused " << losses[0][i] << " vs unfused " << losses[1][i]);
      CHECK(rel < 1e-3);  // bf16 rounding differs (attention, f32 sums, stored gelu input); measured below
    }
    CHECK(losses[0].back() < losses[0].front());
    MESSAGE(c.name << " bf16-mixed: worst relative loss difference fused vs unfused over 50 steps " << worst);
  }
}

TEST_CASE("e2e: models/llama.yaml builds and trains on the CPU at small dims - its loss falls") {
  // The shipped Llama (rope, grouped-query attention at these dims, SwiGLU,
  // RMSNorm, an untied head, bf16-mixed) as a user trains it: napkin build,
  // then the trainer on byte tokens.
  napkin::testing::TempDir tmp("e2e-llama");
  const fs::path dir = tmp.path;
  const std::string trainer =
      build("models/llama.yaml", "batch=4,seq=32,d=64,heads=4,kv_heads=2,hidden=96,layers=2", dir);
  Run r = sh(fmt::format("{} {} --steps 30 --seed 1 --threads 2 --log-every 1 --eval-every 0 --checkpoint-every 0 "
                         "--metrics {} --checkpoint-dir {} --quiet",
                         trainer, kGptData, (dir / "m.jsonl").string(), (dir / "ckpt").string()));
  INFO(r.out);
  REQUIRE(r.status == 0);
  const std::vector<double> losses = logged_losses(dir / "m.jsonl");
  REQUIRE(losses.size() == 30);
  for (double l : losses) CHECK(std::isfinite(l));
  // Uniform over 256 bytes is ln 256 = 5.55 at the start; the text's byte
  // statistics take it well below within 30 AdamW steps at lr 3e-3.
  CHECK(losses.front() == doctest::Approx(std::log(256.0)).epsilon(0.05));
  double first = 0, last = 0;
  for (int i = 0; i < 5; ++i) first += losses[i] / 5, last += losses[25 + i] / 5;
  MESSAGE("llama small dims: loss " << losses.front() << " -> " << losses.back() << " (first five " << first
                                    << ", last five " << last << ")");
  CHECK(last < first - 1.0);
}

TEST_CASE("e2e: models/moe.yaml trains on the CPU at small dims - its loss falls and the metrics count each layer's dropped pairs") {
  // Capacity factor 1 (capacity_percent=100): C = T·k/E, so an unbalanced
  // router drops some (token, choice) pairs, which the trainer logs per layer.
  napkin::testing::TempDir tmp("e2e-moe");
  const fs::path dir = tmp.path;
  const std::string trainer = build(
      "models/moe.yaml",
      "batch=4,seq=32,d=64,heads=4,kv_heads=2,experts=4,top_k=2,expert_hidden=64,capacity_percent=100,layers=2", dir);
  Run r = sh(fmt::format("{} {} --steps 30 --seed 1 --threads 2 --log-every 1 --eval-every 0 --checkpoint-every 0 "
                         "--metrics {} --checkpoint-dir {}",
                         trainer, kGptData, (dir / "m.jsonl").string(), (dir / "ckpt").string()));
  INFO(r.out);
  REQUIRE(r.status == 0);
  CHECK(r.out.find("moe dropped") != std::string::npos);
  const std::vector<double> losses = logged_losses(dir / "m.jsonl");
  REQUIRE(losses.size() == 30);
  double first = 0, last = 0;
  for (int i = 0; i < 5; ++i) first += losses[i] / 5, last += losses[25 + i] / 5;
  MESSAGE("moe small dims: loss " << losses.front() << " -> " << losses.back());
  CHECK(last < first - 1.0);
  // Every step record has each layer's dropped pairs and its experts' assignments (T·k = 128 · 2 = 256 in
  // all, before capacity), and the drops are what the assignments say: Σ_e max(count_e − C, 0), C = 64.
  int records = 0;
  double dropped = 0;
  std::ifstream in(dir / "m.jsonl");
  for (std::string line; std::getline(in, line);) {
    json j = json::parse(line);
    if (!j.contains("loss")) continue;
    ++records;
    REQUIRE(j.contains("moe_dropped"));
    for (const char* layer : {"layers.0", "layers.1"}) {
      CAPTURE(layer);
      REQUIRE(j["moe_dropped"].contains(layer));
      const double n = j["moe_dropped"][layer];
      CHECK(n == std::floor(n));
      CHECK(n >= 0);
      CHECK(n <= 256);
      dropped += n;
      REQUIRE(j["moe_load"][layer].size() == 4);
      double assigned = 0, over = 0;
      for (double c : j["moe_load"][layer]) {
        assigned += c;
        over += std::max(c - 64, 0.0);
      }
      CHECK(assigned == 256);
      CHECK(over == n);
    }
  }
  CHECK(records == 30);
  CHECK(dropped > 0);  // 30 steps of a fresh router at capacity factor 1 drop some pairs
}
