// The trainer's --metrics file: JSON lines, one record (a JSON object) per
// run start, logged step, evaluation and end-of-run summary (docs/runtime.md
// lists the records; `napkin plot` draws them).
//
// Every record is built by MetricsRecord, so every number in the file is
// valid JSON: a NaN or infinite value (an eval loss of NaN, a rate over a
// zero time), which JSON cannot spell, is written as null, as is a value the
// run does not know (pass kUnknown). `napkin plot` reads null as "no value".
//
// The file is appended to, never truncated: a resumed run, or a second run
// given the same file, adds its records after the ones already there, each
// run starting with {"run": ID, "start_step": N} (report/plot.h tells the
// runs of a file apart by it).
#pragma once

#include <fstream>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

namespace napkin::runtime {

// A number the run has no value for (no peak, so no MFU): written as null.
constexpr double kUnknown = std::numeric_limits<double>::quiet_NaN();

// One JSON object, its fields in the order they are added. Keys are plain
// ASCII names (the trainer's own), written as they are.
class MetricsRecord {
 public:
  // `decimals` digits after the point ("12.3456" for 4).
  MetricsRecord& fixed(std::string_view key, double value, int decimals);
  // `digits` significant digits, the shortest form ("2.71828183", "1e-05").
  MetricsRecord& general(std::string_view key, double value, int digits);
  MetricsRecord& integer(std::string_view key, long long value);
  MetricsRecord& boolean(std::string_view key, bool value);
  MetricsRecord& text(std::string_view key, const std::string& value);  // escaped as JSON needs
  // A list of numbers with `decimals` digits after the point.
  MetricsRecord& fixed_list(std::string_view key, const std::vector<double>& values, int decimals);

  // A list of numbers with `digits` significant digits each, as general().
  MetricsRecord& general_list(std::string_view key, const std::vector<double>& values, int digits);
  // A nested object: `inner`'s fields under `key`.
  MetricsRecord& object(std::string_view key, const MetricsRecord& inner);

  // The record as one line of JSON, without the newline.
  std::string str() const { return "{" + fields_ + "}"; }

 private:
  void key(std::string_view name);
  std::string fields_;
};

class MetricsFile {
 public:
  // Opens `path` for appending (its directory created first); an empty path
  // writes nothing. Error when the file cannot be opened.
  explicit MetricsFile(const std::string& path);
  // Appends the record as one line and flushes it, so a run that is killed
  // loses no record it wrote.
  void write(const MetricsRecord& record);

 private:
  std::ofstream file_;
};

}  // namespace napkin::runtime
