// The CUDA backend's fused attention (codegen/cuda/attention.cpp): plan
// kernels built by hand (operands at 16-byte aligned offsets of a host arena,
// strided views of a packed qkv buffer among them), emitted by the real
// emitter, run in the host CUDA emulator and compared, output by output (o,
// lse, dq, dk, dv), with the float64 reference (interp::detail::attention,
// attention_grad) on inputs rounded to the dtype; odd shapes (T and S not
// multiples of the 64-row tile, head_dim 16, 24, 40, 64, 80, grouped heads,
// causal with T < S); rotary embeddings fused into the loads (both pairings,
// Llama 3.1's scaled frequencies; the reference rotates q, k and dq, dk in
// float64); bit-identical reruns; and the emitted source compiles with NVRTC
// for sm_90.
#ifdef NAPKIN_HAVE_CUDA

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "codegen/cuda/kernel_source.h"
#include "codegen/cuda/nvrtc_compile.h"
#include "interp/kernels.h"
#include "runtime/float_formats.h"
#include "support/cuda_emulator.h"

namespace {

using napkin::codegen::Kernel;
using napkin::codegen::KernelKind;
using napkin::codegen::KernelPlan;
using napkin::codegen::Operand;
using napkin::ir::DType;
using Data = std::vector<double>;

struct Shape {
  int64_t B, HQ, HK, T, S, D;
  bool causal;
  bool packed;  // q, k, v: views of one [B, T, 3 * H * D] buffer
  double scale;
  std::optional<napkin::ir::RopeParams> rope = std::nullopt;
};

// Rotary embeddings: half pairs (theta 10000) and interleaved pairs with
// Llama 3.1's scaling over a short original context, so every band is hit.
napkin::ir::RopeParams rope_of(napkin::ir::RopeStyle style, bool scaled) {
  napkin::ir::RopeParams r;
  r.style = style;
  if (scaled) r.theta = 500000, r.factor = 8, r.original_context = 32;
  return r;
}

const std::vector<Shape> kShapes = {
    {1, 3, 3, 37, 37, 24, true, false, 0.2},      // one partial tile, head_dim padded to 32
    {2, 6, 2, 20, 53, 40, true, false, 0.16},     // grouped heads, causal with T < S
    {1, 6, 2, 20, 53, 40, false, false, 0.16},    // the same, not causal
    {2, 2, 2, 37, 37, 80, true, true, 0.11},      // strided views of packed qkv
    {1, 1, 1, 130, 130, 64, true, false, 0.125},  // three tiles: skipped and masked ones
    {1, 4, 2, 70, 100, 16, false, false, 0.25},   // two query tiles, two key tiles
    // rope fused into the loads: grouped, causal with T < S, padded head_dim, several tiles
    {2, 6, 2, 20, 53, 40, true, false, 0.16, rope_of(napkin::ir::RopeStyle::Half, false)},
    {1, 4, 2, 70, 100, 24, true, false, 0.2, rope_of(napkin::ir::RopeStyle::Interleaved, true)},
    {1, 2, 2, 130, 130, 64, true, false, 0.125, rope_of(napkin::ir::RopeStyle::Half, true)},
};

int size_of(DType t) { return napkin::ir::dtype_size(t); }

double rounded(DType t, double x) {
  switch (t) {
    case DType::BF16: return napkin::runtime::round_to_bf16(static_cast<float>(x));
    case DType::F16: return napkin::runtime::round_to_f16(static_cast<float>(x));
    case DType::F32: return static_cast<float>(x);
    default: return x;
  }
}

void put(char* at, DType t, double x) {
  switch (t) {
    case DType::BF16: {
      uint16_t b = napkin::runtime::float_to_bf16_bits(static_cast<float>(x));
      std::memcpy(at, &b, 2);
      break;
    }
    case DType::F16: {
      uint16_t b = napkin::runtime::float_to_f16_bits(static_cast<float>(x));
      std::memcpy(at, &b, 2);
      break;
    }
    case DType::F32: {
      float f = static_cast<float>(x);
      std::memcpy(at, &f, 4);
      break;
    }
    default: std::memcpy(at, &x, 8);
  }
}

double get(const char* at, DType t) {
  switch (t) {
    case DType::BF16: {
      uint16_t b;
      std::memcpy(&b, at, 2);
      return napkin::runtime::bf16_bits_to_float(b);
    }
    case DType::F16: {
      uint16_t b;
      std::memcpy(&b, at, 2);
      return napkin::runtime::f16_bits_to_float(b);
    }
    case DType::F32: {
      float f;
      std::memcpy(&f, at, 4);
      return f;
    }
    default: {
      double d;
      std::memcpy(&d, at, 8);
      return d;
    }
  }
}

int64_t byte_at(const Operand& o, const std::vector<int64_t>& idx) {
  int64_t e = 0;
  for (size_t i = 0; i < idx.size(); ++i) e += idx[i] * o.strides[i];
  return o.byte_offset + e * size_of(o.dtype);
}

// Dense (row-major) values of a 4-D or 3-D operand.
Data read(const char* arena, const Operand& o) {
  Data out;
  std::vector<int64_t> idx(o.sizes.size(), 0);
  const int64_t n = o.numel();
  for (int64_t f = 0; f < n; ++f) {
    int64_t rest = f;
    for (size_t d = o.sizes.size(); d-- > 0;) idx[d] = rest % o.sizes[d], rest /= o.sizes[d];
    out.push_back(get(arena + byte_at(o, idx), o.dtype));
  }
  return out;
}

// Random values in [-lim, lim] rounded to the dtype, written through o's strides.
Data fill(char* arena, const Operand& o, std::mt19937& rng, double lim) {
  std::uniform_real_distribution<double> u(-lim, lim);
  std::vector<int64_t> idx(o.sizes.size(), 0);
  Data out;
  for (int64_t f = 0; f < o.numel(); ++f) {
    int64_t rest = f;
    for (size_t d = o.sizes.size(); d-- > 0;) idx[d] = rest % o.sizes[d], rest /= o.sizes[d];
    const double x = rounded(o.dtype, u(rng));
    put(arena + byte_at(o, idx), o.dtype, x);
    out.push_back(x);
  }
  return out;
}

// Operands of one shape laid out from `next` on, every one 16-byte aligned.
struct Layout {
  Operand q, k, v, o, lse, dout, dq, dk, dv;
};

class Arena {
 public:
  int64_t take(int64_t bytes) {
    const int64_t at = next_;
    next_ = (next_ + bytes + 255) / 256 * 256;
    return at;
  }
  int64_t size() const { return next_; }

