#include "tools/measure_device.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <memory>
#include <new>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "runtime/float_formats.h"
#include "runtime/gemm.h"
#include "runtime/thread_pool.h"

namespace napkin::tools {

namespace {

using runtime::Gemm;
using runtime::GemmType;
using runtime::MatmulDesc;
using runtime::ThreadPool;
using Clock = std::chrono::steady_clock;

constexpr double kMiB = 1024.0 * 1024.0;
constexpr double kGiB = kMiB * 1024.0;

// ---------------------------------------------------------------------------
// Timing

// Each figure is the best of `samples` samples, each repeating the work for at
// least `sample_seconds`: on a shared machine (a VM's vCPUs, other jobs) the
// best sample is the one least disturbed, which is the machine's capability.
struct Timing {
  int samples;
  double sample_seconds;
  std::string describe() const {
    return sample_seconds > 0 ? fmt::format("best of {} samples of >= {:.0f} ms", samples, sample_seconds * 1e3)
                              : fmt::format("best of {} single passes", samples);
  }
};

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Seconds per call of `work`: one untimed warm-up call (page faults, oneDNN
// primitives, caches, the pool's workers awake), one timed call to size the
// samples, then the best sample's time per call.
template <class Work>
double best_seconds_per_call(Work&& work, const Timing& timing) {
  work();
  Clock::time_point t0 = Clock::now();
  work();
  const double once = seconds_since(t0);
  const int64_t calls = std::max<int64_t>(1, int64_t(std::ceil(timing.sample_seconds / std::max(once, 1e-9))));
  double best = once;
  for (int s = 0; s < timing.samples; ++s) {
    t0 = Clock::now();
    for (int64_t c = 0; c < calls; ++c) work();
    best = std::min(best, seconds_since(t0) / double(calls));
  }
  return best;
}

// 64-byte aligned storage, left uninitialized: the pool first-touches it, as
// a trainer's arena is touched by the kernels that use it.
class Buffer {
 public:
  explicit Buffer(size_t bytes) : data_(std::aligned_alloc(64, (std::max<size_t>(bytes, 1) + 63) / 64 * 64)) {
    if (!data_) throw std::bad_alloc();
  }
  void* get() const { return data_.get(); }
  template <class T>
  T* as() const {
    return static_cast<T*>(data_.get());
  }

 private:
  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  std::unique_ptr<void, Free> data_;
};

// ---------------------------------------------------------------------------
// The host

std::string read_first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    // x86: "model name"; some other architectures: "Model" or "cpu model".
    if (line.rfind("model name", 0) == 0 || line.rfind("Model", 0) == 0 || line.rfind("cpu model", 0) == 0) {
      size_t colon = line.find(':');
      if (colon != std::string::npos) {
        std::string model = line.substr(colon + 1);
        model.erase(0, model.find_first_not_of(" \t"));
        if (!model.empty()) return model;
      }
    }
  }
  return "unknown CPU";
}

std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0 || !name[0]) return "unknown host";
  return name;
}

std::string today() {
  std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char date[16];
  std::strftime(date, sizeof date, "%Y-%m-%d", &local);
  return date;
}

std::vector<int> usable_cpus() {
  std::vector<int> cpus;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0)
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
  return cpus;
}

// CPU time of the whole machine and of this process, to tell how much of
// the CPUs other processes (and, on a VM, other guests: steal time) took
// while napkin measured: the figures are only as good as that is small.
struct CpuTimes {
  double machine_busy = 0;  // seconds, all CPUs: user, nice, system, irq, softirq, steal
  double self = 0;          // seconds of this process, all its threads
  Clock::time_point at = Clock::now();
};

CpuTimes cpu_times() {
  CpuTimes t;
  std::istringstream line(read_first_line("/proc/stat"));  // "cpu user nice system idle iowait irq softirq steal ..."
  std::string cpu;
  double user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
  line >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal;
  const double tick = double(sysconf(_SC_CLK_TCK));
  t.machine_busy = (user + nice + system + irq + softirq + steal) / tick;
  timespec self{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &self);
  t.self = double(self.tv_sec) + double(self.tv_nsec) * 1e-9;
  return t;
}

