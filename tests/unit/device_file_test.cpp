// The local device file (napkin-devices-1): what devices_from_json refuses,
// the round trip, where the file lives, how its rows replace the built-in
// ones, and the GEMM efficiency curve's interpolation.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>

#include "analysis/devices.h"
#include "support/test_io.h"

using napkin::ir::DType;
namespace analysis = napkin::analysis;

namespace {

// One row: memory, bandwidth and fp32 (which every row needs) plus `figures`
// (JSON object members).
std::string device_row(const std::string& name, const std::string& figures = "", double fp32 = 1e11) {
  return fmt::format(R"({{"name": "{}", "description": "a test row", "source": "a test", "figures": {{
      "memory": {{"value": 1e9, "source": "test"}},
      "bandwidth": {{"value": 1e10, "source": "test"}},
      "fp32": {{"value": {}, "source": "test"}}{}{} }}}})",
                     name, fp32, figures.empty() ? "" : ", ", figures);
}

std::string file_of(const std::string& rows) { return R"({"format": "napkin-devices-1", "devices": [)" + rows + "]}"; }

// A file with one row, "tpu".
std::string device_file(const std::string& figures) { return file_of(device_row("tpu", figures)); }

// The message devices_from_json throws for `text`, or "(no error)".
std::string parse_error(const std::string& text) {
  try {
    analysis::devices_from_json(text, "/x/devices.json");
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "(no error)";
}

// Sets an environment variable for a scope and restores it after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) setenv(name, value, 1);
    else unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_) setenv(name_, old_->c_str(), 1);
    else unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

}  // namespace

TEST_CASE("device file: a valid row reads back with its figures and sources") {
  auto rows = analysis::devices_from_json(
      device_file(R"("bf16": {"value": 2e11, "source": "measured"},
                     "gemm_efficiency": {"value": {"f32": [[1, 0.1], [64, 0.8]]}, "source": "curve"})"),
      "/x/devices.json");
  REQUIRE(rows.size() == 1);
  CHECK(rows[0].name == "tpu");
  CHECK(rows[0].description == "a test row");
  CHECK(rows[0].bf16_flops == 2e11);
  CHECK(rows[0].source_of("bf16") == "measured");
  CHECK(rows[0].source_of("gemm_efficiency") == "curve");
  CHECK(rows[0].source_of("fp8") == "a test");  // not in the file: the row's source
  REQUIRE(rows[0].gemm_efficiency.count("f32") == 1);
  CHECK(rows[0].gemm_efficiency.at("f32") == analysis::GemmEfficiency{{1, 0.1}, {64, 0.8}});
}

TEST_CASE("device file: unknown figures, missing sources and bad values are refused, naming the file") {
  CHECK(parse_error(device_file(R"("warp_speed": {"value": 1, "source": "x"})")) ==
        "/x/devices.json: device 'tpu': unknown figure 'warp_speed' (known: memory, bandwidth, fp64, fp32, tf32, "
        "bf16, fp16, fp8, cache_bytes, cache_bandwidth, loop_flops, transcendental_rate, launch_seconds, gemm_efficiency)");
  const std::string needs_source = "/x/devices.json: device 'tpu': figure 'bf16' needs a \"value\" and a non-empty \"source\"";
  CHECK(parse_error(device_file(R"("bf16": {"value": 1})")) == needs_source);
  CHECK(parse_error(device_file(R"("bf16": {"value": 1, "source": ""})")) == needs_source);
  CHECK(parse_error(device_file(R"("bf16": {"source": "x"})")) == needs_source);
  CHECK(parse_error(device_file(R"("bf16": 1)")) == needs_source);
  const std::string bad_number = "/x/devices.json: device 'tpu': figure 'bf16' must be a finite number >= 0";
  CHECK(parse_error(device_file(R"("bf16": {"value": -1, "source": "x"})")) == bad_number);
  CHECK(parse_error(device_file(R"("bf16": {"value": "fast", "source": "x"})")) == bad_number);
  CHECK(parse_error(device_file(R"("memory": {"value": 0, "source": "x"})")) ==
        "/x/devices.json: device 'tpu': needs memory, bandwidth and fp32 greater than 0");
}

