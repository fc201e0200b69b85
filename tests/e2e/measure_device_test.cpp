// `napkin devices --measure` end to end: the file it writes, what napkin then
// reads from it, and the errors around it. Every run writes into a temporary
// directory (--out, NAPKIN_DEVICES): never ~/.config, never the source tree.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "analysis/devices.h"
#include "runtime/gemm.h"
#include "runtime/thread_pool.h"
#include "support/test_io.h"

namespace fs = std::filesystem;
namespace analysis = napkin::analysis;

namespace {

using napkin::testing::read_bytes;
using napkin::testing::write_bytes;
using Run = napkin::testing::CommandResult;

// napkin with NAPKIN_DEVICES set to `devices` ("" for none), and
// XDG_CACHE_HOME to `cache` when given.
Run napkin_with(const std::string& devices, const std::string& args, const std::string& cache = "") {
  return napkin::testing::run_in_source_tree(fmt::format("{}NAPKIN_DEVICES='{}' {} {}",
                                                         cache.empty() ? "" : "XDG_CACHE_HOME='" + cache + "' ",
                                                         devices, NAPKIN_BINARY, args));
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// fp32 GFLOP/s of one runtime::Gemm 1024^3 in a pool of the default size:
// the best of a few runs, as a check on the peak napkin measured.
double independent_fp32_flops() {
  napkin::runtime::ThreadPool pool;
  napkin::runtime::Gemm gemm(napkin::runtime::MatmulDesc::plain(1024, 1024, 1024));
  std::vector<float> a(1024 * 1024, 0.5f), b(1024 * 1024, 0.25f), c(1024 * 1024);
  gemm.run(a.data(), b.data(), c.data(), pool);
  double best = 1e30;
  for (int i = 0; i < 10; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    gemm.run(a.data(), b.data(), c.data(), pool);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return gemm.flops() / best;
}

}  // namespace

TEST_CASE("devices --measure: writes a cpu row whose every figure says how it was measured, keeping the other rows") {
  napkin::testing::TempDir tmp("measure");
  const std::string file = tmp / "config/napkin/devices.json";  // the parent directories do not exist yet
  // An older file with another device and an old cpu row: the tpu row stays.
  fs::create_directories(tmp / "config/napkin");
  analysis::Device tpu = analysis::builtin_devices()[0], old_cpu = analysis::builtin_devices()[3];
  tpu.name = "tpu";
  old_cpu.fp32_flops = 1;
  write_bytes(file, analysis::devices_to_json({tpu, old_cpu}));

  Run r = napkin_with("", "devices --measure --quick --out " + file);
  REQUIRE_MESSAGE(r.status == 0, r.out);
  CHECK(contains(r.out, "wrote the cpu row to " + file));
  const double check_flops = independent_fp32_flops();

  std::vector<analysis::Device> rows = analysis::devices_from_json(read_bytes(file), file);
  REQUIRE(rows.size() == 2);
  CHECK(rows[0].name == "tpu");
  CHECK(rows[0].fp32_flops == tpu.fp32_flops);
  const analysis::Device& cpu = rows[1];
  CHECK(cpu.name == "cpu");
  for (const std::string& figure : analysis::figure_names()) {
    CAPTURE(figure);
    CHECK(cpu.source_of(figure).rfind("measured by `napkin devices --measure --quick` on ", 0) == 0);
  }
  // The VM is noisy (other tests, other builds): a factor 4 cannot flake
  // but catches a peak that is far too low.
  CAPTURE(check_flops);
  CHECK(cpu.fp32_flops * 4 >= check_flops);
  CHECK(cpu.bf16_flops > 0);
  CHECK(cpu.fp64_flops > 0);
  CHECK(cpu.tf32_flops == 0);
  CHECK(cpu.fp16_flops == 0);
  CHECK(cpu.fp8_flops == 0);
  CHECK(cpu.bandwidth_bytes_per_s > 1e8);
  CHECK(cpu.memory_bytes == doctest::Approx(double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGESIZE))).epsilon(0.2));
  CHECK(cpu.cache_bytes > 0);
  CHECK(cpu.cache_bandwidth_bytes_per_s > 0);
  CHECK(cpu.loop_flops > 0);
  CHECK(cpu.launch_seconds > 0);
  CHECK(cpu.launch_seconds < 0.1);
  for (const char* dtype : {"f32", "bf16", "f64"}) {
    CAPTURE(dtype);
    REQUIRE(cpu.gemm_efficiency.count(dtype) == 1);
    const analysis::GemmEfficiency& curve = cpu.gemm_efficiency.at(dtype);
    REQUIRE(curve.size() == 7);
    CHECK(curve.front().first == 1);
    CHECK(curve.back().first == 256);
    for (size_t i = 0; i < curve.size(); ++i) {
      CHECK(curve[i].second > 0);
      CHECK(curve[i].second <= 1);
      if (i > 0) CHECK(curve[i].first > curve[i - 1].first);
    }
  }

