#include "analysis/devices.h"

#include <doctest/doctest.h>

using napkin::ir::DType;
namespace analysis = napkin::analysis;

TEST_CASE("devices are found by name, case-insensitively") {
  REQUIRE(analysis::find_device("h100") != nullptr);
  CHECK(analysis::find_device("H100")->name == "h100");
  CHECK(analysis::find_device("A100")->name == "a100");
  CHECK(analysis::find_device("tpu") == nullptr);
  CHECK(analysis::find_device("") == nullptr);
  CHECK(analysis::known_device_names() == "a100, cpu, h100, h200");
  CHECK(analysis::known_devices().size() == 4);
  CHECK(analysis::kDeviceTableVersion == 2);
}

TEST_CASE("every device has memory, bandwidth, fp32 and fp64 peaks and a source") {
  for (const analysis::Device& d : analysis::known_devices()) {
    CAPTURE(d.name);
    CHECK(d.memory_bytes > 0);
    CHECK(d.bandwidth_bytes_per_s > 0);
    CHECK(d.fp32_flops > 0);
    CHECK(d.fp64_flops > 0);
    CHECK_FALSE(d.description.empty());
    CHECK_FALSE(d.source.empty());
  }
}

// CS336 lecture 2: h100_flop_per_sec = 1979e12 / 2.
TEST_CASE("H100 and H200 numbers") {
  const analysis::Device& h100 = *analysis::find_device("h100");
  CHECK(h100.memory_bytes == 80e9);
  CHECK(h100.bandwidth_bytes_per_s == 3.35e12);
  CHECK(analysis::matmul_peak(h100, DType::BF16) == 1979e12 / 2);
  CHECK(analysis::matmul_peak(h100, DType::F16) == 989.5e12);
  CHECK(analysis::matmul_peak(h100, DType::F8E4M3) == 1979e12);
  CHECK(analysis::matmul_peak(h100, DType::F8E5M2) == 1979e12);
  const analysis::Device& h200 = *analysis::find_device("h200");
  CHECK(h200.memory_bytes == 141e9);
  CHECK(h200.bandwidth_bytes_per_s == 4.8e12);
  CHECK(analysis::matmul_peak(h200, DType::BF16) == analysis::matmul_peak(h100, DType::BF16));
}

TEST_CASE("f32 matmuls use tf32 only when allowed and available") {
  const analysis::Device& h100 = *analysis::find_device("h100");
  CHECK(analysis::matmul_peak(h100, DType::F32) == 66.9e12);
  CHECK(analysis::matmul_peak(h100, DType::F32, true) == 494.7e12);
  const analysis::Device& a100 = *analysis::find_device("a100");
  CHECK(analysis::matmul_peak(a100, DType::F32) == 19.5e12);
  CHECK(analysis::matmul_peak(a100, DType::F32, true) == 156e12);
  const analysis::Device& cpu = *analysis::find_device("cpu");
  CHECK(analysis::matmul_peak(cpu, DType::F32, true) == cpu.fp32_flops);  // no tf32: plain fp32
}

TEST_CASE("unsupported matmul dtypes have peak 0") {
  const analysis::Device& a100 = *analysis::find_device("a100");
  CHECK(analysis::matmul_peak(a100, DType::BF16) == 312e12);
  CHECK(analysis::matmul_peak(a100, DType::F8E4M3) == 0);  // Ampere has no fp8
  CHECK(analysis::matmul_peak(a100, DType::I32) == 0);
  const analysis::Device& cpu = *analysis::find_device("cpu");
  CHECK(analysis::matmul_peak(cpu, DType::F16) == 0);
  CHECK(analysis::matmul_peak(cpu, DType::BF16) > analysis::matmul_peak(cpu, DType::F32));
}

TEST_CASE("elementwise work runs at the vector peak") {
  const analysis::Device& h100 = *analysis::find_device("h100");
  CHECK(analysis::vector_peak(h100, DType::BF16) == 66.9e12);
  CHECK(analysis::vector_peak(h100, DType::F32) == 66.9e12);
  CHECK(analysis::vector_peak(h100, DType::F64) == 33.5e12);
  CHECK(analysis::matmul_peak(h100, DType::F64) == 33.5e12);
}

TEST_CASE("the cpu entry is the development machine as napkin devices --measure measured it") {
  const analysis::Device& cpu = *analysis::find_device("cpu");
  CHECK(cpu.memory_bytes > 20.0 * 1024 * 1024 * 1024);
  for (const std::string& figure : analysis::figure_names()) {
    CAPTURE(figure);
    CHECK(cpu.source_of(figure).rfind("measured by `napkin devices --measure` on ", 0) == 0);
  }
  // Every parameter of the time model is there: nothing falls back to a default.
  CHECK(cpu.cache_bytes > 0);
  CHECK(cpu.cache_bandwidth_bytes_per_s > cpu.bandwidth_bytes_per_s);
  CHECK(cpu.loop_flops > 0);
  CHECK(cpu.transcendental_rate > 0);
  CHECK(cpu.launch_seconds > 0);
  CHECK(cpu.gemm_efficiency.count("f32") == 1);
  CHECK(cpu.gemm_efficiency.count("bf16") == 1);
}