TEST_CASE("device file: a GEMM efficiency curve must ascend in dim with fractions above 0 and at most 1") {
  auto curve = [](const std::string& points) {
    return parse_error(device_file(
        fmt::format(R"("gemm_efficiency": {{"value": {{"f32": {}}}, "source": "x"}})", points)));
  };
  const std::string bad =
      "/x/devices.json: device 'tpu': gemm_efficiency 'f32' must be [[dim, fraction], ...] with dims >= 1 ascending "
      "and fractions in (0, 1]";
  CHECK(curve("[[1, 0.5], [8, 0.9]]") == "(no error)");
  CHECK(curve("[]") == "(no error)");
  CHECK(curve("[[8, 0.5], [1, 0.9]]") == bad);  // descending
  CHECK(curve("[[8, 0.5], [8, 0.9]]") == bad);  // repeated dim
  CHECK(curve("[[1, 0]]") == bad);
  CHECK(curve("[[1, 1.5]]") == bad);
  CHECK(curve("[[0.5, 0.5]]") == bad);
  CHECK(curve("[[1, 0.5, 3]]") == bad);
  CHECK(curve("[1, 0.5]") == bad);
  CHECK(curve("{\"1\": 0.5}") == bad);
  CHECK(parse_error(device_file(R"("gemm_efficiency": {"value": [[1, 0.5]], "source": "x"})")) ==
        "/x/devices.json: device 'tpu': gemm_efficiency's value maps a dtype to [[dim, fraction], ...]");
}

TEST_CASE("device file: what is not a device file is refused") {
  CHECK(parse_error("").find("/x/devices.json: not a device file") == 0);
  CHECK(parse_error("{\"format\": \"napkin-devices-1\", \"devices\": [] ").find("/x/devices.json: not a device file") == 0);
  CHECK(parse_error("[]") == "/x/devices.json: not a device file (expected an object with \"format\": \"napkin-devices-1\")");
  CHECK(parse_error(R"({"format": "napkin-devices-2", "devices": []})") ==
        "/x/devices.json: not a device file (expected an object with \"format\": \"napkin-devices-1\")");
  CHECK(parse_error(R"({"format": "napkin-devices-1"})") == "/x/devices.json: \"devices\" must be an array");
  CHECK(parse_error(R"({"format": "napkin-devices-1", "devices": [{"figures": {}}]})") ==
        "/x/devices.json: devices[0]: needs a non-empty \"name\"");
  CHECK(parse_error(R"({"format": "napkin-devices-1", "devices": [{"name": "tpu"}]})") ==
        "/x/devices.json: device 'tpu': needs \"figures\"");
  CHECK(parse_error(R"({"format": "napkin-devices-1", "devices": []})") == "(no error)");
}

TEST_CASE("device file: the built-in table survives a round trip through the file format") {
  const std::vector<analysis::Device>& table = analysis::builtin_devices();
  std::vector<analysis::Device> back = analysis::devices_from_json(analysis::devices_to_json(table), "round trip");
  REQUIRE(back.size() == table.size());
  for (size_t i = 0; i < table.size(); ++i) {
    CAPTURE(table[i].name);
    CHECK(back[i].name == table[i].name);
    CHECK(back[i].description == table[i].description);
    CHECK(back[i].source == table[i].source);
    CHECK(back[i].gemm_efficiency == table[i].gemm_efficiency);
    for (const std::string& figure : analysis::figure_names()) {
      CAPTURE(figure);
      CHECK(analysis::figure_value(back[i], figure) == analysis::figure_value(table[i], figure));
      CHECK(back[i].source_of(figure) == table[i].source_of(figure));
    }
  }
}

TEST_CASE("device file: it lives at NAPKIN_DEVICES, else XDG_CONFIG_HOME, else HOME/.config") {
  {
    ScopedEnv devices("NAPKIN_DEVICES", "/a/mine.json"), xdg("XDG_CONFIG_HOME", "/b"), home("HOME", "/c");
    CHECK(analysis::local_device_file() == "/a/mine.json");
  }
  {
    ScopedEnv devices("NAPKIN_DEVICES", ""), xdg("XDG_CONFIG_HOME", "/b"), home("HOME", "/c");
    CHECK(analysis::local_device_file() == "");  // set but empty: no file at all
  }
  {
    ScopedEnv devices("NAPKIN_DEVICES", nullptr), xdg("XDG_CONFIG_HOME", "/b"), home("HOME", "/c");
    CHECK(analysis::local_device_file() == "/b/napkin/devices.json");
  }
  {
    ScopedEnv devices("NAPKIN_DEVICES", nullptr), xdg("XDG_CONFIG_HOME", ""), home("HOME", "/c");
    CHECK(analysis::local_device_file() == "/c/.config/napkin/devices.json");
  }
  {
    ScopedEnv devices("NAPKIN_DEVICES", nullptr), xdg("XDG_CONFIG_HOME", nullptr), home("HOME", nullptr);
    CHECK(analysis::local_device_file() == "");
  }
}