  // napkin reads it from NAPKIN_DEVICES: the table shows the measured row
  // and where it comes from.
  Run table = napkin_with(file, "devices");
  CHECK(table.status == 0);
  CHECK(contains(table.out, cpu.description));
  CHECK(contains(table.out, "tpu "));
  CHECK(contains(table.out, "[local device file " + file + "]"));
  Run sources = napkin_with(file, "devices --sources");
  CHECK(sources.status == 0);
  CHECK(contains(sources.out, "cpu (from " + file + ")"));
  CHECK(contains(sources.out, "STREAM triad"));
  // Without NAPKIN_DEVICES (set but empty) the built-in table is back.
  Run builtin = napkin_with("", "devices");
  CHECK(builtin.status == 0);
  CHECK(contains(builtin.out, analysis::builtin_devices()[3].description));
  CHECK_FALSE(contains(builtin.out, "local device file"));
  for (const auto& e : fs::directory_iterator(tmp / "config/napkin")) CHECK(e.path().filename() == "devices.json");
}

TEST_CASE("devices --measure: a broken device file stops every command but is replaced by measuring again") {
  napkin::testing::TempDir tmp("measure-broken");
  const std::string file = tmp / "devices.json";
  const std::string broken = R"({"format": "napkin-devices-1", "devices": [{"name": "cpu", "figures": {}}]})";
  write_bytes(file, broken);
  for (const char* command : {"devices", "ops", "report models/linear.yaml --no-ops"}) {
    CAPTURE(command);
    Run r = napkin_with(file, command);
    CHECK(r.status == 1);
    CHECK(contains(r.out, "error: " + file + ": device 'cpu': needs memory, bandwidth and fp32 greater than 0"));
  }
  Run missing = napkin_with(tmp / "absent.json", "devices");
  CHECK(missing.status == 1);
  CHECK(contains(missing.out, "error: " + (tmp / "absent.json") + ": no such device file (named by $NAPKIN_DEVICES"));

  // No --out: the file NAPKIN_DEVICES names.
  Run r = napkin_with(file, "devices --measure --quick --threads 1");
  REQUIRE_MESSAGE(r.status == 0, r.out);
  CHECK(contains(r.out, "note: replaced a device file napkin could not read"));
  std::vector<analysis::Device> rows = analysis::devices_from_json(read_bytes(file), file);
  REQUIRE(rows.size() == 1);
  CHECK(contains(rows[0].source, ", 1 thread;"));
  CHECK(napkin_with(file, "ops").status == 0);
}

TEST_CASE("devices --measure: a directory or a file that is not a device file is refused before measuring") {
  napkin::testing::TempDir tmp("measure-refused");
  Run dir = napkin_with("", "devices --measure --quick --out " + tmp.path);
  CHECK(dir.status == 1);
  CHECK(contains(dir.out, "error: " + tmp.path + ": is a directory"));
  CHECK_FALSE(contains(dir.out, "GEMM"));  // nothing measured
  CHECK(fs::is_empty(tmp.path));

  const std::string notes = tmp / "notes.json";
  write_bytes(notes, "{\"my\": \"notes\"}");
  Run other = napkin_with("", "devices --measure --quick --out " + notes);
  CHECK(other.status == 1);
  CHECK(contains(other.out, "error: " + notes + ": is not a napkin device file"));
  CHECK(read_bytes(notes) == "{\"my\": \"notes\"}");

  Run no_file = napkin_with("", "devices --measure --quick");  // NAPKIN_DEVICES set empty: no default file
  CHECK(no_file.status == 1);
  CHECK(contains(no_file.out, "error: no device file to write"));

  Run flags = napkin_with("", "devices --quick");
  CHECK(flags.status == 1);
  CHECK(contains(flags.out, "--quick requires --measure"));
  for (const auto& e : fs::directory_iterator(tmp.path)) CHECK(e.path().filename() == "notes.json");
}

TEST_CASE("devices: napkin train builds afresh when the local device file changes the table") {
  napkin::testing::TempDir tmp("measure-train");
  analysis::Device cpu = analysis::builtin_devices()[3];
  cpu.fp32_flops /= 2;
  const std::string file = tmp / "devices.json";
  write_bytes(file, analysis::devices_to_json({cpu}));
  // The trainer cache lives in the temporary directory too.
  auto train = [&](const std::string& devices, const std::string& run) {
    return napkin_with(devices, fmt::format("train models/gpt.yaml --dims batch=2,seq=8,d=16,heads=2,layers=1 -- --data "
                                            "tests/e2e/data/gpt/tokens.u16 --steps 1 --quiet --checkpoint-dir {}",
                                            tmp / run),
                       tmp.path)
        .out;
  };
  const std::string cached = "using the cached trainer";
  CHECK_FALSE(contains(train("", "a"), cached));
  CHECK(contains(train("", "b"), cached));
  CHECK_FALSE(contains(train(file, "c"), cached));  // the cpu row changed: another trainer
  CHECK(contains(train(file, "d"), cached));
}
