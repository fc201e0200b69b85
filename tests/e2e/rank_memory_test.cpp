// A rank's memory, predicted by the trainer before step 1 (runtime/rank_memory.h), and --memory-limit, which
// refuses a job whose prediction is over it (docs/distributed.md, "Memory per rank").
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "support/data_parallel_jobs.h"

namespace {

using napkin::testing::data_parallel::Fixture;
using napkin::testing::data_parallel::mpirun;
using napkin::testing::data_parallel::Run;
using napkin::testing::data_parallel::sh;

// A run's metrics record of each rank's memory: {measured peaks, predicted}.
std::pair<std::vector<double>, std::vector<double>> memory_record(const std::string& metrics) {
  std::istringstream lines(napkin::testing::read_bytes(metrics));
  for (std::string line; std::getline(lines, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains("predicted_resident_bytes"))
      return {j.at("peak_resident_bytes").get<std::vector<double>>(),
              j.at("predicted_resident_bytes").get<std::vector<double>>()};
  }
  FAIL("no memory record in " << metrics);
  return {};
}

double largest(const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); }

}  // namespace

TEST_CASE("memory per rank: a job over --memory-limit under plain data parallel is refused before step 1 with the "
          "numbers and the stage that fits, and trains under --zero 3 on 4 ranks (issue 40)") {
  // States that dominate a tiny batch: d=256, 2 layers, AdamW (1.7M parameters, 27 MiB of states).
  Fixture f;
  const std::string trainer = f.tmp / "gpt-zero3";
  Run built = sh(fmt::format("{} build {} --dims batch=2,seq=32,d=256,heads=2,layers=2 --zero 3 -o {} --quiet",
                             NAPKIN_BINARY, f.tmp / "gpt.yaml", trainer));
  INFO(built.out);
  REQUIRE(built.status == 0);

  // Each stage's prediction, from a run without a limit.
  Run plain = f.train(mpirun(4), trainer, "--steps 1 --zero 0", "plain");
  INFO(plain.out);
  REQUIRE(plain.status == 0);
  Run sharded = f.train(mpirun(4), trainer, "--steps 1 --zero 3", "sharded");
  INFO(sharded.out);
  REQUIRE(sharded.status == 0);
  const double plain_need = largest(memory_record(f.tmp / "plain.jsonl").second);
  const double sharded_need = largest(memory_record(f.tmp / "sharded.jsonl").second);
  // ZeRO-3 gives back 3/4 of the parameters and their optimizer state (20 MiB) and keeps a quarter of the f32
  // gradient sum (5 of 7 MiB less); the processes' own sizes differ between runs by far less.
  CHECK(plain_need - sharded_need > 20 * 1024 * 1024);
  const int64_t limit = static_cast<int64_t>((plain_need + sharded_need) / 2);

  Run refused = f.train(mpirun(4), trainer, fmt::format("--steps 2 --zero 0 --memory-limit {}", limit), "refused");
  INFO(refused.out);
  CHECK(refused.status == 1);
  CHECK(refused.out.find("over --memory-limit") != std::string::npos);
  CHECK(refused.out.find("under --zero 0 on 4 ranks") != std::string::npos);
  CHECK(refused.out.find("--zero 3 on 4 ranks needs") != std::string::npos);
  CHECK(refused.out.find("nothing was trained") != std::string::npos);
  CHECK(refused.out.find("step      1/") == std::string::npos);
  CHECK(!std::filesystem::exists(f.tmp / "refused.jsonl"));  // no metrics: nothing trained

  Run fits = f.train(mpirun(4), trainer, fmt::format("--steps 2 --zero 3 --memory-limit {}", limit), "fits");
  INFO(fits.out);
  CHECK(fits.status == 0);
  CHECK(f.losses("fits").size() == 2);
  // What it predicted is what it was held to, and the ranks measured no more than it and the processes' spread.
  const auto [peaks, predicted] = memory_record(f.tmp / "fits.jsonl");
  CHECK(largest(predicted) <= static_cast<double>(limit));
  for (size_t r = 0; r < peaks.size(); ++r) {
    CAPTURE(r);
    CHECK(peaks[r] == doctest::Approx(predicted[r]).epsilon(0.1));
  }
}
