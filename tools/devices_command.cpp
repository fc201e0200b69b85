#include "tools/devices_command.h"

#include "analysis/distributed.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "ir/text.h"
#include "tools/files.h"
#include "tools/measure_device.h"

namespace napkin::tools {

namespace fs = std::filesystem;

namespace {

constexpr double kMiB = 1024.0 * 1024.0;
constexpr double kGiB = kMiB * 1024.0;

std::string format_bytes(double bytes) {
  if (bytes >= kGiB) return fmt::format("{:.4g} bytes ({:.1f} GiB)", bytes, bytes / kGiB);
  if (bytes > 0) return fmt::format("{:.4g} bytes ({:.1f} MiB)", bytes, bytes / kMiB);
  return "0";
}

std::string format_flops(double flops) {
  if (flops >= 1e12) return fmt::format("{:.4g} TFLOP/s", flops / 1e12);
  if (flops > 0) return fmt::format("{:.4g} GFLOP/s", flops / 1e9);
  return "0 (none)";
}

std::string format_curve(const analysis::GemmEfficiency& curve) {
  std::vector<std::string> points;
  for (const auto& [dim, fraction] : curve) points.push_back(fmt::format("{:g}: {:.3f}", dim, fraction));
  return fmt::format("{}", fmt::join(points, ", "));
}

// One figure's value for people: units, and the curves by dtype.
std::string format_figure(const analysis::Device& d, const std::string& name) {
  // What 0 means to the time model (analysis/devices.h).
  if (name == "cache_bytes" && d.cache_bytes == 0) return "0 (no cache level modelled)";
  if (name == "loop_flops" && d.loop_flops == 0) return "0 (loops at the vector peak)";
  if (name == "transcendental_rate")
    return d.transcendental_rate > 0 ? fmt::format("{:.3g} G/s", d.transcendental_rate / 1e9) : "0 (not modelled)";
  if (name == "memory" || name == "cache_bytes") return format_bytes(analysis::figure_value(d, name));
  if (name == "bandwidth" || name == "cache_bandwidth") {
    double v = analysis::figure_value(d, name);
    return v > 0 ? fmt::format("{:.4g} GB/s", v / 1e9) : "0";
  }
  if (name == "launch_seconds") {
    double v = d.launch_seconds;
    return v > 0 ? fmt::format("{:.3g} us", v * 1e6) : "0";
  }
  if (name == "gemm_efficiency") {
    if (d.gemm_efficiency.empty()) return "none (every GEMM at the peak)";
    std::vector<std::string> curves;
    for (const auto& [dtype, curve] : d.gemm_efficiency) curves.push_back(fmt::format("{} {{{}}}", dtype, format_curve(curve)));
    return fmt::format("{}", fmt::join(curves, "; "));
  }
  return format_flops(analysis::figure_value(d, name));
}

// Every figure of `d` with its value, and below it its source unless that
// is the row's. A measured figure's source ("measured by ... on HOST, DATE,
// N threads: how") is printed without the part before the colon when the
// row's source starts with it.
void print_sources(const analysis::Device& d) {
  std::string origin = analysis::local_origin(d);
  std::cout << fmt::format("{}{}\n", d.name, origin.empty() ? " (built in)" : " (from " + origin + ")");
  std::cout << fmt::format("  {:<16} {}\n", "description", d.description);
  std::cout << fmt::format("  {:<16} {}\n", "source", d.source);
  for (const std::string& name : analysis::figure_names()) {
    std::cout << fmt::format("  {:<16} {}\n", name, format_figure(d, name));
    std::string source = d.source_of(name);
    if (source == d.source) continue;  // said once, above
    const size_t colon = source.find(": ");
    if (source.rfind("measured by", 0) == 0 && colon != std::string::npos && d.source.rfind(source.substr(0, colon), 0) == 0)
      source = source.substr(colon + 2);
    std::cout << fmt::format("  {:<16}   {}\n", "", source);
  }
}

void print_table() {
  std::cout << fmt::format("device table v{} (dense peaks; FLOP/s)\n", analysis::kDeviceTableVersion);
  std::cout << fmt::format("{:<6} {:>10} {:>10} {:>10} {:>10} {:>10} {:>12} {:>10}  {}\n", "name", "fp32", "tf32",
                           "bf16", "fp16", "fp8", "bandwidth", "memory", "description");
  const std::vector<analysis::Device> devices = analysis::known_devices();
  for (const analysis::Device& d : devices)
    std::cout << fmt::format("{:<6} {:>10.4g} {:>10.4g} {:>10.4g} {:>10.4g} {:>10.4g} {:>10.4g}/s {:>10.4g}  {}\n", d.name,
                             d.fp32_flops, d.tf32_flops, d.bf16_flops, d.fp16_flops, d.fp8_flops,
                             d.bandwidth_bytes_per_s, d.memory_bytes, d.description);
  std::cout << "\nsources (napkin devices --sources: every figure and its source)\n";
  for (const analysis::Device& d : devices) {
    std::string origin = analysis::local_origin(d);
    std::cout << fmt::format("{:<6} {}{}\n", d.name, d.source,
                             origin.empty() ? "" : fmt::format(" [local device file {}]", origin));
  }
  std::cout << "\ninterconnects (napkin report --ranks N --interconnect NAME; per rank, each way)\n";
  for (const analysis::Interconnect& i : analysis::builtin_interconnects())
    std::cout << fmt::format("{:<8} {:>8.4g} GB/s {:>6.3g} us a ring step  {}\n    {}\n", i.name, i.bytes_per_s / 1e9,
                             i.latency_s * 1e6, i.description, i.source);
}

void print_all_sources() {
  std::cout << fmt::format("device table v{}: every figure and where it comes from\n", analysis::kDeviceTableVersion);
  for (const analysis::Device& d : analysis::known_devices()) {
    std::cout << "\n";
    print_sources(d);
  }
  for (const analysis::Interconnect& i : analysis::builtin_interconnects()) {
    std::cout << fmt::format("\n{} (interconnect, built in)\n", i.name);
    std::cout << fmt::format("  {:<16} {}\n", "description", i.description);
    std::cout << fmt::format("  {:<16} {:.4g} GB/s each way\n", "bandwidth", i.bytes_per_s / 1e9);
    std::cout << fmt::format("  {:<16} {:.3g} us a ring step\n", "latency", i.latency_s * 1e6);
    std::cout << fmt::format("  {:<16} {}\n", "source", i.source);
  }
}

std::string read_file(const std::string& path, bool* ok) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  *ok = !in.bad() && in.is_open();
  return text.str();
}

// Whether `text` claims to be a napkin device file, readable or not: a JSON
// object with the format tag, or text naming it (a file cut short).
bool claims_device_format(const std::string& text) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_object() && j.contains("format")) return j["format"] == "napkin-devices-1";
  return text.find("\"napkin-devices-1\"") != std::string::npos;
}