 private:
  int64_t next_ = 256;
};

Operand dense(Arena& a, DType t, std::vector<int64_t> sizes) {
  Operand o;
  o.dtype = t;
  o.sizes = sizes;
  o.strides.assign(sizes.size(), 1);
  for (size_t d = sizes.size() - 1; d-- > 0;) o.strides[d] = o.strides[d + 1] * sizes[d + 1];
  o.byte_offset = a.take(o.numel() * size_of(t));
  return o;
}

Layout lay_out(Arena& a, DType t, const Shape& s) {
  Layout l;
  if (s.packed) {
    const int64_t row = 3 * s.HQ * s.D, base = a.take(s.B * s.T * row * size_of(t));
    auto view = [&](int which) {
      Operand o;
      o.dtype = t;
      o.sizes = {s.B, s.HQ, s.T, s.D};
      o.strides = {s.T * row, s.D, row, 1};
      o.byte_offset = base + which * s.HQ * s.D * size_of(t);
      return o;
    };
    l.q = view(0), l.k = view(1), l.v = view(2);
  } else {
    l.q = dense(a, t, {s.B, s.HQ, s.T, s.D});
    l.k = dense(a, t, {s.B, s.HK, s.S, s.D});
    l.v = dense(a, t, {s.B, s.HK, s.S, s.D});
  }
  l.o = dense(a, t, {s.B, s.HQ, s.T, s.D});
  l.lse = dense(a, DType::F32, {s.B, s.HQ, s.T});
  l.dout = dense(a, t, {s.B, s.HQ, s.T, s.D});
  l.dq = dense(a, t, {s.B, s.HQ, s.T, s.D});
  l.dk = dense(a, t, {s.B, s.HK, s.S, s.D});
  l.dv = dense(a, t, {s.B, s.HK, s.S, s.D});
  return l;
}

Kernel attention_kernel(const std::string& name, const Shape& s, bool backward, const Layout& l) {
  Kernel k;
  k.kind = KernelKind::Attention;
  k.params = napkin::ir::AttentionParams{backward, s.causal, s.scale, false, false, s.rope};
  k.name = name;
  if (backward) {
    k.inputs = {l.q, l.k, l.v, l.o, l.lse, l.dout};
    k.output = l.dq;
    k.extra_outputs = {l.dk, l.dv};
  } else {
    k.inputs = {l.q, l.k, l.v};
    k.output = l.o;
    k.extra_outputs = {l.lse};
  }
  return k;
}

// Every shape's forward and backward kernels in one plan (one source).
KernelPlan plan_of(DType t, std::vector<Layout>& layouts, Arena& arena) {
  KernelPlan plan;
  for (size_t i = 0; i < kShapes.size(); ++i) {
    layouts.push_back(lay_out(arena, t, kShapes[i]));
    plan.kernels.push_back(attention_kernel(fmt::format("k{}_attention", 2 * i), kShapes[i], false, layouts.back()));
    plan.kernels.push_back(attention_kernel(fmt::format("k{}_attention_grad", 2 * i + 1), kShapes[i], true,
                                            layouts.back()));
  }
  plan.arena_bytes = arena.size();
  return plan;
}

struct Buffer {
  explicit Buffer(int64_t bytes)
      : data(static_cast<char*>(std::aligned_alloc(256, static_cast<size_t>((bytes + 255) / 256 * 256))), &std::free) {
    std::memset(data.get(), 0, static_cast<size_t>(bytes));
  }
  std::unique_ptr<char, decltype(&std::free)> data;
};

// max |x - ref| / max(max |ref|, floor): the error relative to the tensor's scale.
double scaled_error(const Data& x, const Data& ref, double floor = 1e-3) {
  REQUIRE(x.size() == ref.size());
  double worst = 0, big = floor;
  for (double r : ref) big = std::max(big, std::fabs(r));
  for (size_t i = 0; i < x.size(); ++i) {
    if (!std::isfinite(x[i])) return INFINITY;
    worst = std::max(worst, std::fabs(x[i] - ref[i]));
  }
  return worst / big;
}

struct Tolerance {
  double out, grad, lse;
};

// Errors relative to the tensor's largest value; observed (emulated) at about
// a quarter to a third of these: f32 5e-7, f16 5e-4, bf16 4.5e-3.
Tolerance tolerance(DType t) {
  switch (t) {
    case DType::F64: return {1e-13, 1e-13, 1e-6};  // lse is f32
    case DType::F32: return {2e-6, 2e-6, 1e-6};
    case DType::F16: return {1.5e-3, 2e-3, 1e-5};
    default: return {1e-2, 1.5e-2, 1e-5};  // bf16: 2^-9 rounding of the inputs, P, dS and the outputs
  }
}

void check_dtype(DType t) {
  Arena arena;
  std::vector<Layout> layouts;
  KernelPlan plan = plan_of(t, layouts, arena);
  const napkin::codegen::cuda::CudaSource src = napkin::codegen::cuda::emit_cuda_source(plan, "attention_test");
  napkin::testing::CudaEmulator gpu(src.text);
  Buffer scratch(std::max<int64_t>(src.scratch_bytes, 16));
  const Tolerance tol = tolerance(t);
  std::mt19937 rng(1234);
  Buffer mem(plan.arena_bytes);
  char* arena_ptr = mem.data.get();
  auto run = [&](size_t kernel) {
    for (const auto& l : src.launches[kernel])
      gpu.launch(l.function, l.grid, l.block, l.shared_bytes, arena_ptr, scratch.data.get(), l.offsets);
  };
  for (size_t i = 0; i < kShapes.size(); ++i) {
    const Shape& s = kShapes[i];
    const Layout& l = layouts[i];
    INFO(fmt::format("dtype {} shape B={} Hq={} Hk={} T={} S={} D={} causal={} packed={} rope={}",
                     napkin::ir::dtype_name(t), s.B, s.HQ, s.HK, s.T, s.S, s.D, s.causal, s.packed,
                     s.rope ? (s.rope->style == napkin::ir::RopeStyle::Half ? "half" : "interleaved") : "none"));
    const Data q = fill(arena_ptr, l.q, rng, 1.5), k = fill(arena_ptr, l.k, rng, 1.5), v = fill(arena_ptr, l.v, rng, 1.5);
    const Data dout = fill(arena_ptr, l.dout, rng, 1.0);
    const napkin::ir::AttentionParams p{false, s.causal, s.scale, false, false, s.rope};
    const napkin::interp::detail::Shape qs = {s.B, s.HQ, s.T, s.D}, ks = {s.B, s.HK, s.S, s.D}, ls = {s.B, s.HQ, s.T};

    run(2 * i);
    const Data o = read(arena_ptr, l.o), lse = read(arena_ptr, l.lse);
    const std::vector<Data> ref = napkin::interp::detail::attention(p, {{qs, t, q}, {ks, t, k}, {ks, t, v}});
    CHECK(scaled_error(o, ref[0]) <= tol.out);
    // With rope, the tensor-core kernels round the rotated q and k to the
    // 16-bit type in shared memory (as a standalone rope's output would be),
    // the reference does not: lse moves by about that rounding.
    const bool rounded_rotation = s.rope && (t == DType::BF16 || t == DType::F16);
    CHECK(scaled_error(lse, ref[1], 1.0) <= (rounded_rotation ? (t == DType::BF16 ? 1e-3 : 2e-4) : tol.lse));

    // The backward from the kernel's own o and lse, as training runs it.
    run(2 * i + 1);
    const std::vector<Data> grads = {read(arena_ptr, l.dq), read(arena_ptr, l.dk), read(arena_ptr, l.dv)};
    const std::vector<Data> gref = napkin::interp::detail::attention_grad(
        p, {{qs, t, q}, {ks, t, k}, {ks, t, v}, {qs, t, o}, {ls, DType::F32, lse}, {qs, t, dout}});
    const char* names[] = {"dq", "dk", "dv"};
    for (int g = 0; g < 3; ++g) {
      INFO(names[g]);
      CHECK(scaled_error(grads[g], gref[g]) <= tol.grad);
    }

    // Reruns give the same bits.
    const Layout& lo = l;
    auto bytes = [&](const Operand& op) {
      return std::string(arena_ptr + op.byte_offset, static_cast<size_t>(op.numel() * size_of(op.dtype)));
    };
    const std::string before = bytes(lo.o) + bytes(lo.lse) + bytes(lo.dq) + bytes(lo.dk) + bytes(lo.dv);
    std::memset(arena_ptr + lo.dq.byte_offset, 0, static_cast<size_t>(lo.dq.numel() * size_of(t)));
    std::memset(arena_ptr + lo.dk.byte_offset, 0, static_cast<size_t>(lo.dk.numel() * size_of(t)));
    run(2 * i);
    run(2 * i + 1);
    CHECK(before == bytes(lo.o) + bytes(lo.lse) + bytes(lo.dq) + bytes(lo.dk) + bytes(lo.dv));
  }
}

}  // namespace

