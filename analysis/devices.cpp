#include "analysis/devices.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "ir/text.h"

namespace napkin::analysis {

namespace {

// The development machine's row: the output of `napkin devices --measure`
// on it, pasted verbatim (every figure's source says how it was measured).
// Re-measure and paste again when the runtime's kernels change.
const char* const kDevelopmentMachine = R"json({
 "format": "napkin-devices-1",
 "devices": [
  {
   "description": "napkin's development machine: AMD EPYC, 2 threads on 2 logical CPUs, host vm, 23.5 GiB",
   "figures": {
    "bandwidth": {
     "source": "measured by `napkin devices --measure` on vm, 2026-11-25, 2 threads: STREAM triad a[i] = b[i] + s * c[i] over 3 arrays of 256 MiB of floats, split over the ThreadPool as an elementwise kernel is, the best of 5 samples of >= 50 ms, taken in rounds over 70 benchmarks; 12 bytes counted per element (b and c read, a written) as napkin's cost model counts a kernel's bytes, so the write-allocate read of a (ordinary stores, as the trainer's kernels make) is paid for but not counted",
     "value": 33977171723.43653
    },
    "bf16": {
     "source": "measured by `napkin devices --measure` on vm, 2026-11-25, 2 threads: runtime::Gemm bf16 (A, B and C bf16, fp32 accumulation (oneDNN's bf16 matmul primitive or fp32 panels, as runtime::Gemm chooses)): the best GFLOP/s of m x n x k = 2048x2048x2048 411.2, 2048x1024x256 437.8, 2048x256x1024 444.6 and of the gemm_efficiency shapes (best: 1024x64x1024); each the best of 5 samples of >= 50 ms, taken in rounds over 70 benchmarks",
     "value": 450844391893.9345
    },
    "cache_bandwidth": {
     "source": "measured by `napkin devices --measure` on vm, 2026-11-25, 2 threads: STREAM triad a[i] = b[i] + s * c[i] over 3 arrays of 5.33 MiB of floats (half of cache_bytes), split over the ThreadPool, 20 passes per chunk per dispatch, 12 bytes counted per element and pass (see bandwidth), the best of 5 samples of >= 50 ms, taken in rounds over 70 benchmarks",
     "value": 152858203644.9711
    },
    "cache_bytes": {
     "source": "measured by `napkin devices --measure` on vm, 2026-11-25, 2 threads: the last-level cache, L3: 32 MiB per instance x 1 instance (1 on the CPUs this process may use, at most one per thread) (/sys/devices/system/cpu/cpu*/cache)",
     "value": 33554432.0
    },
    "fp16": {
     "source": "measured by `napkin devices --measure` on vm, 2026-11-25, 2 threads: 0: no fp16 arithmetic used on this CPU (napkin's f16 GEMM widens to fp32)",
     "value": 0.0
    },
    "fp32": {
     "source": "measured by `napkin devices --measure` on vm, 2026-11-25, 2 threads: runtime::Gemm f32 (oneDNN sgemm, single-threaded, in napkin's ThreadPool): the best GFLOP/s of m x n x k = 2048x2048x2048 219.6, 2048x1024x256 219.4, 2048x256x1024 221.3 and of the gemm_efficiency shapes (best: 1024x32x1024); each the best of 5 samples of >= 50 ms, taken in rounds over 70 benchmarks",
     "value": 229781595932.27304
    },
    "fp64": {
     "source": "measured by `napkin devices --measure` on vm, 2026-11-25, 2 threads: runtime::Gemm f64 (napkin's plain fp64 loop): the best GFLOP/s of m x n x k = 512x512x512 23.8 and of the gemm_efficiency shapes (best: 512x64x512); each the best of 5 samples of >= 50 ms, taken in rounds over 70 benchmarks",
     "value": 26989309462.54531
    },
    "fp8": {
     "source": "measured by `napkin devices --measure` on vm, 2026-11-25, 2 threads: 0: no fp8 arithmetic on a CPU",
     "value": 0.0
    },
    "gemm_efficiency": {
     "source": "measured by `napkin devices --measure` on vm, 2026-11-25, 2 threads: for each dtype and narrowest dim d, the combined rate (harmonic mean: the shapes do equal FLOPs) of runtime::Gemm on m x n x k = wide x d x wide and wide x wide x d (wide = 1024 for f32 and bf16, 512 for f64) and, for 16 <= d <= 128, attention's 64 x 128x128xd and 64 x 128xdx128, as a fraction of that dtype's peak, each the best of 5 samples of >= 50 ms, taken in rounds over 70 benchmarks: f32 [1: 0.164 (1024x1x1024 79.8, 1024x1024x1 24.6); 8: 0.445 (1024x8x1024 78.5, 1024x1024x8 146.2); 16: 0.705 (1024x16x1024 163.2, 1024x1024x16 153.8, 64 x 128x128x16 176.1, 64 x 128x16x128 156.4); 32: 0.923 (1024x32x1024 229.8, 1024x1024x32 206.1, 64 x 128x128x32 201.7, 64 x 128x32x128 212.9); 64: 0.914 (1024x64x1024 208.8, 1024x1024x64 217.4, 64 x 128x128x64 216.0, 64 x 128x64x128 199.2); 128: 0.943 (1024x128x1024 228.3, 1024x1024x128 220.7, 64 x 128x128x128 214.0, 64 x 128x128x128 205.4); 256: 0.968 (1024x256x1024 222.8, 1024x1024x256 222.0)]; bf16 [1: 0.044 (1024x1x1024 11.9, 1024x1024x1 58.0); 8: 0.339 (1024x8x1024 99.3, 1024x1024x8 330.2); 16: 0.479 (1024x16x1024 190.8, 1024x1024x16 396.3, 64 x 128x128x16 192.7, 64 x 128x16x128 179.7); 32: 0.774 (1024x32x1024 431.0, 1024x1024x32 420.8, 64 x 128x128x32 281.7, 64 x 128x32x128 310.8); 64: 0.886 (1024x64x1024 450.8, 1024x1024x64 440.9, 64 x 128x128x64 361.5, 64 x 128x64x128 362.1); 128: 0.871 (1024x128x1024 441.7, 1024x1024x128 445.1, 64 x 128x128x128 340.3, 64 x 128x128x128 364.5); 256: 0.985 (1024x256x1024 445.3, 1024x1024x256 443.0)]; f64 [1: 0.121 (512x1x512 1.9, 512x512x1 10.5); 8: 0.649 (512x8x512 15.3, 512x512x8 20.5); 16: 0.834 (512x16x512 21.8, 512x512x16 23.3); 32: 0.906 (512x32x512 24.5, 512x512x32 24.4); 64: 0.970 (512x64x512 27.0, 512x512x64 25.4); 128: 0.876 (512x128x512 22.0, 512x512x128 25.6); 256: 0.898 (512x256x512 24.7, 512x512x256 23.8)]",
     "value": {
      "bf16": [
       [
        1.0,
        0.04392603010877081
       ],
       [
        8.0,
        0.3385470234640895
       ],
       [
        16.0,
        0.47904765503656255
       ],
       [
        32.0,
        0.7739185217465664
       ],
       [
        64.0,
        0.886008307918266
       ],
       [
        128.0,
        0.8705159514657924
       ],
       [
        256.0,
        0.9851468670447914
       ]
      ],
      "f32": [
       [
        1.0,
        0.1637442826415953
       ],
       [
        8.0,
        0.4445649119407655
       ],
       [
        16.0,
        0.7046648910446747
       ],
       [
        32.0,
        0.9229979190599559
       ],
       [
        64.0,
        0.9144366623760632
       ],
       [
        128.0,
        0.9433549063746284
       ],
       [
        256.0,
        0.9678425886736312
       ]
      ],
      "f64": [
       [
        1.0,
        0.12102167099037031
       ],
       [
        8.0,
        0.6494749189468543
       ],
       [
        16.0,
        0.8342575115298904
       ],
       [
        32.0,
        0.9062288520274295
       ],
       [
        64.0,
        0.969652609326658
       ],
       [
        128.0,
        0.8763195337076458
       ],
       [
        256.0,
        0.8980474900503544
       ]
      ]
     }
    },
    "launch_seconds": {
     "source": "measured by `napkin devices --measure` on vm, 2026-11-25, 2 threads: the mean time of an empty ThreadPool::parallel_for over 2 chunks, back to back (the workers still spinning, as between a step's kernels), the best of 5 samples of >= 50 ms, taken in rounds over 70 benchmarks",
     "value": 1.9761040791420515e-07
    },
    "loop_flops": {
     "source": "measured by `napkin devices --measure` on vm, 2026-11-25, 2 threads: a loop of 16 dependent multiplies and adds per element (x = x * a + b, one FLOP each as napkin's op table counts) over 8 KiB of floats per thread (L1-resident), split over the ThreadPool, 200 passes per dispatch; compiled by napkin's C++ compiler at its Release flags with -ffp-contract=off (no fast math, no FMAs, like the trainer's LLVM kernels) for the host's widest vector ISA; the best of 5 samples of >= 50 ms, taken in rounds over 70 benchmarks",
     "value": 184229612346.44254
    },
    "memory": {
     "source": "measured by `napkin devices --measure` on vm, 2026-11-25, 2 threads: total RAM (sysconf _SC_PHYS_PAGES x _SC_PAGESIZE, /proc/meminfo's MemTotal)",
     "value": 25276514304.0
    },
    "tf32": {
     "source": "measured by `napkin devices --measure` on vm, 2026-11-25, 2 threads: 0: no tf32 arithmetic on a CPU",
     "value": 0.0
    },
    "transcendental_rate": {
     "source": "measured by `napkin devices --measure` on vm, 2026-11-25, 2 threads: y = exp(x) per element (the libm call std::exp on float, as a loop kernel that does not vectorize makes it) over 8 KiB of floats in [-1, 1) per thread, split over the ThreadPool, 10 passes per dispatch, at napkin's Release flags; the best of 5 samples of >= 50 ms, taken in rounds over 70 benchmarks",
     "value": 611292131.9436789
    }
   },
   "name": "cpu",
   "source": "measured by `napkin devices --measure` on vm, 2026-11-25, 2 threads; other processes took 0% of the 2 CPUs meanwhile"
  }
 ]
})json";