// The fraction of the machine's CPUs that others used between `start` and now.
double others_share(const CpuTimes& start, int cpus) {
  CpuTimes now = cpu_times();
  double wall = std::chrono::duration<double>(now.at - start.at).count();
  double others = (now.machine_busy - start.machine_busy) - (now.self - start.self);
  return std::clamp(others / (wall * std::max(cpus, 1)), 0.0, 1.0);
}

struct Memory {
  double bytes = 0;
  std::string how;
};

// Total RAM; a cgroup (container) limit below it wins, since that is all a
// trainer here may use.
Memory total_memory() {
  Memory m;
  m.bytes = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGESIZE));
  m.how = "total RAM (sysconf _SC_PHYS_PAGES x _SC_PAGESIZE, /proc/meminfo's MemTotal)";
  std::string limit = read_first_line("/sys/fs/cgroup/memory.max");
  char* end = nullptr;
  double cgroup = std::strtod(limit.c_str(), &end);
  if (!limit.empty() && end && *end == '\0' && cgroup > 0 && cgroup < m.bytes) {
    m.bytes = cgroup;
    m.how = "the cgroup's memory limit (/sys/fs/cgroup/memory.max), below the machine's total RAM";
  }
  return m;
}

// "32768K" -> 33554432; 0 when unreadable.
double parse_cache_size(const std::string& text) {
  char* end = nullptr;
  double v = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || v <= 0) return 0;
  if (*end == 'K') v *= 1024;
  else if (*end == 'M') v *= kMiB;
  else if (*end == 'G') v *= kGiB;
  return v;
}

struct LastLevelCache {
  double bytes = 0;  // what the pool's threads can hold: per instance x instances they reach
  std::string how;
};

// The last-level cache from the kernel's topology (/sys/devices/system/cpu):
// the highest data or unified level of the CPUs this process may use. Several
// instances (one per CCD or socket) add up, but no more of them than there
// are threads. sysconf(_SC_LEVEL3_CACHE_SIZE) is only the fallback: glibc
// reads it from cpuid, which under a hypervisor can describe the whole host
// (it says 320 MiB on napkin's development VM, whose guest has 32 MiB).
LastLevelCache last_level_cache(int threads) {
  struct Level {
    int level = 0;
    double size = 0;
    std::set<std::string> instances;  // by shared_cpu_list
  } best;
  for (int cpu : usable_cpus()) {
    for (int index = 0; index < 16; ++index) {
      std::string dir = fmt::format("/sys/devices/system/cpu/cpu{}/cache/index{}/", cpu, index);
      std::string level_text = read_first_line(dir + "level");
      if (level_text.empty()) break;
      std::string type = read_first_line(dir + "type");
      if (type != "Data" && type != "Unified") continue;
      int level = std::atoi(level_text.c_str());
      double size = parse_cache_size(read_first_line(dir + "size"));
      if (size <= 0 || level < best.level) continue;
      if (level > best.level) best = Level{level, size, {}};
      best.instances.insert(read_first_line(dir + "shared_cpu_list"));
    }
  }
  LastLevelCache llc;
  if (best.level > 0) {
    size_t reached = std::min<size_t>(best.instances.size(), size_t(threads));
    llc.bytes = best.size * double(reached);
    llc.how = fmt::format("the last-level cache, L{}: {:.4g} MiB per instance x {} instance{} ({} on the CPUs this process "
                          "may use, at most one per thread) (/sys/devices/system/cpu/cpu*/cache)",
                          best.level, best.size / kMiB, reached, reached == 1 ? "" : "s", best.instances.size());
    return llc;
  }
  for (auto [name, level] : {std::pair{_SC_LEVEL3_CACHE_SIZE, 3}, std::pair{_SC_LEVEL2_CACHE_SIZE, 2}}) {
    long size = sysconf(name);
    if (size > 0) {
      llc.bytes = double(size);
      llc.how = fmt::format("the L{} cache size from sysconf (no cache topology in /sys)", level);
      return llc;
    }
  }
  llc.how = "unknown: neither /sys/devices/system/cpu/cpu*/cache nor sysconf reports a cache (no cache level modelled)";
  return llc;
}

