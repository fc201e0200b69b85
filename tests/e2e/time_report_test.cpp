// What a trainer says about time (docs/runtime.md, "Time"): the banner's
// predicted step, progress lines whose MFU never exceeds 100% (a peak the run
// beats is called wrong instead), the end-of-run predicted vs measured line,
// --profile's table by kernel class and the predicted figures in the metrics
// file.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>

#include "analysis/devices.h"
#include "runtime/time_report.h"
#include "support/test_io.h"
#include "support/test_models.h"

namespace {

using Run = napkin::testing::CommandResult;
Run sh(const std::string& command) { return napkin::testing::run_in_source_tree(command); }

// The largest "MFU xx.x%" of the progress lines ("step N/M ..."); -1 when
// none prints a percentage.
double largest_mfu(const std::string& out) {
  double largest = -1;
  std::regex mfu(R"(^step .*MFU +([0-9.]+)%)", std::regex::multiline);
  for (auto it = std::sregex_iterator(out.begin(), out.end(), mfu); it != std::sregex_iterator(); ++it)
    largest = std::max(largest, std::stod((*it)[1]));
  return largest;
}

// A device file whose cpu row has the built-in figures but `fp32` FLOP/s.
std::string device_file_with_fp32(const napkin::testing::TempDir& tmp, double fp32) {
  napkin::analysis::Device cpu = *napkin::analysis::find_device("cpu");
  cpu.fp32_flops = fp32;
  cpu.sources["fp32"] = "made up by time_report_test";
  std::string path = tmp / "devices.json";
  napkin::testing::write_bytes(path, napkin::analysis::devices_to_json({cpu}));
  return path;
}

}  // namespace

TEST_CASE("mfu: a rate above the peak gives no percentage") {
  using napkin::runtime::mfu_of;
  CHECK(mfu_of(50, 100).known);
  CHECK(mfu_of(50, 100).fraction == 0.5);
  CHECK(mfu_of(100, 100).known);
  CHECK(mfu_of(101, 100).exceeded);
  CHECK_FALSE(mfu_of(101, 100).known);
  CHECK(napkin::runtime::mfu_text(mfu_of(101, 100)) == "> peak");
  CHECK_FALSE(mfu_of(50, 0).known);
  CHECK(napkin::runtime::mfu_text(mfu_of(50, 0)) == "  n/a");
  napkin::runtime::StepTimes t;
  for (double s : {5.0, 1.0, 2.0, 100.0}) t.add(s);
  CHECK(t.median() == 3.5);
  t.add(3.0);
  CHECK(t.median() == 3.0);
}

TEST_CASE("trainer time: the banner, every progress line and the end of a run compare prediction and measurement") {
  napkin::testing::TempDir tmp("e2e-time");
  std::string metrics = tmp / "metrics.jsonl";
  Run r = sh(fmt::format("NAPKIN_DEVICES= {} train models/gpt.yaml --dims batch=4,seq=32,d=32,heads=2,layers=1 -- --data tests/e2e/data/gpt/tokens.u16 --steps 6 --log-every 2 --checkpoint-every 0 "
                         "--metrics {} --profile",
                         NAPKIN_BINARY, metrics));
  INFO(r.out);
  REQUIRE(r.status == 0);
  CHECK(r.out.find("  predicted  ") != std::string::npos);
  CHECK(r.out.find("/step on cpu (time model") != std::string::npos);
  CHECK(r.out.find("  peak       ") != std::string::npos);
  CHECK(r.out.find("time: measured ") != std::string::npos);
  CHECK(r.out.find("measured/predicted ") != std::string::npos);
  CHECK(largest_mfu(r.out) > 0);  // progress lines print a percentage here
  CHECK(largest_mfu(r.out) <= 100);
  // --profile: the classes, then the kernels furthest from their prediction.
  CHECK(r.out.find("by kernel class, the largest gap first") != std::string::npos);
  CHECK(r.out.find("  matmul ") != std::string::npos);
  CHECK(r.out.find("  optimizer ") != std::string::npos);
  CHECK(r.out.find("the kernels furthest from their prediction") != std::string::npos);
  CHECK(r.out.find("models/gpt.yaml:") != std::string::npos);

  std::istringstream lines(napkin::testing::read_bytes(metrics));
  std::string line;
  int steps = 0, summaries = 0, profiles = 0;
  while (std::getline(lines, line)) {
    nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains("run")) continue;  // the run's first record: its id and start step
    if (j.contains("profile")) {      // --profile's kernel times: one a kernel, in ms per step
      ++profiles;
      CHECK(j["steps"] == 6);
      CHECK(j["kernel_ms"].size() > 10);
      for (const auto& ms : j["kernel_ms"]) CHECK(ms.get<double>() >= 0);
      continue;
    }
    if (j.contains("summary")) {
      ++summaries;
      CHECK(j["steps"] == 6);
      CHECK(j["predicted_step_ms"].get<double>() > 0);
      CHECK(j["measured_step_ms"].get<double>() > 0);
      CHECK(j["peak_exceeded"] == false);
      continue;
    }
    ++steps;
    CHECK(j["predicted_step_ms"].get<double>() > 0);
    CHECK(j["predicted_mfu"].get<double>() > 0);
    CHECK(j["predicted_mfu"].get<double>() <= 1);
    if (!j["mfu"].is_null()) CHECK(j["mfu"].get<double>() <= 1);
  }
  CHECK(steps == 3);
  CHECK(profiles == 1);
  CHECK(summaries == 1);
}

TEST_CASE("trainer time: a peak the run beats is called wrong, never printed as an MFU over 100%") {
  napkin::testing::TempDir tmp("e2e-time-peak");
  // 1 MFLOP/s: any real run is far above it.
  std::string devices = device_file_with_fp32(tmp, 1e6);
  std::string metrics = tmp / "metrics.jsonl";
  Run r = sh(fmt::format("NAPKIN_DEVICES={} {} train models/gpt.yaml --dims batch=4,seq=32,d=32,heads=2,layers=1 -- --data tests/e2e/data/gpt/tokens.u16 --steps 4 --log-every 1 --checkpoint-every 0 "
                         "--metrics {}",
                         devices, NAPKIN_BINARY, metrics));
  INFO(r.out);
  REQUIRE(r.status == 0);
  CHECK(largest_mfu(r.out) == -1);  // no percentage at all
  CHECK(r.out.find("MFU > peak") != std::string::npos);
  CHECK(r.out.find("that peak is wrong for this machine") != std::string::npos);
  CHECK(r.out.find("made up by time_report_test") != std::string::npos);  // where the wrong peak came from
  CHECK(r.out.find("napkin devices --measure") != std::string::npos);
  std::istringstream lines(napkin::testing::read_bytes(metrics));
  std::string line;
  while (std::getline(lines, line)) {
    nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains("summary")) CHECK(j["peak_exceeded"] == true);
    else CHECK(j["mfu"].is_null());
  }
}
