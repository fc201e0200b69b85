// The device table behind the roofline report: memory, bandwidth and dense peak
// throughput of the accelerators the lecture's napkin math is done for, plus the
// CPU napkin is developed on. Every number cites its source in Device::source.
//
// Bump kDeviceTableVersion whenever a number changes, so that reports (which
// print it) can be traced back to the table they were computed with.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "ir/dtype.h"

namespace napkin::passes {

inline constexpr int kDeviceTableVersion = 1;

struct Device {
  std::string name;         // lookup key: "h100"
  std::string description;  // "NVIDIA H100 SXM5 80GB"
  double memory_bytes = 0;
  double bandwidth_bytes_per_s = 0;  // main memory (HBM / DRAM)
  // Dense (no 2:4 sparsity) peaks in FLOP/s; 0 = no support worth the name.
  double fp64_flops = 0;  // vector (non-tensor-core) fp64
  double fp32_flops = 0;  // vector fp32: no tensor cores
  double tf32_flops = 0;  // tensor cores, fp32 inputs rounded to tf32
  double bf16_flops = 0;
  double fp16_flops = 0;
  double fp8_flops = 0;
  std::string source;  // where the numbers come from
};

// Case-insensitive; nullptr when unknown (see known_device_names()).
const Device* find_device(std::string_view name);
const std::vector<Device>& known_devices();
// "a100, cpu, h100, h200": for error messages.
std::string known_device_names();

// Peak for a matmul whose inputs are `compute_dtype`; 0 if the device has none.
// f32 runs on the fp32 vector units unless allow_tf32 (torch's
// allow_tf32 / set_float32_matmul_precision("high")) and the device has tf32.
// f64 uses the vector fp64 peak (see the table's note on fp64).
double matmul_peak(const Device& device, ir::DType compute_dtype, bool allow_tf32 = false);
// Peak for elementwise work on `dtype` tensors: such kernels compute in fp32 on
// the vector units whatever the storage type (f64 in fp64), and are nearly always
// bandwidth-bound anyway, so this only bounds them from the compute side.
double vector_peak(const Device& device, ir::DType dtype);

}  // namespace napkin::passes
