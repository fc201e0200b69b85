// Low precision on the CPU backend, without the mixed-precision pass:
//  - the loop emitter's loads and stores of bf16, f16, f8e4m3 and f8e5m2
//    (JIT-compiled) against runtime/float_formats' bit-exact converters: every
//    8-bit code decoded, and encodes of floats chosen to hit every rounding
//    case (ties either way, subnormals, overflow, inf, NaN);
//  - models that cast to bf16 before their contractions (a batched,
//    attention-like einsum with a transposed operand included): every compiled
//    kernel, the bf16 GEMMs among them, against the reference interpreter
//    node by node, and a few whole training steps' losses.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "codegen/cpu/jit.h"
#include "codegen/cpu/loop_emitter.h"
#include "codegen/program_json.h"
#include "interp/interpreter.h"
#include "interp/kernels.h"
#include "interp/rounding.h"
#include "runtime/executor.h"
#include "runtime/float_formats.h"
#include "runtime/rng.h"
#include "support/compiled_step.h"
#include "support/test_models.h"

using namespace napkin;

namespace {

// A training graph of inline YAML compiled by the CPU backend (JIT).
struct Compiled : napkin::testing::CompiledStep {
  explicit Compiled(const std::string& yaml) : CompiledStep(napkin::testing::compile_training(yaml)) {}
};

// Runs `void convert(arena, 0, n, offsets)`: dst[i] = src[i], loaded as
// `from` and stored as `to` (both of compute type f32), compiled like a
// kernel's code. Returns dst's bytes.
std::vector<uint8_t> jit_convert(ir::DType from, ir::DType to, const std::vector<uint8_t>& src, int64_t n) {
  codegen::cpu::CpuModule m;
  m.context = std::make_unique<llvm::LLVMContext>();
  m.module = std::make_unique<llvm::Module>("convert", *m.context);
  llvm::IRBuilder<> b(*m.context);
  auto* type = llvm::FunctionType::get(b.getVoidTy(), {b.getPtrTy(), b.getInt64Ty(), b.getInt64Ty(), b.getPtrTy()}, false);
  llvm::Function* fn = llvm::Function::Create(type, llvm::Function::ExternalLinkage, "convert", *m.module);
  const int64_t in_bytes = ir::dtype_size(from), out_bytes = ir::dtype_size(to);
  codegen::Operand in, out;
  in.dtype = from, in.sizes = {n}, in.strides = {1}, in.byte_offset = 0;
  out.dtype = to, out.sizes = {n}, out.strides = {1}, out.byte_offset = (n * in_bytes + 63) / 64 * 64;
  codegen::cpu::LoopEmitter e(fn, b);
  e.nest({n}, 0, [&](const std::vector<llvm::Value*>& i) { e.store(out, i[0], e.convert(e.load(in, i[0]), from, to)); });
  b.CreateRetVoid();
  const std::vector<int64_t> offsets = e.slot_offsets();
  codegen::cpu::JitModule jit(std::move(m), {});
  auto* run = reinterpret_cast<void (*)(char*, int64_t, int64_t, const int64_t*)>(jit.lookup("convert"));
  std::vector<char> arena(size_t(out.byte_offset + n * out_bytes));
  std::memcpy(arena.data(), src.data(), src.size());
  run(arena.data(), 0, n, offsets.data());
  return std::vector<uint8_t>(arena.begin() + out.byte_offset, arena.end());
}

std::vector<uint8_t> bytes_of(const std::vector<float>& v) {
  std::vector<uint8_t> out(v.size() * 4);
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}
std::vector<float> floats_of(const std::vector<uint8_t>& v) {
  std::vector<float> out(v.size() / 4);
  std::memcpy(out.data(), v.data(), v.size());
  return out;
}
uint32_t bits(float x) { return std::bit_cast<uint32_t>(x); }

// Runs one training step kernel by kernel, each output checked against the
// interpreter on the kernel's own inputs (tests/support/compiled_step.h).
// Returns the number of Gemm kernels whose A and B are `gemm_dtype`.
int check_kernels(Compiled& c, ir::DType gemm_dtype) {
  int gemms = 0;
  for (const codegen::Kernel& k : c.plan.kernels)
    gemms += k.kind == codegen::KernelKind::Gemm && k.inputs[0].dtype == gemm_dtype && k.inputs[1].dtype == gemm_dtype;
  napkin::testing::check_each_kernel(c, [&](const napkin::testing::KernelOutputCheck& k) {
    INFO(k.kernel->name << " output " << k.output << " at " << k.kernel->where
                        << (k.kernel->kind == codegen::KernelKind::Gemm ? " (GEMM)" : " (loop)") << ", out "
                        << ir::dtype_name(k.operand->dtype));
    CHECK(k.error <= napkin::testing::kernel_tolerance(k.precision));
  });
  return gemms;
}

// A model that casts to bf16 before every contraction: a projection, q k^T
// and p v per head read out of one bf16 qkv buffer (batched, strided, one
// operand transposed), and an output projection by a transposed weight.
const char* kBf16Attention = R"yaml(
model: bf16-attention
dims: {batch: 2, seq: 8, d: 32, heads: 2, head_dim: d / heads}
inputs:
  x: {shape: [batch, seq, d]}
  y: {shape: [batch, seq, d]}
params:
  w_qkv: {shape: [d, 3*d], init: normal(0.2)}
  w_out: {shape: [d, d], init: normal(0.2)}
  w_mlp: {shape: [d, d], init: normal(0.2)}
forward:
  - qkv: einsum(cast(x, dtype=bf16), cast(w_qkv, dtype=bf16), "b s d, d e -> b s e")
  - q, k, v: rearrange(qkv, "b s (three h hd) -> three b h s hd", three=3, h=heads)
  - scores: cast(einsum(q, k, "b h i hd, b h j hd -> b h i j"), dtype=f32) / sqrt(head_dim)
  - att: softmax(scores, axis=-1)
  - o: einsum(cast(att, dtype=bf16), v, "b h i j, b h j hd -> b h i hd")
  - o: rearrange(o, "b h s hd -> b s (h hd)")
  - o: einsum(o, cast(w_out, dtype=bf16), "b s e, d e -> b s d")
  - h: cast(o, dtype=f32) + x
  - pred: cast(cast(h, dtype=bf16) @ cast(w_mlp, dtype=bf16), dtype=f32)
loss: mse(pred, y)
optimizer: sgd(lr=0.05)
precision: fp32
)yaml";

