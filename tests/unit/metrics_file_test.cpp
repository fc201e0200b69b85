// The trainer's metrics file (runtime/metrics_file.h): every record is one
// line of valid JSON, whatever the numbers (a NaN eval loss is null, not
// "-nan"), and the file is appended to, never truncated.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>

#include "runtime/metrics_file.h"
#include "support/test_io.h"

namespace rt = napkin::runtime;

TEST_CASE("metrics file: numbers that are not finite or not known are written as null - valid JSON every line") {
  const double inf = std::numeric_limits<double>::infinity();
  const rt::MetricsRecord r = rt::MetricsRecord()
                                  .integer("step", 7)
                                  .general("loss", 2.718281828459, 9)
                                  .general("eval_loss", -std::nan(""), 9)
                                  .fixed("step_ms", 12.34567, 4)
                                  .fixed("tokens_per_s", inf, 1)
                                  .fixed("mfu", rt::kUnknown, 4)
                                  .boolean("summary", true)
                                  .text("run", "a\"b\\c")
                                  .fixed_list("bytes", {1024, -inf}, 0);
  CHECK(r.str() ==
        R"({"step": 7, "loss": 2.71828183, "eval_loss": null, "step_ms": 12.3457, "tokens_per_s": null, "mfu": null, )"
        R"("summary": true, "run": "a\"b\\c", "bytes": [1024, null]})");
  const nlohmann::json j = nlohmann::json::parse(r.str());
  CHECK(j["eval_loss"].is_null());
  CHECK(j["run"] == "a\"b\\c");
}

TEST_CASE("metrics file: appended to, never truncated - its directory is created") {
  napkin::testing::TempDir tmp("metrics-file");
  const std::string path = tmp / "sub/m.jsonl";
  rt::MetricsFile(path).write(rt::MetricsRecord().integer("step", 1));
  rt::MetricsFile(path).write(rt::MetricsRecord().integer("step", 2));
  rt::MetricsFile("").write(rt::MetricsRecord().integer("step", 3));  // no path: nothing written
  CHECK(napkin::testing::read_bytes(path) == "{\"step\": 1}\n{\"step\": 2}\n");
}