Device builtin_cpu() {
  return devices_from_json(kDevelopmentMachine, "analysis/devices.cpp (the built-in cpu row)").at(0);
}

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
  // Not measured yet (no GPU run has calibrated them): a kernel launch on a
  // recent driver costs ~2-5 us of CPU time but overlaps with the GPU's work
  // when the stream stays full; 4 us is charged per kernel, an upper estimate.
  h100.launch_seconds = 4e-6;
  h100.sources["launch_seconds"] =
      "assumed, not measured: CUDA kernel launch overhead of 2-5 us (NVIDIA CUDA C++ Best Practices "
      "Guide); no GEMM efficiency curve or cache level yet (GEMMs at the datasheet peak)";
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
  a100.launch_seconds = 4e-6;
  a100.sources["launch_seconds"] = h100.sources["launch_seconds"];
  devices.push_back(a100);

  devices.push_back(builtin_cpu());
  return devices;
}

}  // namespace


const std::vector<Device>& builtin_devices() {
  static const std::vector<Device> table = make_table();
  return table;
}

namespace {

struct LocalRows {
  std::string path;
  std::vector<Device> devices;
};
LocalRows& local_rows() {
  static LocalRows rows;
  return rows;
}

}  // namespace

std::string Device::source_of(std::string_view figure) const {
  auto it = sources.find(std::string(figure));
  return it != sources.end() ? it->second : source;
}