// The rows of the device file at `path` that a measured row joins: none for
// a missing or blank file or for a device file napkin cannot read any more
// (`note` says what was wrong with it). Returns why the file must not be
// replaced, or "".
std::string rows_to_keep(const std::string& path, std::vector<analysis::Device>* rows, std::string* note) {
  rows->clear();
  std::error_code ec;
  fs::file_status status = fs::status(path, ec);
  if (fs::is_directory(status))
    return fmt::format("{}: is a directory; name the device file to write, e.g. {}/devices.json", path, path);
  if (!fs::exists(status)) return "";
  if (!fs::is_regular_file(status))
    return fmt::format("{}: is not a regular file; refusing to replace it with a device file", path);
  bool ok = false;
  const std::string text = read_file(path, &ok);
  if (!ok) return fmt::format("{}: cannot read it to keep its other rows", path);
  if (std::all_of(text.begin(), text.end(), [](unsigned char c) { return std::isspace(c); })) return "";
  try {
    *rows = analysis::devices_from_json(text, path);
  } catch (const std::exception& e) {
    if (!claims_device_format(text))
      return fmt::format("{}: is not a napkin device file (no \"format\": \"napkin-devices-1\"); refusing to "
                         "overwrite it: remove it or name another --out",
                         path);
    // A device file napkin cannot read (an older napkin's, a bad hand edit)
    // stops every command; measuring again is the way out.
    *note = fmt::format("replaced a device file napkin could not read ({})", e.what());
  }
  return "";
}

}  // namespace