TEST_CASE("device file: its rows replace the built-in row of the same name and add new ones") {
  napkin::testing::TempDir dir("device-file");
  const std::string path = dir / "devices.json";
  napkin::testing::write_bytes(path, file_of(device_row("tpu") + ", " + device_row("CPU", "", 4e9)));
  REQUIRE(analysis::use_local_devices(path) == "");
  REQUIRE(analysis::find_device("tpu") != nullptr);
  CHECK(analysis::local_origin(*analysis::find_device("tpu")) == path);
  REQUIRE(analysis::find_device("cpu") != nullptr);
  CHECK(analysis::find_device("cpu")->fp32_flops == 4e9);
  CHECK(analysis::local_origin(*analysis::find_device("cpu")) == path);
  CHECK(analysis::local_origin(*analysis::find_device("h100")) == "");
  CHECK(analysis::known_device_names().find("tpu") != std::string::npos);
  CHECK(analysis::known_devices().size() == 5);  // "CPU" replaced the built-in "cpu"

  // A missing file is no error at the default place, but is when
  // NAPKIN_DEVICES names it; a malformed one always is, naming the file.
  CHECK(analysis::use_local_devices(dir / "absent.json") == "");
  CHECK(analysis::find_device("tpu") == nullptr);  // the old rows are gone
  {
    ScopedEnv devices("NAPKIN_DEVICES", (dir / "absent.json").c_str());
    CHECK(analysis::use_local_devices(dir / "absent.json") ==
          dir / "absent.json: no such device file (named by $NAPKIN_DEVICES; set it empty for none)");
  }
  napkin::testing::write_bytes(path, "{\"format\": \"napkin-devices-1\", \"devices\": [{\"name\": \"x\"}]}");
  CHECK(analysis::use_local_devices(path) == path + ": device 'x': needs \"figures\"");
  CHECK(analysis::use_local_devices("") == "");
  CHECK(analysis::find_device("cpu")->fp32_flops == analysis::builtin_devices()[3].fp32_flops);
}

TEST_CASE("device file: GEMM efficiency interpolates linearly in log2 of the narrowest dim") {
  analysis::Device d;
  d.gemm_efficiency["f32"] = {{1, 0.1}, {16, 0.5}, {256, 0.9}};
  CHECK(analysis::gemm_efficiency(d, DType::F32, 0.5) == doctest::Approx(0.1));  // below the first point: the first
  CHECK(analysis::gemm_efficiency(d, DType::F32, 1) == doctest::Approx(0.1));
  CHECK(analysis::gemm_efficiency(d, DType::F32, 4) == doctest::Approx(0.3));    // log2 4 = 2 of 0..4
  CHECK(analysis::gemm_efficiency(d, DType::F32, 16) == doctest::Approx(0.5));
  CHECK(analysis::gemm_efficiency(d, DType::F32, 64) == doctest::Approx(0.7));   // log2 64 = 6 of 4..8
  CHECK(analysis::gemm_efficiency(d, DType::F32, 128) == doctest::Approx(0.8));
  CHECK(analysis::gemm_efficiency(d, DType::F32, 256) == doctest::Approx(0.9));
  CHECK(analysis::gemm_efficiency(d, DType::F32, 4096) == doctest::Approx(0.9));  // above the last: the last
  CHECK(analysis::gemm_efficiency(d, DType::BF16, 1) == 1);                       // no curve for bf16: 1
  d.gemm_efficiency["bf16"] = {};
  CHECK(analysis::gemm_efficiency(d, DType::BF16, 1) == 1);  // an empty curve: 1
}
