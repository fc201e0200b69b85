// Dropout in a generated trainer: the eval forward sees none (its loss is the
// one of the same model without dropout, from the same weights), and a run
// resumed from a checkpoint draws the same masks as an uninterrupted one, so
// their checkpoints hold the same bytes (all but the run id and checksum).
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "support/checkpoint_content.h"
#include "support/test_io.h"
#include "support/test_models.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

using Run = napkin::testing::CommandResult;
Run sh(const std::string& command) { return napkin::testing::run_in_source_tree(command); }

const char* kDims = "batch=16,d_in=64,hidden=32";
const char* kData =
    "--data-file images=tests/e2e/data/mlp/images.npy --data-file labels=tests/e2e/data/mlp/labels.npy "
    "--init tests/e2e/data/mlp/init.safetensors";

std::string replaced(std::string text, const std::string& from, const std::string& to) {
  size_t at = text.find(from);
  REQUIRE_MESSAGE(at != std::string::npos, "models/mlp.yaml no longer has '" << from << "'");
  return text.replace(at, from.size(), to);
}

// models/mlp.yaml, with dropout on both hidden layers or without, and `optimizer`.
// Built at kDims into dir/trainer.
std::string build_mlp(bool dropout, const std::string& optimizer, const fs::path& dir) {
  std::string text = napkin::testing::read_source("models/mlp.yaml");
  if (dropout) {
    text = replaced(text, "- h1: gelu(images @ w1 + b1)", "- h1: dropout(gelu(images @ w1 + b1), 0.5)");
    text = replaced(text, "- h2: gelu(h1 @ w2 + b2)", "- h2: dropout(gelu(h1 @ w2 + b2), 0.3)");
  }
  text = replaced(text, "optimizer: adamw(lr=1e-3, weight_decay=0.01, no_decay=[\"b*\"])", "optimizer: " + optimizer);
  fs::create_directories(dir);
  std::ofstream(dir / "mlp.yaml") << text;
  std::string trainer = (dir / "trainer").string();
  Run r = sh(fmt::format("{} build {} --dims {} -o {} --quiet", NAPKIN_BINARY, (dir / "mlp.yaml").string(), kDims, trainer));
  INFO(r.out);
  REQUIRE(r.status == 0);
  return trainer;
}

// The metrics file's "loss" and "eval_loss" of step 1.
std::pair<double, double> losses_of_step_1(const fs::path& metrics) {
  double loss = NAN, eval = NAN;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    json j = json::parse(line);
    if (j["step"] != 1) continue;
    if (j.contains("loss")) loss = j["loss"];
    if (j.contains("eval_loss")) eval = j["eval_loss"];
  }
  return {loss, eval};
}

}  // namespace

TEST_CASE("e2e: dropout - the eval loss is the one of the same weights without dropout") {
  napkin::testing::TempDir tmp("e2e-dropout-eval");
  // lr 1e-30: the step leaves every weight as it was (each moves far less
  // than half an ulp; the zero biases move to ~1e-30, which no f32 sum of
  // products of the model's size notices), so both evals see the init weights.
  const std::string sgd = "sgd(lr=1e-30)";
  std::pair<double, double> got[2];
  for (int dropout = 0; dropout < 2; ++dropout) {
    fs::path dir = fs::path(tmp.path) / (dropout ? "dropout" : "plain");
    std::string trainer = build_mlp(dropout, sgd, dir);
    Run r = sh(fmt::format("{} {} --quiet --steps 1 --eval-every 1 --eval-batches 2 --metrics {}", trainer, kData,
                           (dir / "m.jsonl").string()));
    INFO(r.out);
    REQUIRE(r.status == 0);
    got[dropout] = losses_of_step_1(dir / "m.jsonl");
  }
  CAPTURE(got[0].first);
  CAPTURE(got[1].first);
  CHECK(got[1].first != got[0].first);    // the training forward drops
  CHECK(got[1].second == got[0].second);  // the eval forward does not
  CHECK(std::isfinite(got[0].second));
}

TEST_CASE("e2e: dropout - 3 steps + resume + 3 steps writes the same checkpoint tensors and metadata as 6 steps") {
  napkin::testing::TempDir tmp("e2e-dropout-resume");
  fs::path dir = tmp.path;
  const std::string adamw = "adamw(lr=1e-2)";
  std::string trainer = build_mlp(true, adamw, dir / "dropout");
  std::string common = fmt::format("{} {} --quiet", trainer, kData);
  auto run = [&](const std::string& args) {
    Run r = sh(common + " " + args);
    INFO(r.out);
    REQUIRE(r.status == 0);
  };
  run(fmt::format("--steps 6 --checkpoint-dir {} --checkpoint-every 6", (dir / "whole").string()));
  run(fmt::format("--steps 3 --checkpoint-dir {} --checkpoint-every 3", (dir / "split").string()));
  run(fmt::format("--steps 6 --resume {0} --checkpoint-dir {0} --checkpoint-every 3", (dir / "split").string()));
  // The same tensors and metadata; only the run id (and so the checksum) differs.
  std::string whole = napkin::testing::checkpoint_content((dir / "whole" / "step-000006.safetensors").string());
  std::string split = napkin::testing::checkpoint_content((dir / "split" / "step-000006.safetensors").string());
  REQUIRE(whole.size() > 10000);
  CHECK(whole == split);
}
