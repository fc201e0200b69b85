// The device table behind the roofline report and the trainer's predicted
// step time: memory, bandwidth and dense peak throughput of the accelerators
// the lecture's napkin math is done for, plus the CPU napkin is developed on,
// and the named efficiencies of the time model (docs/report.md, "time model").
//
// Every figure says where it comes from (Device::sources): a datasheet, or a
// measurement by `napkin devices --measure` on a named machine and date. A
// local device file (local_device_file()) that `napkin devices --measure`
// writes replaces the built-in row of the same name for the commands that
// load it (tools/napkin.cpp, at start-up), so a trainer built on a host uses figures
// measured on that host.
//
// Bump kDeviceTableVersion whenever a built-in number changes, so that
// reports (which print it) can be traced back to the table they used.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ir/dtype.h"

namespace napkin::analysis {

inline constexpr int kDeviceTableVersion = 2;

// The fraction of its dtype's matmul peak a GEMM reaches, by the narrowest of
// the m, n and k of one batch entry: points (narrowest dim, fraction) in
// ascending dim order, read by linear interpolation in log2(dim); below the
// first point the first fraction, above the last the last. Empty: 1.
using GemmEfficiency = std::vector<std::pair<double, double>>;

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

  // The time model's named parameters (docs/report.md, "time model").
  // A kernel whose bytes fit in `cache_bytes` moves them at cache_bandwidth
  // (0: no cache level is modelled; everything goes at bandwidth_bytes_per_s).
  double cache_bytes = 0;
  double cache_bandwidth_bytes_per_s = 0;
  // FLOP/s a loop kernel (elementwise, normalization, loss, optimizer)
  // reaches on the op table's FLOP counts; 0: the vector peak (vector_peak).
  double loop_flops = 0;
  // Transcendental function evaluations (exp, tanh, ...) per second in a loop
  // kernel, each on top of its FLOPs; 0: not modelled (free).
  double transcendental_rate = 0;
  // Fixed cost of one kernel: the thread pool's dispatch on a CPU, a launch
  // on a GPU.
  double launch_seconds = 0;
  std::map<std::string, GemmEfficiency> gemm_efficiency;  // by dtype name: "f32", "bf16"

  std::string source;  // where the row as a whole comes from
  // Where each figure comes from, by figure name (figure_names()).
  std::map<std::string, std::string> sources;
  std::string source_of(std::string_view figure) const;  // sources[figure], else `source`
};

// The figure names a device file and Device::sources use, in table order:
// memory, bandwidth, fp64, fp32, tf32, bf16, fp16, fp8, cache_bytes,
// cache_bandwidth, loop_flops, transcendental_rate, launch_seconds,
// gemm_efficiency.
const std::vector<std::string>& figure_names();
// The value of figure `name` (0 for gemm_efficiency, which is a curve).
double figure_value(const Device& device, std::string_view name);

// Case-insensitive; nullptr when unknown (see known_device_names()). Looks in
// the local rows (use_local_devices) first, then the built-in table.
const Device* find_device(std::string_view name);
const std::vector<Device>& builtin_devices();
// The built-in rows, with the local rows in place of (or after) them.
std::vector<Device> known_devices();
// "a100, cpu, h100, h200": for error messages.
std::string known_device_names();

// The local device file: $NAPKIN_DEVICES when set (empty: none), else
// $XDG_CONFIG_HOME/napkin/devices.json, else ~/.config/napkin/devices.json.
std::string local_device_file();
// Reads a device file (format "napkin-devices-1", docs/report.md) and makes
// its rows the local rows find_device sees first. A missing file at the
// default place is no error (returns ""); a missing file named by
// $NAPKIN_DEVICES, or a malformed one, returns what is wrong, naming the file.
std::string use_local_devices(const std::string& path);
// Whether `device` came from a local device file (its path, or "").
std::string local_origin(const Device& device);

// A device file holding `devices`, and its reverse; parse errors name `path`.
std::string devices_to_json(const std::vector<Device>& devices);
std::vector<Device> devices_from_json(const std::string& text, const std::string& path);  // throws std::runtime_error

// Peak for a matmul whose inputs are `compute_dtype`; 0 if the device has none.
// f32 runs on the fp32 vector units unless allow_tf32 (torch's
// allow_tf32 / set_float32_matmul_precision("high")) and the device has tf32.
// f64 uses the vector fp64 peak (see the table's note on fp64).
double matmul_peak(const Device& device, ir::DType compute_dtype, bool allow_tf32 = false);
// The figure (figure_names) matmul_peak reads for `compute_dtype` on `device`
// (f32: "tf32" when allowed and the device has it, else "fp32"); "" for
// integer dtypes, which have no matmul peak.
std::string_view peak_figure_name(const Device& device, ir::DType compute_dtype, bool allow_tf32 = false);
// Peak for elementwise work on `dtype` tensors: such kernels compute in fp32 on
// the vector units whatever the storage type (f64 in fp64), and are nearly always
// bandwidth-bound anyway, so this only bounds them from the compute side.
double vector_peak(const Device& device, ir::DType dtype);
// GEMM efficiency of `device` for a contraction in `compute_dtype` whose
// narrowest dim is `narrowest` (GemmEfficiency); 1 without a curve.
double gemm_efficiency(const Device& device, ir::DType compute_dtype, double narrowest);

}  // namespace napkin::analysis
