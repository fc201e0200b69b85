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

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// How long each benchmark is timed: the best of `samples` samples, each
// repeating the work for at least `sample_seconds` (0: one call).
struct Timing {
  int samples;
  double sample_seconds;
};

// Benchmarks timed in rounds: each is warmed up once (page faults, oneDNN
// primitives, caches, the pool's workers awake) and sized to a sample when
// added, then every round takes one sample of each in turn. A benchmark's
// samples spread over the whole run, so a burst of contention the guest
// cannot see (another VM on the same physical core: no steal time) must last
// the whole run to lower its figure; the best sample is the machine's
// capability.
class Rounds {
 public:
  explicit Rounds(Timing timing) : timing_(timing) {}

  size_t add(std::function<void()> work) {
    work();
    Clock::time_point t0 = Clock::now();
    work();
    const double once = seconds_since(t0);
    const int64_t calls = std::max<int64_t>(1, int64_t(std::ceil(timing_.sample_seconds / std::max(once, 1e-9))));
    entries_.push_back({std::move(work), calls, once});
    return entries_.size() - 1;
  }

  void run(const std::function<void(int round)>& before_round = {}) {
    for (int round = 0; round < timing_.samples; ++round) {
      if (before_round) before_round(round);
      for (Entry& e : entries_) {
        Clock::time_point t0 = Clock::now();
        for (int64_t c = 0; c < e.calls; ++c) e.work();
        e.best = std::min(e.best, seconds_since(t0) / double(e.calls));
      }
    }
  }

  double seconds_per_call(size_t id) const { return entries_[id].best; }
  size_t size() const { return entries_.size(); }
  // For the sources: "best of 5 samples of >= 50 ms, in rounds over 37 benchmarks".
  std::string describe() const {
    std::string samples = timing_.sample_seconds > 0
                              ? fmt::format("best of {} samples of >= {:.0f} ms", timing_.samples, timing_.sample_seconds * 1e3)
                              : fmt::format("best of {} single passes", timing_.samples);
    return entries_.size() > 1 ? fmt::format("{}, taken in rounds over {} benchmarks", samples, entries_.size()) : samples;
  }

 private:
  struct Entry {
    std::function<void()> work;
    int64_t calls;
    double best;  // seconds per call
  };
  Timing timing_;
  std::vector<Entry> entries_;
};

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

// One exp per element: the library call a loop kernel makes for softmax,
// the losses, sigmoid and silu (gelu's tanh is dearer as a scalar call but
// vectorizes in elementwise kernels; exp is the figure's one function).
NAPKIN_HOST_ISA __attribute__((noinline)) void exp_loop(const float* __restrict in, float* __restrict out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = std::exp(in[i]);
}
constexpr int kTranscendentalsPerElement = 1;

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

// ---------------------------------------------------------------------------
// GEMMs

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

// One runtime::Gemm with its operands, of `type` (bf16: fp32 accumulation,
// C rounded once), run in the pool as the trainer runs it.
struct GemmBench {
  GemmShape shape;
  Gemm gemm;
  Buffer a, b, c;
  GemmBench(const GemmShape& shape, GemmType type, int threads)
      : shape(shape),
        gemm(shape.desc(), {type, type}),
        a(shape.batch * shape.m * shape.k * runtime::gemm_type_bytes(type)),
        b(shape.batch * shape.k * shape.n * runtime::gemm_type_bytes(type)),
        c(shape.batch * shape.m * shape.n * runtime::gemm_type_bytes(type)) {
    fill_operand(a.get(), shape.batch * shape.m * shape.k, type);
    fill_operand(b.get(), shape.batch * shape.k * shape.n, type);
    gemm.prepare(threads);
  }
};

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