namespace {

// Each scalar figure's name and member, in the order figure_names() lists them.
const std::pair<std::string_view, double Device::*> kFigures[] = {
    {"memory", &Device::memory_bytes},         {"bandwidth", &Device::bandwidth_bytes_per_s},
    {"fp64", &Device::fp64_flops},             {"fp32", &Device::fp32_flops},
    {"tf32", &Device::tf32_flops},             {"bf16", &Device::bf16_flops},
    {"fp16", &Device::fp16_flops},             {"fp8", &Device::fp8_flops},
    {"cache_bytes", &Device::cache_bytes},     {"cache_bandwidth", &Device::cache_bandwidth_bytes_per_s},
    {"loop_flops", &Device::loop_flops},       {"transcendental_rate", &Device::transcendental_rate},
    {"launch_seconds", &Device::launch_seconds}};

// The member holding figure `name`; nullptr for gemm_efficiency (a curve) and unknown names.
double Device::*figure_member(std::string_view name) {
  for (const auto& [figure, member] : kFigures)
    if (figure == name) return member;
  return nullptr;
}

}  // namespace

const std::vector<std::string>& figure_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const auto& figure : kFigures) n.emplace_back(figure.first);
    n.emplace_back("gemm_efficiency");
    return n;
  }();
  return names;
}