// ---------------------------------------------------------------------------
// Loops. Compiled with napkin's own flags (CMake's Release: -O3, no fast
// math) plus -ffp-contract=off (tools/CMakeLists.txt): a multiply and an add
// stay two instructions, as in the trainer's kernels, which LLVM emits
// without fast-math flags. The trainer's LLVM kernels are compiled for the
// host CPU's features, so these loops are cloned per vector ISA and the
// widest one the host has runs (GCC function multiversioning).

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define NAPKIN_HOST_ISA __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define NAPKIN_HOST_ISA
#endif

// STREAM's triad.
NAPKIN_HOST_ISA __attribute__((noinline)) void triad(float* __restrict a, const float* __restrict b,
                                                     const float* __restrict c, float s, int64_t n) {
  for (int64_t i = 0; i < n; ++i) a[i] = b[i] + s * c[i];
}

// Eight dependent multiply-adds per element: 16 FLOPs as napkin's op table
// counts them (one per mul, one per add). A fused elementwise kernel is such
// a chain per element; with x = 1, a = b = 0.5 every value stays 1 (no
// denormals, no overflow).
constexpr int kChainFlops = 16;
NAPKIN_HOST_ISA __attribute__((noinline)) void multiply_add_chain(float* __restrict x, float a, float b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    float v = x[i];
    for (int r = 0; r < kChainFlops / 2; ++r) v = v * a + b;
    x[i] = v;
  }
}

// Three arrays of `n` floats for the triad, first touched by the pool.
struct TriadArrays {
  int64_t n;
  Buffer a, b, c;
  TriadArrays(int64_t n, ThreadPool& pool) : n(n), a(n * 4), b(n * 4), c(n * 4) {
    pool.parallel_for(n, [&](int64_t begin, int64_t end) {
      std::fill(a.as<float>() + begin, a.as<float>() + end, 0.0f);
      std::fill(b.as<float>() + begin, b.as<float>() + end, 1.0f);
      std::fill(c.as<float>() + begin, c.as<float>() + end, 2.0f);
    });
  }
  // `passes` triads over each worker's chunk in one parallel_for: repeating
  // inside the chunk keeps the dispatch out of a cache-resident figure.
  void run(ThreadPool& pool, int passes) {
    pool.parallel_for(n, [&](int64_t begin, int64_t end) {
      for (int p = 0; p < passes; ++p)
        triad(a.as<float>() + begin, b.as<float>() + begin, c.as<float>() + begin, 3.0f, end - begin);
    });
  }
};

// Bytes per second of the triad, counting 12 bytes per element and pass.
double triad_bandwidth(TriadArrays& arrays, ThreadPool& pool, int passes_per_call, const Timing& timing) {
  double seconds = best_seconds_per_call([&] { arrays.run(pool, passes_per_call); }, timing);
  return 12.0 * double(arrays.n) * passes_per_call / seconds;
}

// ---------------------------------------------------------------------------
// GEMMs

size_t element_bytes(GemmType t) {
  switch (t) {
    case GemmType::F64: return 8;
    case GemmType::F32: return 4;
    case GemmType::BF16:
    case GemmType::F16: return 2;
  }
  return 4;
}

// Values in [-1, 1) from a fixed generator: the same operands every run.
void fill_operand(void* data, int64_t count, GemmType type) {
  uint32_t state = 12345;
  for (int64_t i = 0; i < count; ++i) {
    state = state * 1664525u + 1013904223u;
    float v = float(state >> 8) / float(1 << 24) * 2.0f - 1.0f;
    switch (type) {
      case GemmType::F32: static_cast<float*>(data)[i] = v; break;
      case GemmType::F64: static_cast<double*>(data)[i] = v; break;
      case GemmType::BF16: static_cast<uint16_t*>(data)[i] = runtime::float_to_bf16_bits(v); break;
      case GemmType::F16: static_cast<uint16_t*>(data)[i] = runtime::float_to_f16_bits(v); break;
    }
  }
}

struct GemmShape {
  int64_t batch = 1, m, n, k;
  std::string name() const {
    return batch > 1 ? fmt::format("{} x {}x{}x{}", batch, m, n, k) : fmt::format("{}x{}x{}", m, n, k);
  }
  MatmulDesc desc() const {
    MatmulDesc d = MatmulDesc::plain(m, n, k);
    if (batch > 1) {
      d.batch = {batch};
      d.a_batch_stride = {m * k};
      d.b_batch_stride = {k * n};
      d.c_batch_stride = {m * n};
    }
    return d;
  }
};

