// What the data-parallel tests share (tests/e2e/data_parallel_test.cpp,
// sharded_checkpoint_test.cpp): trainers of a small GPT built for the whole
// batch and its half, mpirun as a test machine needs it, and comparisons of
// their losses and checkpoints.
#pragma once

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "support/test_io.h"
#include "support/test_models.h"

namespace napkin::testing::data_parallel {

using Run = napkin::testing::CommandResult;
inline Run sh(const std::string& command) { return napkin::testing::run_in_source_tree(command); }

inline constexpr const char* kDims = "seq=32,d=32,heads=2,layers=1";
inline constexpr const char* kData = "--data tests/e2e/data/gpt/tokens.u16 --threads 1 --log-every 1";

// mpirun with what a test machine needs: more ranks than cores, and root
// (CI runs as root) allowed.
inline std::string mpirun_launcher() {
  return fmt::format("mpirun --oversubscribe{}", ::geteuid() == 0 ? " --allow-run-as-root" : "");
}
inline std::string mpirun(int ranks) { return fmt::format("{} -np {}", mpirun_launcher(), ranks); }

// Two trainers of models/gpt.yaml (its checkpoint line removed: nothing
// here saves into the source tree): the global batch of 4 and the
// micro-batch of 2. `optimizer`: another optimizer line. AdamW, the model's,
// divides the gradient by its own running scale, so a gradient averaged
// with the wrong divisor would train the same; plain SGD would not.
struct Fixture {
  napkin::testing::TempDir tmp{"e2e-dp"};
  std::string whole = tmp / "gpt-b4", micro = tmp / "gpt-b2";
  explicit Fixture(const std::string& optimizer = "", const std::string& precision = "") {
    Run which = sh("command -v mpirun");
    INFO("mpirun (Open MPI) is needed for the data-parallel tests: apt-get install openmpi-bin (tools/setup.sh does)");
    REQUIRE(which.status == 0);
    std::string yaml = napkin::testing::read_source("models/gpt.yaml");
    const size_t at = yaml.find("  checkpoint: {");
    REQUIRE(at != std::string::npos);
    yaml.erase(at, yaml.find('\n', at) + 1 - at);
    auto replace_line = [&](const std::string& key, const std::string& value) {
      const size_t line = yaml.find("\n" + key + ": ");
      REQUIRE(line != std::string::npos);
      yaml.replace(line + 1, yaml.find('\n', line + 1) - line - 1, key + ": " + value);
    };
    if (!optimizer.empty()) replace_line("optimizer", optimizer);
    if (!precision.empty()) replace_line("precision", precision);
    napkin::testing::write_bytes(tmp / "gpt.yaml", yaml);
    for (auto [out, batch] : {std::pair{whole, 4}, std::pair{micro, 2}}) {
      Run r = sh(fmt::format("{} build {} --dims batch={},{} -o {} --quiet", NAPKIN_BINARY, tmp / "gpt.yaml", batch,
                             kDims, out));
      INFO(r.out);
      REQUIRE(r.status == 0);
    }
  }
  // Another trainer of the same model: `napkin build` with `flags` (e.g.
  // "--zero 3") at `batch`, written to NAME in the fixture's directory.
  std::string build(const std::string& name, int batch, const std::string& flags) const {
    const std::string out = tmp / name;
    Run r = sh(fmt::format("{} build {} --dims batch={},{} {} -o {} --quiet", NAPKIN_BINARY, tmp / "gpt.yaml", batch,
                           kDims, flags, out));
    INFO(r.out);
    REQUIRE(r.status == 0);
    return out;
  }
  // Runs `launcher trainer flags` writing metrics to NAME.jsonl; returns
  // the run (its output and status).
  Run train(const std::string& launcher, const std::string& trainer, const std::string& flags,
            const std::string& name) const {
    return sh(fmt::format("{} {} {} --metrics {} {}", launcher, trainer, kData, tmp / (name + ".jsonl"), flags));
  }
  // The per-step losses a run's metrics file holds, by step.
  std::vector<std::pair<int64_t, double>> losses(const std::string& name) const {
    std::vector<std::pair<int64_t, double>> out;
    std::istringstream lines(napkin::testing::read_bytes(tmp / (name + ".jsonl")));
    for (std::string line; std::getline(lines, line);) {
      nlohmann::json j = nlohmann::json::parse(line);
      if (j.contains("loss")) out.emplace_back(j.at("step").get<int64_t>(), j.at("loss").get<double>());
    }
    return out;
  }
  // A run that stopped (`first`) and was resumed (`then`): its losses, step by step.
  std::vector<std::pair<int64_t, double>> resumed_losses(const std::string& first, const std::string& then) const {
    std::vector<std::pair<int64_t, double>> out = losses(first), tail = losses(then);
    out.insert(out.end(), tail.begin(), tail.end());
    return out;
  }
};

// Every step's loss of `got` within `rel` of `want`'s (the same steps).
inline void check_losses_agree(const std::vector<std::pair<int64_t, double>>& got,
                        const std::vector<std::pair<int64_t, double>>& want, double rel) {
  REQUIRE(got.size() == want.size());
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    CHECK(got[i].first == want[i].first);
    worst = std::max(worst, std::fabs(got[i].second - want[i].second) / std::fabs(want[i].second));
  }
  INFO("largest relative difference " << worst);
  CHECK(worst <= rel);
}

// The tensors' bytes of a checkpoint: the data section after the header
// (the header holds the run id and the checksum, which differ between runs).
inline std::string checkpoint_data(const std::string& path) {
  std::string bytes = napkin::testing::read_bytes(path);
  REQUIRE(bytes.size() >= 8);
  uint64_t header = 0;
  std::memcpy(&header, bytes.data(), 8);
  return bytes.substr(8 + header);
}

// f32 arithmetic summed in another order: a few ulps per step, compounding
// over 20 steps of AdamW.
inline constexpr double kF32Agreement = 1e-5;


}  // namespace napkin::testing::data_parallel
