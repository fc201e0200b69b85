#include "runtime/metrics_file.h"

#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "runtime/error.h"

namespace napkin::runtime {

namespace {

// JSON has no NaN or infinity: a number that is not finite is null.
std::string json_number(double value, const char* spec, int precision) {
  return std::isfinite(value) ? fmt::format(fmt::runtime(spec), value, precision) : std::string("null");
}

}  // namespace

void MetricsRecord::key(std::string_view name) {
  if (!fields_.empty()) fields_ += ", ";
  fields_ += fmt::format("\"{}\": ", name);
}

MetricsRecord& MetricsRecord::fixed(std::string_view name, double value, int decimals) {
  key(name);
  fields_ += json_number(value, "{:.{}f}", decimals);
  return *this;
}

MetricsRecord& MetricsRecord::general(std::string_view name, double value, int digits) {
  key(name);
  fields_ += json_number(value, "{:.{}g}", digits);
  return *this;
}

MetricsRecord& MetricsRecord::integer(std::string_view name, long long value) {
  key(name);
  fields_ += std::to_string(value);
  return *this;
}

MetricsRecord& MetricsRecord::boolean(std::string_view name, bool value) {
  key(name);
  fields_ += value ? "true" : "false";
  return *this;
}

MetricsRecord& MetricsRecord::text(std::string_view name, const std::string& value) {
  key(name);
  fields_ += nlohmann::json(value).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return *this;
}

MetricsRecord& MetricsRecord::fixed_list(std::string_view name, const std::vector<double>& values, int decimals) {
  key(name);
  fields_ += "[";
  for (size_t i = 0; i < values.size(); ++i) fields_ += (i ? ", " : "") + json_number(values[i], "{:.{}f}", decimals);
  fields_ += "]";
  return *this;
}

MetricsRecord& MetricsRecord::general_list(std::string_view name, const std::vector<double>& values, int digits) {
  key(name);
  fields_ += "[";
  for (size_t i = 0; i < values.size(); ++i) fields_ += (i ? ", " : "") + json_number(values[i], "{:.{}g}", digits);
  fields_ += "]";
  return *this;
}

MetricsRecord& MetricsRecord::object(std::string_view name, const MetricsRecord& inner) {
  key(name);
  fields_ += inner.str();
  return *this;
}

MetricsFile::MetricsFile(const std::string& path) {
  if (path.empty()) return;
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  std::error_code ec;
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  file_.open(path, std::ios::app);
  if (!file_) throw Error(path + ": cannot open the metrics file for appending");
}

void MetricsFile::write(const MetricsRecord& record) {
  if (!file_.is_open()) return;
  file_ << record.str() << '\n';
  file_.flush();
}

}  // namespace napkin::runtime