// FLOP/s of runtime::Gemm with A, B and C of `type` (bf16: fp32 accumulation,
// C rounded once), run in the pool as the trainer runs it.
double gemm_flops_per_s(const GemmShape& shape, GemmType type, ThreadPool& pool, const Timing& timing) {
  Gemm gemm(shape.desc(), {type, type});
  const size_t bytes = element_bytes(type);
  Buffer a(shape.batch * shape.m * shape.k * bytes), b(shape.batch * shape.k * shape.n * bytes),
      c(shape.batch * shape.m * shape.n * bytes);
  fill_operand(a.get(), shape.batch * shape.m * shape.k, type);
  fill_operand(b.get(), shape.batch * shape.k * shape.n, type);
  gemm.prepare(pool.num_threads());
  double seconds = best_seconds_per_call([&] { gemm.run(a.get(), b.get(), c.get(), pool); }, timing);
  return gemm.flops() / seconds;
}

struct GemmKind {
  GemmType type;
  const char* figure;      // "fp32": the peak's figure name
  const char* curve;       // "f32": the gemm_efficiency key
  const char* how;         // how runtime::Gemm runs it
  std::vector<GemmShape> peak_shapes;
  // The shapes whose narrowest dim is d (d: the curve's points).
  std::vector<GemmShape> (*curve_shapes)(int64_t d, bool quick);
};

// The other dims of a narrow shape: at least the widest curve point (256).
// f64 is napkin's plain loop, ~15x slower than f32: smaller.
int64_t wide_dim(GemmType type, bool quick) {
  if (type == GemmType::F64) return quick ? 256 : 512;
  return quick ? 512 : 1024;
}

// Where a GEMM is narrow in a model: a thin output (n = d: a classifier
// head, a projection to few features), a thin contraction (k = d) and, for
// head dims 16 to 128, batched attention (64 heads x 128 positions: q k^T
// contracts over d, probs v outputs d columns). 64 x 128 x 128 = 1024 x 1024,
// so every shape at one d does the same FLOPs (the quick wide is smaller).
std::vector<GemmShape> narrow_shapes(int64_t d, bool quick) {
  const int64_t wide = wide_dim(GemmType::F32, quick);
  std::vector<GemmShape> shapes = {{1, wide, d, wide}, {1, wide, wide, d}};
  if (!quick && d >= 16 && d <= 128) {
    shapes.push_back({64, 128, 128, d});
    shapes.push_back({64, 128, d, 128});
  }
  return shapes;
}

std::vector<GemmShape> narrow_shapes_f64(int64_t d, bool quick) {
  const int64_t wide = wide_dim(GemmType::F64, quick);
  return {{1, wide, d, wide}, {1, wide, wide, d}};
}

std::vector<GemmKind> gemm_kinds(bool quick) {
  // Peaks: a big square GEMM and the char-level GPT's MLP shapes (2048 tokens,
  // d = 256, hidden = 1024), which the trainer's step spends most time in.
  std::vector<GemmShape> peak = quick ? std::vector<GemmShape>{{1, 1024, 1024, 1024}, {1, 1024, 1024, 256}}
                                      : std::vector<GemmShape>{{1, 2048, 2048, 2048}, {1, 2048, 1024, 256}, {1, 2048, 256, 1024}};
  std::vector<GemmShape> peak_f64 = quick ? std::vector<GemmShape>{{1, 256, 256, 256}} : std::vector<GemmShape>{{1, 512, 512, 512}};
  return {
      {GemmType::F32, "fp32", "f32", "oneDNN sgemm, single-threaded, in napkin's ThreadPool", peak, narrow_shapes},
      {GemmType::BF16, "bf16", "bf16",
       "A, B and C bf16, fp32 accumulation (oneDNN's bf16 matmul primitive or fp32 panels, as runtime::Gemm chooses)",
       peak, narrow_shapes},
      {GemmType::F64, "fp64", "f64", "napkin's plain fp64 loop", peak_f64, narrow_shapes_f64},
  };
}

// The curve's points: the narrowest dims of the GEMMs in napkin's models.
const std::vector<int64_t> kCurveDims = {1, 8, 16, 32, 64, 128, 256};