double figure_value(const Device& device, std::string_view name) {
  double Device::*member = figure_member(name);
  return member ? device.*member : 0;
}

const Device* find_device(std::string_view name) {
  for (const Device& d : local_rows().devices)
    if (ir::iequals(d.name, name)) return &d;
  for (const Device& d : builtin_devices())
    if (ir::iequals(d.name, name)) return &d;
  return nullptr;
}

std::vector<Device> known_devices() {
  std::vector<Device> out = builtin_devices();
  for (const Device& local : local_rows().devices) {
    auto same = std::find_if(out.begin(), out.end(), [&](const Device& d) { return ir::iequals(d.name, local.name); });
    if (same != out.end()) *same = local;
    else out.push_back(local);
  }
  return out;
}

std::string known_device_names() {
  std::vector<std::string> names;
  for (const Device& d : known_devices()) names.push_back(d.name);
  std::sort(names.begin(), names.end());
  return fmt::format("{}", fmt::join(names, ", "));
}

std::string local_device_file() {
  if (const char* env = std::getenv("NAPKIN_DEVICES")) return env;
  std::filesystem::path base;
  if (const char* xdg = std::getenv("XDG_CONFIG_HOME"); xdg && *xdg) base = xdg;
  else if (const char* home = std::getenv("HOME"); home && *home) base = std::filesystem::path(home) / ".config";
  else return "";
  return (base / "napkin" / "devices.json").string();
}

std::string use_local_devices(const std::string& path) {
  local_rows() = {};
  if (path.empty()) return "";
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    if (std::getenv("NAPKIN_DEVICES") && path == std::getenv("NAPKIN_DEVICES"))
      return fmt::format("{}: no such device file (named by $NAPKIN_DEVICES; set it empty for none)", path);
    return "";
  }
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  if (!in) return fmt::format("{}: cannot read the device file", path);
  try {
    local_rows() = {path, devices_from_json(text.str(), path)};
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

std::string local_origin(const Device& device) {
  for (const Device& d : local_rows().devices)
    if (ir::iequals(d.name, device.name)) return local_rows().path;
  return "";
}

std::string devices_to_json(const std::vector<Device>& devices) {
  using nlohmann::json;
  json rows = json::array();
  for (const Device& d : devices) {
    json figures = json::object();
    for (const std::string& name : figure_names()) {
      if (name == "gemm_efficiency") continue;
      figures[name] = {{"value", figure_value(d, name)}, {"source", d.source_of(name)}};
    }
    json curves = json::object();
    for (const auto& [dtype, points] : d.gemm_efficiency) {
      json p = json::array();
      for (const auto& [dim, fraction] : points) p.push_back({dim, fraction});
      curves[dtype] = p;
    }
    figures["gemm_efficiency"] = {{"value", curves}, {"source", d.source_of("gemm_efficiency")}};
    rows.push_back({{"name", d.name}, {"description", d.description}, {"source", d.source}, {"figures", figures}});
  }
  return json{{"format", "napkin-devices-1"}, {"devices", rows}}.dump(2) + "\n";
}

std::vector<Device> devices_from_json(const std::string& text, const std::string& path) {
  using nlohmann::json;
  auto fail = [&](const std::string& what) { throw std::runtime_error(fmt::format("{}: {}", path, what)); };
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    fail(fmt::format("not a device file: {}", e.what()));
  }
  if (!j.is_object() || j.value("format", "") != "napkin-devices-1")
    fail("not a device file (expected an object with \"format\": \"napkin-devices-1\")");
  if (!j.contains("devices") || !j["devices"].is_array()) fail("\"devices\" must be an array");
  std::vector<Device> out;
  for (size_t i = 0; i < j["devices"].size(); ++i) {
    const json& row = j["devices"][i];
    std::string where = fmt::format("devices[{}]", i);
    if (!row.is_object() || !row.contains("name") || !row["name"].is_string() || row["name"].get<std::string>().empty())
      fail(where + ": needs a non-empty \"name\"");
    Device d;
    d.name = row["name"].get<std::string>();
    where = fmt::format("device '{}'", d.name);
    d.description = row.value("description", "");
    d.source = row.value("source", "");
    if (!row.contains("figures") || !row["figures"].is_object()) fail(where + ": needs \"figures\"");
    for (const auto& [name, figure] : row["figures"].items()) {
      if (std::find(figure_names().begin(), figure_names().end(), name) == figure_names().end())
        fail(fmt::format("{}: unknown figure '{}' (known: {})", where, name, fmt::join(figure_names(), ", ")));
      if (!figure.is_object() || !figure.contains("value") || !figure.contains("source") || !figure["source"].is_string() ||
          figure["source"].get<std::string>().empty())
        fail(fmt::format("{}: figure '{}' needs a \"value\" and a non-empty \"source\"", where, name));
      d.sources[name] = figure["source"].get<std::string>();
      if (name == "gemm_efficiency") {
        if (!figure["value"].is_object()) fail(where + ": gemm_efficiency's value maps a dtype to [[dim, fraction], ...]");
        for (const auto& [dtype, points] : figure["value"].items()) {
          GemmEfficiency curve;
          bool ok = points.is_array();
          for (const json& p : ok ? points : json::array()) {
            ok = ok && p.is_array() && p.size() == 2 && p[0].is_number() && p[1].is_number();
            if (!ok) break;
            double dim = p[0].get<double>(), fraction = p[1].get<double>();
            ok = dim >= 1 && fraction > 0 && fraction <= 1 && (curve.empty() || dim > curve.back().first);
            curve.emplace_back(dim, fraction);
          }
          if (!ok)
            fail(fmt::format("{}: gemm_efficiency '{}' must be [[dim, fraction], ...] with dims >= 1 ascending and "
                             "fractions in (0, 1]",
                             where, dtype));
          d.gemm_efficiency[dtype] = curve;
        }
        continue;
      }
      if (!figure["value"].is_number() || !std::isfinite(figure["value"].get<double>()) || figure["value"].get<double>() < 0)
        fail(fmt::format("{}: figure '{}' must be a finite number >= 0", where, name));
      d.*figure_member(name) = figure["value"].get<double>();
    }
    if (d.memory_bytes <= 0 || d.bandwidth_bytes_per_s <= 0 || d.fp32_flops <= 0)
      fail(where + ": needs memory, bandwidth and fp32 greater than 0");
    out.push_back(std::move(d));
  }
  return out;
}