TEST_CASE("cuda attention: emulated f32 kernels (SIMT) match the float64 reference") { check_dtype(DType::F32); }
TEST_CASE("cuda attention: emulated f64 kernels (SIMT) match the float64 reference") { check_dtype(DType::F64); }
TEST_CASE("cuda attention: emulated bf16 kernels (tensor cores) match the float64 reference") {
  check_dtype(DType::BF16);
}
TEST_CASE("cuda attention: emulated f16 kernels (tensor cores) match the float64 reference") {
  check_dtype(DType::F16);
}

TEST_CASE("cuda attention: launches, scratch and shared memory of a forward and a backward kernel") {
  Arena arena;
  const Shape s{8, 12, 12, 1024, 1024, 64, true, false, 0.125};
  const Layout l = lay_out(arena, DType::BF16, s);
  KernelPlan plan;
  plan.kernels = {attention_kernel("k0_attention", s, false, l), attention_kernel("k1_attention_grad", s, true, l)};
  const napkin::codegen::cuda::CudaSource src = napkin::codegen::cuda::emit_cuda_source(plan, "attention_test");
  REQUIRE(src.launches.size() == 2);
  REQUIRE(src.launches[0].size() == 1);
  CHECK(src.launches[0][0].grid == 8 * 12 * 16);
  CHECK(src.launches[0][0].block == 128);
  CHECK(src.launches[0][0].shared_bytes <= 48 * 1024);
  REQUIRE(src.launches[1].size() == 3);
  CHECK(src.launches[1][1].grid == 8 * 12 * 16);  // dk, dv: (b, kv head, key tile)
  CHECK(src.launches[1][2].grid == 8 * 12 * 16);  // dq: (b, head, query tile)
  CHECK(src.launches[1][1].shared_bytes <= 48 * 1024);
  CHECK(src.scratch_bytes == 8 * 12 * 1024 * 4);  // delta, f32
  CHECK(src.text.find("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32") != std::string::npos);
}