std::string list_results(const std::vector<std::pair<std::string, double>>& results) {
  std::vector<std::string> parts;
  for (const auto& [name, flops] : results) parts.push_back(fmt::format("{} {:.1f}", name, flops / 1e9));
  return fmt::format("{}", fmt::join(parts, ", "));
}

// What every measurement shares: the pool it runs in, how long it times, and
// where its figures and their sources go.
struct Bench {
  passes::Device& device;
  ThreadPool& pool;
  int threads;
  bool quick;
  Timing timing;
  std::string prefix;  // "measured by `napkin devices --measure` on HOST, DATE, N threads"
  std::function<void(const std::string&)> progress;

  void set(const std::string& figure, double* slot, double value, const std::string& how) {
    if (slot) *slot = value;
    device.sources[figure] = prefix + ": " + how;
  }
};

// The fp32, bf16 and fp64 peaks and the gemm_efficiency curves against them.
// A peak is the best GFLOP/s of every shape measured for the dtype, the
// curve's too: a narrow shape that beat the big ones would otherwise read as
// more than 100% MFU.
void measure_gemms(Bench& b) {
  std::vector<std::string> curve_notes;
  for (const GemmKind& kind : gemm_kinds(b.quick)) {
    std::vector<std::pair<std::string, double>> results;
    double peak = 0;
    std::string peak_shape;
    auto run = [&](const GemmShape& shape) {
      double flops = gemm_flops_per_s(shape, kind.type, b.pool, b.timing);
      if (flops > peak) peak = flops, peak_shape = shape.name();
      return flops;
    };
    for (const GemmShape& shape : kind.peak_shapes) {
      b.progress(fmt::format("{} GEMM {} ...", kind.curve, shape.name()));
      results.emplace_back(shape.name(), run(shape));
    }
    b.progress(fmt::format("{} GEMM narrow shapes ...", kind.curve));
    std::vector<std::vector<std::pair<std::string, double>>> at_dims;
    for (int64_t dim : kCurveDims) {
      at_dims.emplace_back();
      for (const GemmShape& shape : kind.curve_shapes(dim, b.quick)) at_dims.back().emplace_back(shape.name(), run(shape));
    }
    double* slot = kind.type == GemmType::F32 ? &b.device.fp32_flops
                   : kind.type == GemmType::BF16 ? &b.device.bf16_flops
                                                 : &b.device.fp64_flops;
    b.set(kind.figure, slot, peak,
          fmt::format("runtime::Gemm {} ({}): the best GFLOP/s of m x n x k = {} and of the gemm_efficiency shapes "
                      "(best: {}); each {}",
                      kind.curve, kind.how, list_results(results), peak_shape, b.timing.describe()));
    b.progress(fmt::format("{} peak {:.1f} GFLOP/s ({})", kind.curve, peak / 1e9, peak_shape));

    passes::GemmEfficiency curve;
    std::vector<std::string> points;
    for (size_t i = 0; i < kCurveDims.size(); ++i) {
      // The shapes at one dim do the same FLOPs: their combined rate is the
      // harmonic mean, what a step running each once would reach.
      double seconds_per_flop = 0;
      for (const auto& [name, flops] : at_dims[i]) seconds_per_flop += 1.0 / flops / double(at_dims[i].size());
      const double fraction = std::clamp(1.0 / seconds_per_flop / peak, 1e-6, 1.0);
      curve.emplace_back(double(kCurveDims[i]), fraction);
      b.progress(fmt::format("{} narrowest {:>3}: {:.3f} of peak ({} GFLOP/s)", kind.curve, kCurveDims[i], fraction,
                             list_results(at_dims[i])));
      points.push_back(fmt::format("{}: {:.3f} ({})", kCurveDims[i], fraction, list_results(at_dims[i])));
    }
    b.device.gemm_efficiency[kind.curve] = curve;
    curve_notes.push_back(fmt::format("{} [{}]", kind.curve, fmt::join(points, "; ")));
  }
  b.set("gemm_efficiency", nullptr, 0,
        fmt::format("for each dtype and narrowest dim d, the combined rate (harmonic mean: the shapes do equal FLOPs) "
                    "of runtime::Gemm on m x n x k = wide x d x wide and wide x wide x d (wide = {} for f32 and bf16, "
                    "{} for f64){}, as a fraction of that dtype's peak, {}: {}",
                    wide_dim(GemmType::F32, b.quick), wide_dim(GemmType::F64, b.quick),
                    b.quick ? "" : " and, for 16 <= d <= 128, attention's 64 x 128x128xd and 64 x 128xdx128",
                    b.timing.describe(), fmt::join(curve_notes, "; ")));

  b.set("tf32", &b.device.tf32_flops, 0, "0: no tf32 arithmetic on a CPU");
  b.set("fp16", &b.device.fp16_flops, 0, "0: no fp16 arithmetic used on this CPU (napkin's f16 GEMM widens to fp32)");
  b.set("fp8", &b.device.fp8_flops, 0, "0: no fp8 arithmetic on a CPU");
}

