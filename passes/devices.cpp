#include "passes/devices.h"

#include <algorithm>

#include "ir/text.h"

namespace napkin::passes {

namespace {

// fp64: the table keeps the vector figure. H100 and A100 also run DGEMM on fp64
// tensor cores at twice that (66.9 / 19.5 TFLOP/s); napkin uses f64 for reference
// checks, not for throughput, so the conservative number is the one kept.
std::vector<Device> make_table() {
  std::vector<Device> devices;

  Device h100;
  h100.name = "h100";
  h100.description = "NVIDIA H100 SXM5 80GB";
  h100.memory_bytes = 80e9;
  h100.bandwidth_bytes_per_s = 3.35e12;
  h100.fp64_flops = 33.5e12;
  h100.fp32_flops = 66.9e12;
  h100.tf32_flops = 494.7e12;
  h100.bf16_flops = 989.5e12;
  h100.fp16_flops = 989.5e12;
  h100.fp8_flops = 1979e12;
  h100.source =
      "NVIDIA H100 datasheet (SXM): 80 GB, 3.35 TB/s; bf16/fp16 1979 and fp8 3958 TFLOP/s "
      "are with 2:4 sparsity, halved here for dense as in CS336 lecture 2 (1979e12 / 2). "
      "fp64 33.5, fp32 66.9, tf32 494.7 TFLOP/s: NVIDIA H100 Tensor Core GPU Architecture "
      "whitepaper, SXM5 column";
  devices.push_back(h100);

  // Same GH100 die and clocks as the H100 SXM; only the memory differs (HBM3e).
  Device h200 = h100;
  h200.name = "h200";
  h200.description = "NVIDIA H200 SXM 141GB";
  h200.memory_bytes = 141e9;
  h200.bandwidth_bytes_per_s = 4.8e12;
  h200.source =
      "NVIDIA H200 datasheet (SXM): 141 GB, 4.8 TB/s; compute peaks identical to the H100 "
      "SXM datasheet (dense = half the sparsity figures)";
  devices.push_back(h200);

  Device a100;
  a100.name = "a100";
  a100.description = "NVIDIA A100 SXM4 80GB";
  a100.memory_bytes = 80e9;
  a100.bandwidth_bytes_per_s = 2.039e12;
  a100.fp64_flops = 9.7e12;
  a100.fp32_flops = 19.5e12;
  a100.tf32_flops = 156e12;
  a100.bf16_flops = 312e12;
  a100.fp16_flops = 312e12;
  a100.source =
      "NVIDIA A100 datasheet (80GB SXM): 2039 GB/s; fp64 9.7, fp32 19.5, tf32 156, "
      "bf16/fp16 312 TFLOP/s dense; Ampere has no fp8 tensor cores";
  devices.push_back(a100);

  // Measured, not a datasheet: a 2-vCPU KVM guest's clocks and memory are the host's.
  Device cpu;
  cpu.name = "cpu";
  cpu.description = "napkin's development machine: 2 vCPUs of an AMD EPYC (Zen 4), AVX-512 + "
                    "avx512_bf16, no AMX, 24 GiB";
  cpu.memory_bytes = 24.0 * (1ull << 30);
  cpu.bandwidth_bytes_per_s = 38e9;
  cpu.fp64_flops = 105e9;
  cpu.fp32_flops = 210e9;
  cpu.bf16_flops = 415e9;
  cpu.source =
      "measured 2026-11-21 on the machine itself, 2 threads. Bandwidth: STREAM-style triad "
      "a[i] = b[i] + s*c[i] over 3 x 256 MiB double arrays (g++ -O3 -march=native), "
      "24 bytes per element, best of 20 passes: ~38 GB/s in 11 of 14 runs (30.6 to 61.6 "
      "overall: a shared VM). fp32 210 and bf16 415 GFLOP/s: best 2048^2 / 4096^2 GEMM "
      "through oneDNN (torch 1.13 mkldnn_linear, avx512_bf16). fp64 = fp32 / 2 (half the "
      "SIMD lanes), not measured. No fp16/fp8 arithmetic, no tf32";
  devices.push_back(cpu);

  return devices;
}

}  // namespace

const std::vector<Device>& known_devices() {
  static const std::vector<Device> table = make_table();
  return table;
}

const Device* find_device(std::string_view name) {
  for (const Device& d : known_devices())
    if (ir::iequals(d.name, name)) return &d;
  return nullptr;
}

std::string known_device_names() {
  std::vector<std::string_view> names;
  for (const Device& d : known_devices()) names.push_back(d.name);
  std::sort(names.begin(), names.end());
  std::string out;
  for (std::string_view n : names) {
    if (!out.empty()) out += ", ";
    out += n;
  }
  return out;
}

double matmul_peak(const Device& device, ir::DType compute_dtype, bool allow_tf32) {
  switch (compute_dtype) {
    case ir::DType::F64: return device.fp64_flops;
    case ir::DType::F32:
      return allow_tf32 && device.tf32_flops > 0 ? device.tf32_flops : device.fp32_flops;
    case ir::DType::F16: return device.fp16_flops;
    case ir::DType::BF16: return device.bf16_flops;
    case ir::DType::F8E4M3:
    case ir::DType::F8E5M2: return device.fp8_flops;
    case ir::DType::I32:
    case ir::DType::I64:
    case ir::DType::Bool: return 0;  // integer matmuls are not in the table
  }
  return 0;
}

double vector_peak(const Device& device, ir::DType dtype) {
  return dtype == ir::DType::F64 ? device.fp64_flops : device.fp32_flops;
}

}  // namespace napkin::passes
