// The prelude's tensor-core product napkin_mma_m16n8k16_bf16/_f16 (mma.sync
// m16n8k16, f32 accumulators) as the host emulator runs it: a warp loads
// fragments of A (16x16), B (16x8) and C (16x8) by the PTX ISA's fragment
// layouts, written here element by element as the ISA's tables state them
// (independently of the shim's code), and D must be the plain matrix product
// A B + C. A wrong layout in the shim would pass the attention tests and fail
// on the GPU; this pins it to the documentation. The same source compiles
// with NVRTC for sm_90, so the inline PTX is valid. Likewise ldmatrix (x4 and
// x4.trans) and cp.async, which the attention kernels load their tiles with.
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

// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 (napkin_ldmatrix_x4 and
// _x4_trans) and the cp.async copy that fills the tile: a 16x16 tile of
// 16-bit values, rows 24 elements (48 bytes) apart, copied into shared
// memory by cp.async; lane l gives the address of row l % 8 of matrix
// m = l / 8, the 8x8 block at rows 8 (m & 1), columns 8 (m >> 1). PTX ISA,
// "Warp-level matrix load instruction: ldmatrix": lane l receives in
// register m the elements (l / 4, 2 (l % 4)) and (l / 4, 2 (l % 4) + 1) of
// matrix m, the first in the low half; with .trans those of its transpose,
// (2 (l % 4), l / 4) and (2 (l % 4) + 1, l / 4). arena: the tile at 0
// (16 rows x 48 bytes), the registers out at 1024 (32 lanes x 4 x 2 unsigned).
std::string ldmatrix_source() {
  return std::string(napkin::codegen::cuda::cuda_prelude()) + R"(
extern "C" __global__ void __launch_bounds__(32) ldmatrix_test(char* __restrict__ arena, char* __restrict__ scratch) {
  (void)scratch;
  NAPKIN_DYNAMIC_SHARED(unsigned short, tile);
  const int lane = (int)threadIdx.x;
  for (int c = lane; c < 16 * 3; c += 32)  // 16 rows of three 16-byte chunks
    napkin_cp_async16(tile + (c / 3) * 24 + (c % 3) * 8, arena + (c / 3) * 48 + (c % 3) * 16, true);
  napkin_cp_async_commit();
  napkin_cp_async_wait<0>();
  __syncthreads();
  const int m = lane / 8;
  const unsigned short* row = tile + ((m & 1) * 8 + lane % 8) * 24 + (m >> 1) * 8;
  unsigned r[4], t[4];
  napkin_ldmatrix_x4(r, row);
  napkin_ldmatrix_x4_trans(t, row);
  unsigned* out = (unsigned*)(arena + 1024) + lane * 8;
  for (int i = 0; i < 4; ++i) {
    out[i] = r[i];
    out[4 + i] = t[i];
  }
}
)";
}

TEST_CASE("cuda emulator: ldmatrix x4 and x4.trans give the PTX ISA's fragments of a cp.async-filled tile") {
  napkin::testing::CudaEmulator gpu(ldmatrix_source());
  std::unique_ptr<char, decltype(&std::free)> arena(static_cast<char*>(std::aligned_alloc(256, 2048)), &std::free);
  std::memset(arena.get(), 0, 2048);
  uint16_t* tile = reinterpret_cast<uint16_t*>(arena.get());
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 24; ++c) tile[r * 24 + c] = static_cast<uint16_t>(c < 16 ? 1000 + 16 * r + c : 0xdead);
  gpu.launch("ldmatrix_test", 1, 32, 16 * 48, arena.get(), nullptr);
  const unsigned* out = reinterpret_cast<const unsigned*>(arena.get() + 1024);
  auto element = [&](int m, int i, int j) {  // element (i, j) of 8x8 matrix m
    return static_cast<unsigned>(tile[((m & 1) * 8 + i) * 24 + (m >> 1) * 8 + j]);
  };
  for (int lane = 0; lane < 32; ++lane)
    for (int m = 0; m < 4; ++m) {
      INFO("lane " << lane << ", matrix " << m);
      const int g = lane / 4, c = 2 * (lane % 4);
      CHECK(out[lane * 8 + m] == (element(m, g, c) | element(m, g, c + 1) << 16));
      CHECK(out[lane * 8 + 4 + m] == (element(m, c, g) | element(m, c + 1, g) << 16));
    }
}

TEST_CASE("cuda emulator: ldmatrix from an address that is not a 16-byte aligned shared row fails clearly") {
  const std::string src = std::string(napkin::codegen::cuda::cuda_prelude()) + R"(
extern "C" __global__ void __launch_bounds__(32) bad(char* __restrict__ arena, char* __restrict__ scratch) {
  (void)scratch;
  NAPKIN_DYNAMIC_SHARED(unsigned short, tile);
  unsigned r[4];
  napkin_ldmatrix_x4(r, tile + 4 + 8 * (int)threadIdx.x);  // 8 bytes past a 16-byte boundary
  ((unsigned*)arena)[threadIdx.x] = r[0];
}
)";
  napkin::testing::CudaEmulator gpu(src);
  std::unique_ptr<char, decltype(&std::free)> arena(static_cast<char*>(std::aligned_alloc(256, 2048)), &std::free);
  std::string error;
  try {
    gpu.launch("bad", 1, 32, 1024, arena.get(), nullptr);
  } catch (const std::exception& e) {
    error = e.what();
  }
  CHECK(error.find("ldmatrix row address") != std::string::npos);
}

TEST_CASE("nvrtc: the prelude's ldmatrix and cp.async compile for sm_90") {
  napkin::codegen::cuda::NvrtcOptions options;
  options.use_cache = false;
  const auto r = napkin::codegen::cuda::nvrtc_compile(ldmatrix_source(), "ldmatrix_test", options);
  CHECK(r.cubin.size() > 0);
  CHECK(r.ptx.find("ldmatrix.sync.aligned.m8n8.x4.shared.b16") != std::string::npos);
  CHECK(r.ptx.find("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16") != std::string::npos);
  CHECK(r.ptx.find("cp.async.cg.shared.global") != std::string::npos);
}

#endif  // NAPKIN_HAVE_CUDA