// The last-level cache and its bandwidth, then main memory's bandwidth.
void measure_bandwidths(Bench& b, double memory_bytes) {
  const LastLevelCache llc = last_level_cache(b.threads);
  b.set("cache_bytes", &b.device.cache_bytes, llc.bytes, llc.how);
  if (llc.bytes > 0) {
    // Half the cache, so that the three arrays stay in it with room for the rest.
    const int64_t n = std::max<int64_t>(int64_t(llc.bytes / 2 / 12), 1024 * b.threads);
    TriadArrays arrays(n, b.pool);
    b.progress(fmt::format("cache triad over 3 x {:.3g} MiB ...", n * 4 / kMiB));
    constexpr int kPassesPerCall = 20;
    b.set("cache_bandwidth", &b.device.cache_bandwidth_bytes_per_s,
          triad_bandwidth(arrays, b.pool, kPassesPerCall, b.timing),
          fmt::format("STREAM triad a[i] = b[i] + s * c[i] over 3 arrays of {:.3g} MiB of floats (half of cache_bytes), "
                      "split over the ThreadPool, {} passes per chunk per dispatch, 12 bytes counted per element and "
                      "pass (see bandwidth), {}",
                      n * 4 / kMiB, kPassesPerCall, b.timing.describe()));
    b.progress(fmt::format("cache bandwidth {:.1f} GB/s", b.device.cache_bandwidth_bytes_per_s / 1e9));
  } else {
    b.set("cache_bandwidth", &b.device.cache_bandwidth_bytes_per_s, 0, "0: no cache level known (see cache_bytes)");
  }

  // Far beyond the last-level cache, and at most a sixteenth of memory.
  const double array_bytes = std::min(std::max(b.quick ? 64 * kMiB : 256 * kMiB, 4 * llc.bytes), memory_bytes / 16);
  const int64_t n = int64_t(array_bytes / 4);
  b.progress(fmt::format("memory triad over 3 x {:.0f} MiB ...", n * 4 / kMiB));
  TriadArrays arrays(n, b.pool);
  const Timing passes{b.quick ? 3 : 10, 0};
  b.set("bandwidth", &b.device.bandwidth_bytes_per_s, triad_bandwidth(arrays, b.pool, 1, passes),
        fmt::format("STREAM triad a[i] = b[i] + s * c[i] over 3 arrays of {:.0f} MiB of floats, split over the "
                    "ThreadPool as an elementwise kernel is, {}; 12 bytes counted per element (b and c read, a "
                    "written) as napkin's cost model counts a kernel's bytes, so the write-allocate read of a "
                    "(ordinary stores, as the trainer's kernels make) is paid for but not counted",
                    n * 4 / kMiB, passes.describe()));
  b.progress(fmt::format("memory bandwidth {:.1f} GB/s", b.device.bandwidth_bytes_per_s / 1e9));
}