// Floats around every value of a narrow format given by its decoder over
// `codes` codes: each value, its float neighbours, the midpoints to the next
// value (exact ties) and their neighbours, both signs; plus f32 subnormals,
// the extremes, inf, NaN, and random bit patterns.
std::vector<float> rounding_cases(float (*decode)(uint32_t), uint32_t codes) {
  std::vector<float> xs;
  std::vector<float> values;
  for (uint32_t c = 0; c < codes; ++c) {
    float v = decode(c);
    if (std::isfinite(v) && v >= 0) values.push_back(v);
  }
  std::sort(values.begin(), values.end());
  values.erase(std::unique(values.begin(), values.end()), values.end());
  const float inf = std::numeric_limits<float>::infinity();
  auto around = [&](float x) {
    for (float y : {x, std::nextafter(x, inf), std::nextafter(x, -inf)}) xs.push_back(y), xs.push_back(-y);
  };
  for (size_t i = 0; i < values.size(); ++i) {
    around(values[i]);
    // The midpoint to the next value, and past the largest finite value the
    // midpoint to where the next one would be (the overflow boundary).
    float next = i + 1 < values.size() ? values[i + 1] : 2 * values[i] - values[i - 1];
    around(values[i] + (next - values[i]) / 2);
  }
  for (float x : {std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::min(),
                  std::numeric_limits<float>::max(), inf, std::numeric_limits<float>::quiet_NaN(), 1e-30f, 3e38f})
    around(x);
  std::mt19937 rng(11);
  for (int i = 0; i < 200000; ++i) xs.push_back(std::bit_cast<float>(uint32_t(rng())));
  return xs;
}

}  // namespace

