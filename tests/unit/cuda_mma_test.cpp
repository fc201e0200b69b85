// The prelude's tensor-core product napkin_mma_m16n8k16_bf16/_f16 (mma.sync
// m16n8k16, f32 accumulators) as the host emulator runs it: a warp loads
// fragments of A (16x16), B (16x8) and C (16x8) by the PTX ISA's fragment
// layouts, written here element by element as the ISA's tables state them
// (independently of the shim's code), and D must be the plain matrix product
// A B + C. A wrong layout in the shim would pass the attention tests and fail
// on the GPU; this pins it to the documentation. The same source compiles
// with NVRTC for sm_90, so the inline PTX is valid.
#ifdef NAPKIN_HAVE_CUDA

#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>

#include "codegen/cuda/kernel_source.h"
#include "codegen/cuda/nvrtc_compile.h"
#include "runtime/float_formats.h"
#include "support/cuda_emulator.h"

namespace {

// arena: A row-major 16x16 (16-bit bits) at 0, B row-major 16x8 (k, n) at
// 512, C row-major 16x8 floats at 768, D out at 1280.
// PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type":
//   groupID = laneid >> 2, threadID_in_group = laneid % 4
//   A (.f16x2/.bf16x2, 4 registers a0..a7):
//     row = groupID for a_i, i < 2 or 4 <= i < 6; groupID + 8 otherwise
//     col = threadID_in_group * 2 + (i & 1) for i < 4; + 8 for i >= 4
//   B (2 registers b0..b3):
//     row = threadID_in_group * 2 + (i & 1) for i < 2; + 8 for i >= 2
//     col = groupID
//   C, D (.f32, c0..c3):
//     row = groupID for i < 2; groupID + 8 for i >= 2
//     col = threadID_in_group * 2 + (i & 1)
// Element 2j of a pair is the low half of register j.
std::string source(const char* fn) {
  return std::string(napkin::codegen::cuda::cuda_prelude()) + R"(
extern "C" __global__ void __launch_bounds__(32) mma_test(char* __restrict__ arena, char* __restrict__ scratch) {
  (void)scratch;
  const unsigned short* A = (const unsigned short*)arena;
  const unsigned short* B = (const unsigned short*)(arena + 512);
  const float* C = (const float*)(arena + 768);
  float* D = (float*)(arena + 1280);
  const int lane = (int)threadIdx.x, groupID = lane >> 2, tig = lane % 4;
  unsigned a[4] = {0u, 0u, 0u, 0u}, b[2] = {0u, 0u};
  float d[4];
  for (int i = 0; i < 8; ++i) {
    const int row = (i < 2 || (i >= 4 && i < 6)) ? groupID : groupID + 8;
    const int col = tig * 2 + (i & 1) + (i >= 4 ? 8 : 0);
    a[i / 2] |= (unsigned)A[row * 16 + col] << (16 * (i % 2));
  }
  for (int i = 0; i < 4; ++i) {
    const int row = tig * 2 + (i & 1) + (i >= 2 ? 8 : 0), col = groupID;
    b[i / 2] |= (unsigned)B[row * 8 + col] << (16 * (i % 2));
  }
  for (int i = 0; i < 4; ++i) d[i] = C[(i < 2 ? groupID : groupID + 8) * 8 + tig * 2 + (i & 1)];
  )" + fn + R"((d, a, b);
  for (int i = 0; i < 4; ++i) D[(i < 2 ? groupID : groupID + 8) * 8 + tig * 2 + (i & 1)] = d[i];
}
)";
}

void check(bool bf16) {
  const std::string src = source(bf16 ? "napkin_mma_m16n8k16_bf16" : "napkin_mma_m16n8k16_f16");
  napkin::testing::CudaEmulator gpu(src);
  std::unique_ptr<char, decltype(&std::free)> arena(static_cast<char*>(std::aligned_alloc(256, 2048)), &std::free);
  std::memset(arena.get(), 0, 2048);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-3.f, 3.f);
  auto bits = [&](float x) {
    return bf16 ? napkin::runtime::float_to_bf16_bits(x) : napkin::runtime::float_to_f16_bits(x);
  };
  auto value = [&](uint16_t b) {
    return bf16 ? napkin::runtime::bf16_bits_to_float(b) : napkin::runtime::f16_bits_to_float(b);
  };
  uint16_t* A = reinterpret_cast<uint16_t*>(arena.get());
  uint16_t* B = reinterpret_cast<uint16_t*>(arena.get() + 512);
  float* C = reinterpret_cast<float*>(arena.get() + 768);
  const float* D = reinterpret_cast<const float*>(arena.get() + 1280);
  for (int i = 0; i < 256; ++i) A[i] = bits(u(rng));
  for (int i = 0; i < 128; ++i) B[i] = bits(u(rng));
  for (int i = 0; i < 128; ++i) C[i] = u(rng);
  gpu.launch("mma_test", 1, 32, 0, arena.get(), nullptr);
  for (int m = 0; m < 16; ++m)
    for (int n = 0; n < 8; ++n) {
      double want = C[m * 8 + n];
      for (int k = 0; k < 16; ++k) want += static_cast<double>(value(A[m * 16 + k])) * value(B[k * 8 + n]);
      INFO("D[" << m << "][" << n << "]");
      CHECK(std::fabs(D[m * 8 + n] - want) <= 1e-5 * (1 + std::fabs(want)));
    }
}

}  // namespace

TEST_CASE("cuda emulator: mma.sync m16n8k16 bf16 with the PTX ISA fragment layouts is the matrix product") {
  check(true);
}
TEST_CASE("cuda emulator: mma.sync m16n8k16 f16 with the PTX ISA fragment layouts is the matrix product") {
  check(false);
}

TEST_CASE("cuda emulator: an mma in a warp of fewer than 32 lanes fails clearly") {
  napkin::testing::CudaEmulator gpu(source("napkin_mma_m16n8k16_bf16"));
  std::unique_ptr<char, decltype(&std::free)> arena(static_cast<char*>(std::aligned_alloc(256, 2048)), &std::free);
  std::memset(arena.get(), 0, 2048);
  std::string error;
  try {
    gpu.launch("mma_test", 1, 16, 0, arena.get(), nullptr);
  } catch (const std::exception& e) {
    error = e.what();
  }
  CHECK(error.find("mma.sync needs all 32 lanes") != std::string::npos);
}

TEST_CASE("nvrtc: the prelude's mma.sync m16n8k16 bf16 and f16 compile for sm_90") {
  for (const char* fn : {"napkin_mma_m16n8k16_bf16", "napkin_mma_m16n8k16_f16"}) {
    napkin::codegen::cuda::NvrtcOptions options;
    options.use_cache = false;
    const auto r = napkin::codegen::cuda::nvrtc_compile(source(fn), "mma_test", options);
    CHECK(r.cubin.size() > 0);
    CHECK(r.ptx.find("mma.sync.aligned.m16n8k16.row.col.f32") != std::string::npos);
  }
}

#endif  // NAPKIN_HAVE_CUDA