// FLOP/s of a compute-bound elementwise loop: the ceiling of a loop kernel.
void measure_loop(Bench& b) {
  // 8 KiB of floats per thread: resident in any L1 data cache.
  const int64_t n = 2048 * int64_t(b.threads);
  Buffer x(n * 4);
  b.pool.parallel_for(n, [&](int64_t begin, int64_t end) { std::fill(x.as<float>() + begin, x.as<float>() + end, 1.0f); });
  constexpr int kPassesPerCall = 200;
  b.progress("elementwise loop ...");
  double seconds = best_seconds_per_call(
      [&] {
        b.pool.parallel_for(n, [&](int64_t begin, int64_t end) {
          for (int p = 0; p < kPassesPerCall; ++p) multiply_add_chain(x.as<float>() + begin, 0.5f, 0.5f, end - begin);
        });
      },
      b.timing);
  b.set("loop_flops", &b.device.loop_flops, double(kChainFlops) * double(n) * kPassesPerCall / seconds,
        fmt::format("a loop of {} dependent multiplies and adds per element (x = x * a + b, one FLOP each as napkin's "
                    "op table counts) over 8 KiB of floats per thread (L1-resident), split over the ThreadPool, {} "
                    "passes per dispatch; compiled by napkin's C++ compiler at its Release flags with "
                    "-ffp-contract=off (no fast math, no FMAs, like the trainer's LLVM kernels) for the host's widest "
                    "vector ISA; {}",
                    kChainFlops, kPassesPerCall, b.timing.describe()));
  b.progress(fmt::format("loop {:.1f} GFLOP/s", b.device.loop_flops / 1e9));
}

// A kernel's fixed cost on a CPU trainer: one dispatch to the pool.
void measure_launch(Bench& b) {
  b.progress("thread pool dispatch ...");
  b.set("launch_seconds", &b.device.launch_seconds,
        best_seconds_per_call([&] { b.pool.parallel_for(b.threads, [](int64_t, int64_t) {}); }, b.timing),
        fmt::format("the mean time of an empty ThreadPool::parallel_for over {} chunks, back to back (the workers "
                    "still spinning, as between a step's kernels), {}",
                    b.threads, b.timing.describe()));
  b.progress(fmt::format("dispatch {:.2f} us", b.device.launch_seconds * 1e6));
}

}  // namespace

passes::Device measure_host(const MeasureOptions& options) {
  const int threads = options.threads > 0 ? options.threads : runtime::default_thread_count();
  ThreadPool pool(threads);
  passes::Device device;
  device.name = "cpu";
  const std::string host = host_name();
  Bench b{device,
          pool,
          threads,
          options.quick,
          options.quick ? Timing{3, 0.01} : Timing{5, 0.05},
          fmt::format("measured by `napkin devices --measure{}` on {}, {}, {} thread{}", options.quick ? " --quick" : "",
                      host, today(), threads, threads == 1 ? "" : "s"),
          [&](const std::string& line) {
            if (options.progress) options.progress(line);
          }};

  const size_t cpus = usable_cpus().size();
  const Memory memory = total_memory();
  device.description = fmt::format("{}, {} thread{} on {} logical CPU{}, host {}, {:.1f} GiB", cpu_model(), threads,
                                   threads == 1 ? "" : "s", cpus, cpus == 1 ? "" : "s", host, memory.bytes / kGiB);
  // Other processes on the CPUs halve a figure as easily as a slow machine
  // does: warn at once when the machine is busy (a quarter second's sample:
  // the load average lags by a minute), and say in the row how much of the
  // CPUs others took while measuring.
  const int machine_cpus = std::max<int>(1, int(sysconf(_SC_NPROCESSORS_ONLN)));
  {
    const CpuTimes before = cpu_times();
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
    if (double busy = others_share(before, machine_cpus); busy >= 0.05)
      b.progress(fmt::format("warning: other processes are using {:.0f}% of the {} CPUs, so the figures may come out "
                             "low; measure on a quiet machine",
                             busy * 100, machine_cpus));
  }
  const CpuTimes start = cpu_times();
  b.set("memory", &device.memory_bytes, memory.bytes, memory.how);

  measure_gemms(b);
  measure_bandwidths(b, memory.bytes);
  measure_loop(b);
  measure_launch(b);

  const double others = others_share(start, machine_cpus);
  if (others >= 0.05)
    b.progress(fmt::format("warning: other processes (or other guests of this VM) took {:.0f}% of the {} CPUs while "
                           "measuring, so the figures are low; measure again on a quiet machine",
                           others * 100, machine_cpus));
  device.source = fmt::format("{}; other processes took {:.0f}% of the {} CPUs meanwhile{}", b.prefix, others * 100,
                              machine_cpus, options.quick ? "; --quick: small problems and few samples, rough figures" : "");
  return device;
}

}  // namespace napkin::tools