TEST_CASE("loop emitter: every f8e4m3 and f8e5m2 code loads as float_formats decodes it, bit for bit") {
  std::vector<uint8_t> codes(256);
  for (int i = 0; i < 256; ++i) codes[i] = uint8_t(i);
  for (ir::DType t : {ir::DType::F8E4M3, ir::DType::F8E5M2}) {
    std::vector<float> got = floats_of(jit_convert(t, ir::DType::F32, codes, 256));
    int nans = 0;
    for (int i = 0; i < 256; ++i) {
      float want = t == ir::DType::F8E4M3 ? runtime::f8e4m3_bits_to_float(uint8_t(i)) : runtime::f8e5m2_bits_to_float(uint8_t(i));
      CAPTURE(i);
      CHECK(bits(got[i]) == bits(want));
      nans += std::isnan(want);
    }
    CHECK(nans == (t == ir::DType::F8E4M3 ? 2 : 6));  // E4M3: S.1111.111; E5M2: S.11111.{01,10,11}
  }
}

TEST_CASE("loop emitter: f8e4m3 and f8e5m2 stores round to nearest even like float_formats, every case") {
  auto e4m3 = [](uint32_t c) { return runtime::f8e4m3_bits_to_float(uint8_t(c)); };
  auto e5m2 = [](uint32_t c) { return runtime::f8e5m2_bits_to_float(uint8_t(c)); };
  for (ir::DType t : {ir::DType::F8E4M3, ir::DType::F8E5M2}) {
    std::vector<float> xs = rounding_cases(t == ir::DType::F8E4M3 ? +e4m3 : +e5m2, 256);
    std::vector<uint8_t> got = jit_convert(ir::DType::F32, t, bytes_of(xs), int64_t(xs.size()));
    int mismatches = 0, ties = 0, overflows = 0;
    for (size_t i = 0; i < xs.size(); ++i) {
      uint8_t want = t == ir::DType::F8E4M3 ? runtime::float_to_f8e4m3_bits(xs[i]) : runtime::float_to_f8e5m2_bits(xs[i]);
      if (got[i] != want && mismatches++ < 10) {
        CAPTURE(xs[i]);
        CAPTURE(bits(xs[i]));
        CHECK(int(got[i]) == int(want));
      }
      // A tie: x is exactly halfway between its result r and another value
      // of the format, 2x - r.
      auto value = [&](double v) {
        return double(t == ir::DType::F8E4M3 ? e4m3(runtime::float_to_f8e4m3_bits(float(v)))
                                             : e5m2(runtime::float_to_f8e5m2_bits(float(v))));
      };
      const double x = xs[i], r = t == ir::DType::F8E4M3 ? e4m3(want) : e5m2(want);
      ties += std::isfinite(r) && x != r && value(2 * x - r) == 2 * x - r;
      overflows += std::isfinite(x) && !std::isfinite(r);
    }
    CHECK(mismatches == 0);
    CHECK(ties > 50);       // exact halfway cases were met (and rounded to even)
    CHECK(overflows > 10);  // so were finite values past the largest
  }
}

TEST_CASE("loop emitter: bf16 and f16 loads are exact and stores round to nearest even like float_formats") {
  for (ir::DType t : {ir::DType::BF16, ir::DType::F16}) {
    CAPTURE(ir::dtype_name(t));
    const bool bf = t == ir::DType::BF16;
    // Every code loads exactly.
    std::vector<uint8_t> codes(65536 * 2);
    for (uint32_t c = 0; c < 65536; ++c) codes[2 * c] = uint8_t(c), codes[2 * c + 1] = uint8_t(c >> 8);
    std::vector<float> loaded = floats_of(jit_convert(t, ir::DType::F32, codes, 65536));
    int load_mismatches = 0;
    for (uint32_t c = 0; c < 65536; ++c) {
      float want = bf ? runtime::bf16_bits_to_float(uint16_t(c)) : runtime::f16_bits_to_float(uint16_t(c));
      load_mismatches += std::isnan(want) ? !std::isnan(loaded[c]) : bits(loaded[c]) != bits(want);
    }
    CHECK(load_mismatches == 0);
    // Stores: every rounding case; NaN only needs to stay NaN (the header of
    // float_formats.h: payloads are not worth relying on).
    auto decode = bf ? +[](uint32_t c) { return runtime::bf16_bits_to_float(uint16_t(c)); }
                     : +[](uint32_t c) { return runtime::f16_bits_to_float(uint16_t(c)); };
    std::vector<float> xs = rounding_cases(decode, bf ? 0x7F80 : 0x7C00);  // the finite positive codes
    std::vector<uint8_t> got = jit_convert(ir::DType::F32, t, bytes_of(xs), int64_t(xs.size()));
    int mismatches = 0;
    for (size_t i = 0; i < xs.size(); ++i) {
      uint16_t g = uint16_t(got[2 * i] | got[2 * i + 1] << 8);
      uint16_t want = bf ? runtime::float_to_bf16_bits(xs[i]) : runtime::float_to_f16_bits(xs[i]);
      bool same = std::isnan(xs[i]) ? std::isnan(decode(g)) : g == want;
      if (!same && mismatches++ < 10) {
        CAPTURE(xs[i]);
        CAPTURE(bits(xs[i]));
        CHECK(g == want);
      }
    }
    CHECK(mismatches == 0);
  }
}