std::string write_device_row(const std::string& path, const analysis::Device& measured, std::string* note) {
  std::vector<analysis::Device> rows;
  if (std::string error = rows_to_keep(path, &rows, note); !error.empty()) return error;
  auto same = std::find_if(rows.begin(), rows.end(), [&](const analysis::Device& d) { return ir::iequals(d.name, measured.name); });
  if (same != rows.end()) *same = measured;
  else rows.push_back(measured);

  // Write through a symbolic link (a dotfiles checkout), not over it.
  std::error_code ec;
  std::string target = path;
  if (fs::is_symlink(fs::symlink_status(path, ec))) {
    target = fs::canonical(path, ec).string();
    if (ec) return fmt::format("{}: cannot resolve the link ({})", path, ec.message());
  }
  fs::path parent = fs::path(target).parent_path();
  if (!parent.empty() && !fs::exists(parent, ec)) {
    fs::create_directories(parent, ec);
    if (ec) return fmt::format("{}: cannot create its directory {} ({})", path, parent.string(), ec.message());
  }
  return write_atomically(target, analysis::devices_to_json(rows));
}

namespace {

int measure(const DevicesArgs& args) {
  const std::string path = args.out.empty() ? analysis::local_device_file() : args.out;
  if (path.empty()) {
    std::cerr << "error: no device file to write: $NAPKIN_DEVICES is set but empty (or $HOME is unset); name one with "
                 "--out FILE\n";
    return 1;
  }
  // Refuse a bad destination before a minute of measuring (and again when
  // writing: the file may change meanwhile).
  {
    std::vector<analysis::Device> rows;
    std::string note;
    if (std::string error = rows_to_keep(path, &rows, &note); !error.empty()) {
      std::cerr << "error: " << error << "\n";
      return 1;
    }
  }

  MeasureOptions options;
  options.threads = args.threads;
  options.quick = args.quick;
  options.progress = [](const std::string& line) { std::cerr << "  " << line << "\n"; };
  std::cerr << fmt::format("measuring this host{} (napkin's GEMM, triad, loop and thread pool; {}) ...\n",
                           args.quick ? " quickly" : "", args.quick ? "a few seconds" : "20 s to a minute");
  auto start = std::chrono::steady_clock::now();
  analysis::Device measured = measure_host(options);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  std::string note;
  std::string error = write_device_row(path, measured, &note);
  if (!error.empty()) {
    std::cerr << "error: " << error << "\n";
    return 1;
  }
  // Print the row as the file now holds it (so `from FILE` is right).
  if (std::string load = analysis::use_local_devices(path); !load.empty()) {
    std::cerr << "error: " << load << "\n";
    return 1;
  }
  print_sources(*analysis::find_device(measured.name));
  if (!note.empty()) std::cout << "note: " << note << "\n";
  std::cout << fmt::format("measured in {:.1f} s; wrote the {} row to {}\n", seconds, measured.name, path);
  return 0;
}

}  // namespace

int cmd_devices(const DevicesArgs& args) {
  if (args.measure) return measure(args);
  if (args.sources) print_all_sources();
  else print_table();
  return 0;
}

}  // namespace napkin::tools