TEST_CASE("cuda attention: nvrtc compiles the bf16, f16, f32 and f64 forward and backward kernels for sm_90") {
  Arena arena;
  KernelPlan plan;
  int n = 0;
  for (DType t : {DType::BF16, DType::F16, DType::F32, DType::F64}) {
    for (const Shape& s : {Shape{2, 4, 2, 100, 130, 64, true, false, 0.125}, Shape{1, 2, 2, 50, 50, 40, false, true, 0.2},
                           Shape{1, 4, 2, 70, 100, 24, true, false, 0.2, rope_of(napkin::ir::RopeStyle::Half, true)}}) {
      const Layout l = lay_out(arena, t, s);
      plan.kernels.push_back(attention_kernel(fmt::format("k{}_attention", n++), s, false, l));
      plan.kernels.push_back(attention_kernel(fmt::format("k{}_attention_grad", n++), s, true, l));
    }
  }
  plan.arena_bytes = arena.size();
  const napkin::codegen::cuda::CudaSource src = napkin::codegen::cuda::emit_cuda_source(plan, "attention_test");
  napkin::codegen::cuda::NvrtcOptions options;
  options.use_cache = false;
  const napkin::codegen::cuda::NvrtcResult r = napkin::codegen::cuda::nvrtc_compile(src.text, "attention_test", options);
  CHECK(r.cubin.size() > 0);
  CHECK(r.ptx.find("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32") != std::string::npos);
  CHECK(r.ptx.find("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32") != std::string::npos);
}

#endif  // NAPKIN_HAVE_CUDA