double matmul_peak(const Device& device, ir::DType compute_dtype, bool allow_tf32) {
  return figure_value(device, peak_figure_name(device, compute_dtype, allow_tf32));
}

std::string_view peak_figure_name(const Device& device, ir::DType dtype, bool allow_tf32) {
  switch (dtype) {
    case ir::DType::F64: return "fp64";
    case ir::DType::F32: return allow_tf32 && device.tf32_flops > 0 ? "tf32" : "fp32";
    case ir::DType::BF16: return "bf16";
    case ir::DType::F16: return "fp16";
    case ir::DType::F8E4M3:
    case ir::DType::F8E5M2: return "fp8";
    case ir::DType::I32:
    case ir::DType::I64:
    case ir::DType::Bool: return "";  // integer matmuls are not in the table: no figure, peak 0
  }
  return "";
}

double vector_peak(const Device& device, ir::DType dtype) {
  return dtype == ir::DType::F64 ? device.fp64_flops : device.fp32_flops;
}

double gemm_efficiency(const Device& device, ir::DType compute_dtype, double narrowest) {
  auto it = device.gemm_efficiency.find(std::string(ir::dtype_name(compute_dtype)));
  if (it == device.gemm_efficiency.end() || it->second.empty()) return 1;
  const GemmEfficiency& c = it->second;
  if (narrowest <= c.front().first) return c.front().second;
  for (size_t i = 1; i < c.size(); ++i)
    if (narrowest <= c[i].first) {
      double t = (std::log2(narrowest) - std::log2(c[i - 1].first)) / (std::log2(c[i].first) - std::log2(c[i - 1].first));
      return c[i - 1].second + t * (c[i].second - c[i - 1].second);
    }
  return c.back().second;
}

}  // namespace napkin::analysis