TEST_CASE("compiled bf16 contractions agree with the interpreter kernel by kernel (fwd and bwd GEMMs in bf16)") {
  Compiled c(kBf16Attention);
  int gemms = check_kernels(c, ir::DType::BF16);
  // qkv, q k^T, p v, the two projections: 5 forward, and their gradients.
  CHECK(gemms >= 12);
  // The program carries the operand dtypes to the runtime: bf16 operands,
  // results in bf16, or in f32 where a cast to f32 was their only reader
  // (the weight gradients: passes/matmul_epilogues.h).
  int bf16_matmuls = 0, f32_results = 0;
  for (const runtime::KernelSpec& k : c.program.kernels) {
    using runtime::DType;
    const auto* m = k.as<runtime::MatmulSpec>();
    if (!m || m->a_dtype != DType::BF16 || m->b_dtype != DType::BF16) continue;
    bf16_matmuls += m->c_dtype == DType::BF16 || m->c_dtype == DType::F32;
    f32_results += m->c_dtype == DType::F32;
  }
  CHECK(bf16_matmuls == gemms);
  CHECK(f32_results >= 2);
}

TEST_CASE("a bf16-contraction model trains like the interpreter: losses over five steps") {
  Compiled c(kBf16Attention);
  interp::Interpreter it(c.g, interp::Numerics::Native);
  it.set(c.values);
  ir::ValueId loss = c.g.find_output("loss");
  std::vector<double> got, want;
  for (int step = 0; step < 5; ++step) {
    c.ex->run_forward();
    c.ex->run_rest();
    got.push_back(c.ex->loss());
    c.ex->apply_updates();
    it.run();
    want.push_back(it.get(loss)[0]);
    it.apply_updates();
    CAPTURE(step);
    CAPTURE(got.back());
    CAPTURE(want.back());
    // bf16 activations: a one-ulp difference (2^-8 relative) where the two
    // sides round differently moves the loss far less than this.
    CHECK(std::fabs(got.back() - want.back()) <= 1e-2 * std::fabs(want.back()));
  }
  CHECK(want.back() < want.front());  // it trains
  CHECK(got.back() < got.front());
}

TEST_CASE("compiled fp8 casts (f8e4m3, f8e5m2) agree with the interpreter exactly") {
  Compiled c(R"yaml(
model: fp8-casts
dims: {batch: 4, d: 64}
inputs:
  x: {shape: [batch, d]}
  y: {shape: [batch, d]}
params:
  w: {shape: [d, d], init: normal(0.1)}
forward:
  - q4: cast(cast(x * 100, dtype=f8e4m3), dtype=f32)
  - q5: cast(cast(x * 10000, dtype=f8e5m2), dtype=f32)
  - pred: x @ w + q4 + q5 / 100
loss: mse(pred, y)
optimizer: sgd(lr=0.01)
precision: fp32
)yaml");
  check_kernels(c, ir::DType::F32);
  // The two casts to fp8 run (fused into the kernel that reads them or on
  // their own), each rounding to its format.
  auto fp8 = [](ir::DType t) { return t == ir::DType::F8E4M3 || t == ir::DType::F8E5M2; };
  int fp8_results = 0;
  for (const codegen::Kernel& k : c.plan.kernels) {
    if (!k.fused) fp8_results += fp8(k.output.dtype);
    else
      for (const codegen::FusedOp& op : k.fused->ops) fp8_results += fp8(op.dtype);
  }
  CHECK(fp8_results == 2);
}