// What every measurement shares: the pool it runs in, how long it times, and
// where its figures and their sources go.
struct Bench {
  analysis::Device& device;
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

// A GEMM in the rounds: its operands, and its benchmark id.
struct TimedGemm {
  std::unique_ptr<GemmBench> bench;
  size_t id;
  double flops_per_s(const Rounds& rounds) const { return bench->gemm.flops() / rounds.seconds_per_call(id); }
};

struct GemmKindTimings {
  GemmKind kind;
  std::vector<TimedGemm> peak_shapes;
  std::vector<std::vector<TimedGemm>> at_dims;  // by kCurveDims
};

std::vector<GemmKindTimings> add_gemms(Bench& b, Rounds& rounds) {
  std::vector<GemmKindTimings> kinds;
  for (const GemmKind& kind : gemm_kinds(b.quick)) {
    b.progress(fmt::format("{} GEMMs ...", kind.curve));
    GemmKindTimings t{kind, {}, {}};
    auto timed = [&](const GemmShape& shape) {
      auto bench = std::make_unique<GemmBench>(shape, kind.type, b.threads);
      GemmBench* g = bench.get();
      size_t id = rounds.add([g, &pool = b.pool] { g->gemm.run(g->a.get(), g->b.get(), g->c.get(), pool); });
      return TimedGemm{std::move(bench), id};
    };
    for (const GemmShape& shape : kind.peak_shapes) t.peak_shapes.push_back(timed(shape));
    for (int64_t dim : kCurveDims) {
      t.at_dims.emplace_back();
      for (const GemmShape& shape : kind.curve_shapes(dim, b.quick)) t.at_dims.back().push_back(timed(shape));
    }
    kinds.push_back(std::move(t));
  }
  return kinds;
}

std::string list_results(const std::vector<TimedGemm>& gemms, const Rounds& rounds) {
  std::vector<std::string> parts;
  for (const TimedGemm& g : gemms) parts.push_back(fmt::format("{} {:.1f}", g.bench->shape.name(), g.flops_per_s(rounds) / 1e9));
  return fmt::format("{}", fmt::join(parts, ", "));
}

// The fp32, bf16 and fp64 peaks and the gemm_efficiency curves against them.
// A peak is the best GFLOP/s of every shape measured for the dtype, the
// curve's too: a narrow shape that beat the big ones would otherwise read as
// more than 100% MFU.
void record_gemms(Bench& b, const std::vector<GemmKindTimings>& kinds, const Rounds& rounds) {
  std::vector<std::string> curve_notes;
  for (const GemmKindTimings& t : kinds) {
    const GemmKind& kind = t.kind;
    const TimedGemm* best = nullptr;
    auto consider = [&](const TimedGemm& g) {
      if (!best || g.flops_per_s(rounds) > best->flops_per_s(rounds)) best = &g;
    };
    for (const TimedGemm& g : t.peak_shapes) consider(g);
    for (const auto& at_dim : t.at_dims)
      for (const TimedGemm& g : at_dim) consider(g);
    const double peak = best->flops_per_s(rounds);
    double* slot = kind.type == GemmType::F32    ? &b.device.fp32_flops
                   : kind.type == GemmType::BF16 ? &b.device.bf16_flops
                                                 : &b.device.fp64_flops;
    b.set(kind.figure, slot, peak,
          fmt::format("runtime::Gemm {} ({}): the best GFLOP/s of m x n x k = {} and of the gemm_efficiency shapes "
                      "(best: {}); each the {}",
                      kind.curve, kind.how, list_results(t.peak_shapes, rounds), best->bench->shape.name(),
                      rounds.describe()));
    b.progress(fmt::format("{} peak {:.1f} GFLOP/s ({}; {})", kind.curve, peak / 1e9, best->bench->shape.name(),
                           list_results(t.peak_shapes, rounds)));

    analysis::GemmEfficiency curve;
    std::vector<std::string> points;
    for (size_t i = 0; i < kCurveDims.size(); ++i) {
      // The shapes at one dim do the same FLOPs: their combined rate is the
      // harmonic mean, what a step running each once would reach.
      double seconds_per_flop = 0;
      for (const TimedGemm& g : t.at_dims[i]) seconds_per_flop += 1.0 / g.flops_per_s(rounds) / double(t.at_dims[i].size());
      const double fraction = std::clamp(1.0 / seconds_per_flop / peak, 1e-6, 1.0);
      curve.emplace_back(double(kCurveDims[i]), fraction);
      const std::string shapes = list_results(t.at_dims[i], rounds);
      b.progress(fmt::format("{} narrowest {:>3}: {:.3f} of peak ({} GFLOP/s)", kind.curve, kCurveDims[i], fraction, shapes));
      points.push_back(fmt::format("{}: {:.3f} ({})", kCurveDims[i], fraction, shapes));
    }
    b.device.gemm_efficiency[kind.curve] = curve;
    curve_notes.push_back(fmt::format("{} [{}]", kind.curve, fmt::join(points, "; ")));
  }
  b.set("gemm_efficiency", nullptr, 0,
        fmt::format("for each dtype and narrowest dim d, the combined rate (harmonic mean: the shapes do equal FLOPs) "
                    "of runtime::Gemm on m x n x k = wide x d x wide and wide x wide x d (wide = {} for f32 and bf16, "
                    "{} for f64){}, as a fraction of that dtype's peak, each the {}: {}",
                    wide_dim(GemmType::F32, b.quick), wide_dim(GemmType::F64, b.quick),
                    b.quick ? "" : " and, for 16 <= d <= 128, attention's 64 x 128x128xd and 64 x 128xdx128",
                    rounds.describe(), fmt::join(curve_notes, "; ")));

  b.set("tf32", &b.device.tf32_flops, 0, "0: no tf32 arithmetic on a CPU");
  b.set("fp16", &b.device.fp16_flops, 0, "0: no fp16 arithmetic used on this CPU (napkin's f16 GEMM widens to fp32)");
  b.set("fp8", &b.device.fp8_flops, 0, "0: no fp8 arithmetic on a CPU");
}

// A triad in the rounds: its arrays, the passes per call, its benchmark id.
struct TimedTriad {
  std::unique_ptr<TriadArrays> arrays;
  int passes_per_call = 1;
  size_t id = 0;
  double bytes_per_s(const Rounds& rounds) const {
    return 12.0 * double(arrays->n) * passes_per_call / rounds.seconds_per_call(id);
  }
};

TimedTriad add_triad(Bench& b, Rounds& rounds, int64_t n, int passes_per_call) {
  TimedTriad t{std::make_unique<TriadArrays>(n, b.pool), passes_per_call, 0};
  TriadArrays* arrays = t.arrays.get();
  t.id = rounds.add([arrays, passes_per_call, &pool = b.pool] { arrays->run(pool, passes_per_call); });
  return t;
}

// Over arrays that fit the last-level cache (none without one): half the
// cache, so that the three arrays stay in it with room for the rest. 20
// passes per chunk per dispatch keep the dispatch out of the figure.
TimedTriad add_cache_triad(Bench& b, Rounds& rounds, const LastLevelCache& llc) {
  if (llc.bytes <= 0) return {};
  const int64_t n = std::max<int64_t>(int64_t(llc.bytes / 2 / 12), 1024 * b.threads);
  b.progress(fmt::format("cache triad over 3 x {:.3g} MiB ...", n * 4 / kMiB));
  return add_triad(b, rounds, n, 20);
}

// Over arrays far beyond the last-level cache, at most a sixteenth of
// memory each.
TimedTriad add_memory_triad(Bench& b, Rounds& rounds, const LastLevelCache& llc, double memory_bytes) {
  const double array_bytes = std::min(std::max(b.quick ? 64 * kMiB : 256 * kMiB, 4 * llc.bytes), memory_bytes / 16);
  const int64_t n = int64_t(array_bytes / 4);
  b.progress(fmt::format("memory triad over 3 x {:.0f} MiB ...", n * 4 / kMiB));
  return add_triad(b, rounds, n, 1);
}

void record_bandwidths(Bench& b, const LastLevelCache& llc, const TimedTriad& cache, const TimedTriad& memory,
                       const Rounds& rounds) {
  b.set("cache_bytes", &b.device.cache_bytes, llc.bytes, llc.how);
  if (cache.arrays) {
    b.set("cache_bandwidth", &b.device.cache_bandwidth_bytes_per_s, cache.bytes_per_s(rounds),
          fmt::format("STREAM triad a[i] = b[i] + s * c[i] over 3 arrays of {:.3g} MiB of floats (half of "
                      "cache_bytes), split over the ThreadPool, {} passes per chunk per dispatch, 12 bytes counted per "
                      "element and pass (see bandwidth), the {}",
                      double(cache.arrays->n) * 4 / kMiB, cache.passes_per_call, rounds.describe()));
  } else {
    b.set("cache_bandwidth", &b.device.cache_bandwidth_bytes_per_s, 0, "0: no cache level known (see cache_bytes)");
  }
  b.set("bandwidth", &b.device.bandwidth_bytes_per_s, memory.bytes_per_s(rounds),
        fmt::format("STREAM triad a[i] = b[i] + s * c[i] over 3 arrays of {:.0f} MiB of floats, split over the "
                    "ThreadPool as an elementwise kernel is, the {}; 12 bytes counted per element (b and c read, a "
                    "written) as napkin's cost model counts a kernel's bytes, so the write-allocate read of a "
                    "(ordinary stores, as the trainer's kernels make) is paid for but not counted",
                    double(memory.arrays->n) * 4 / kMiB, rounds.describe()));
  b.progress(fmt::format("cache bandwidth {:.1f} GB/s, memory bandwidth {:.1f} GB/s",
                         b.device.cache_bandwidth_bytes_per_s / 1e9, b.device.bandwidth_bytes_per_s / 1e9));
}

// A compute-bound elementwise loop: the ceiling of a loop kernel.
struct Loop {
  int64_t n;
  Buffer x;
  size_t id = 0;
  static constexpr int kPassesPerCall = 200;
  explicit Loop(int64_t n) : n(n), x(n * 4) {}
};

std::unique_ptr<Loop> add_loop(Bench& b, Rounds& rounds) {
  b.progress("elementwise loop ...");
  // 8 KiB of floats per thread: resident in any L1 data cache.
  auto loop = std::make_unique<Loop>(2048 * int64_t(b.threads));
  Loop* l = loop.get();
  b.pool.parallel_for(l->n, [l](int64_t begin, int64_t end) { std::fill(l->x.as<float>() + begin, l->x.as<float>() + end, 1.0f); });
  loop->id = rounds.add([l, &pool = b.pool] {
    pool.parallel_for(l->n, [l](int64_t begin, int64_t end) {
      for (int p = 0; p < Loop::kPassesPerCall; ++p) multiply_add_chain(l->x.as<float>() + begin, 0.5f, 0.5f, end - begin);
    });
  });
  return loop;
}

void record_loop(Bench& b, const Loop& loop, const Rounds& rounds) {
  b.set("loop_flops", &b.device.loop_flops,
        double(kChainFlops) * double(loop.n) * Loop::kPassesPerCall / rounds.seconds_per_call(loop.id),
        fmt::format("a loop of {} dependent multiplies and adds per element (x = x * a + b, one FLOP each as napkin's "
                    "op table counts) over 8 KiB of floats per thread (L1-resident), split over the ThreadPool, {} "
                    "passes per dispatch; compiled by napkin's C++ compiler at its Release flags with "
                    "-ffp-contract=off (no fast math, no FMAs, like the trainer's LLVM kernels) for the host's widest "
                    "vector ISA; the {}",
                    kChainFlops, Loop::kPassesPerCall, rounds.describe()));
  b.progress(fmt::format("loop {:.1f} GFLOP/s", b.device.loop_flops / 1e9));
}

// Transcendental functions in a loop over L1-resident floats.
std::unique_ptr<Loop> add_transcendentals(Bench& b, Rounds& rounds) {
  b.progress("exp loop ...");
  // Inputs (the first half) in [-1, 1): no special cases; results in the second half.
  auto loop = std::make_unique<Loop>(2 * 2048 * int64_t(b.threads));
  Loop* l = loop.get();
  const int64_t half = l->n / 2;
  for (int64_t i = 0; i < l->n; ++i) l->x.as<float>()[i] = float(i % 2000) / 1000.0f - 1.0f;
  loop->id = rounds.add([l, half, &pool = b.pool] {
    pool.parallel_for(half, [l, half](int64_t begin, int64_t end) {
      float* x = l->x.as<float>();
      for (int p = 0; p < Loop::kPassesPerCall / 20; ++p) exp_loop(x + begin, x + half + begin, end - begin);
    });
  });
  return loop;
}

void record_transcendentals(Bench& b, const Loop& loop, const Rounds& rounds) {
  b.set("transcendental_rate", &b.device.transcendental_rate,
        double(kTranscendentalsPerElement) * double(loop.n / 2) * (Loop::kPassesPerCall / 20) / rounds.seconds_per_call(loop.id),
        fmt::format("y = exp(x) per element (the libm call std::exp on float, as a loop kernel that does not "
                    "vectorize makes it) over 8 KiB of floats in [-1, 1) per thread, split over the ThreadPool, {} "
                    "passes per dispatch, at napkin's Release flags; the {}",
                    Loop::kPassesPerCall / 20, rounds.describe()));
  b.progress(fmt::format("exp {:.2f} G/s", b.device.transcendental_rate / 1e9));
}

// A kernel's fixed cost on a CPU trainer: one dispatch to the pool.
size_t add_launch(Bench& b, Rounds& rounds) {
  return rounds.add([&pool = b.pool, threads = b.threads] { pool.parallel_for(threads, [](int64_t, int64_t) {}); });
}

void record_launch(Bench& b, size_t id, const Rounds& rounds) {
  b.set("launch_seconds", &b.device.launch_seconds, rounds.seconds_per_call(id),
        fmt::format("the mean time of an empty ThreadPool::parallel_for over {} chunks, back to back (the workers "
                    "still spinning, as between a step's kernels), the {}",
                    b.threads, rounds.describe()));
  b.progress(fmt::format("dispatch {:.2f} us", b.device.launch_seconds * 1e6));
}

}  // namespace

analysis::Device measure_host(const MeasureOptions& options) {
  const int threads = options.threads > 0 ? options.threads : runtime::default_thread_count();
  ThreadPool pool(threads);
  analysis::Device device;
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

  Rounds rounds(b.timing);
  const std::vector<GemmKindTimings> gemms = add_gemms(b, rounds);
  const LastLevelCache llc = last_level_cache(threads);
  const TimedTriad cache = add_cache_triad(b, rounds, llc);
  const TimedTriad memory_triad = add_memory_triad(b, rounds, llc, memory.bytes);
  const std::unique_ptr<Loop> loop = add_loop(b, rounds);
  const std::unique_ptr<Loop> transcendentals = add_transcendentals(b, rounds);
  const size_t launch = add_launch(b, rounds);
  rounds.run([&](int round) {
    b.progress(fmt::format("round {} of {} over {} benchmarks ...", round + 1, b.timing.samples, rounds.size()));
  });
  record_gemms(b, gemms, rounds);
  record_bandwidths(b, llc, cache, memory_triad, rounds);
  record_loop(b, *loop, rounds);
  record_transcendentals(b, *transcendentals, rounds);
  record_launch(b, launch, rounds);

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
