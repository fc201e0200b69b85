// The host CUDA emulator (tests/support/cuda_emulator.h): hand-written CUDA C
// kernels, valid for nvcc/NVRTC as they stand (each source below compiles
// with `nvcc -arch=sm_90 -cubin -x cu`), run on emulated threads and checked
// against hand formulas in double; barriers that cannot complete and sources
// that do not compile fail with clear messages instead of hanging.
#include "support/cuda_emulator.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

using napkin::testing::CudaEmulator;

namespace {

// Device-like memory: zeroed, 256-byte aligned as cudaMalloc returns.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes)
      : data_(static_cast<char*>(std::aligned_alloc(256, (bytes + 255) / 256 * 256)), &std::free) {
    std::memset(data_.get(), 0, bytes);
  }
  char* get() { return data_.get(); }
  template <typename T>
  T* at(size_t byte_offset) {
    return reinterpret_cast<T*>(data_.get() + byte_offset);
  }

 private:
  std::unique_ptr<char, decltype(&std::free)> data_;
};

std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "(no exception)";
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("cuda emulator: a grid-stride elementwise kernel covers every element once, 16-byte loads included") {
  const std::string source = R"cuda(
extern "C" __global__ void __launch_bounds__(128) half_plus_tanh(char* __restrict__ arena, char* __restrict__ scratch) {
  const float* x = reinterpret_cast<const float*>(arena);
  float* y = reinterpret_cast<float*>(arena + 4 * 100003);
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < 100003; i += (long long)gridDim.x * blockDim.x)
    y[i] = fmaf(0.5f, x[i], tanhf(x[i]));
}

// y = -x by flipping sign bits, four floats per 16-byte load and store.
extern "C" __global__ void negate_vec4(char* __restrict__ arena, char* __restrict__ scratch) {
  const uint4* x = reinterpret_cast<const uint4*>(arena);
  uint4* y = reinterpret_cast<uint4*>(arena + 4 * 4096);
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < 1024) {
    uint4 v = x[i];
    y[i] = make_uint4(v.x ^ 0x80000000u, v.y ^ 0x80000000u, v.z ^ 0x80000000u, v.w ^ 0x80000000u);
  }
}

// y = x * 2^k by adding k to the exponent field, through the bit casts.
extern "C" __global__ void scale_exponent(char* __restrict__ arena, char* __restrict__ scratch) {
  const float* x = reinterpret_cast<const float*>(arena);
  float* y = reinterpret_cast<float*>(arena + 4 * 4096);
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < 4096) y[i] = __int_as_float(__float_as_int(x[i]) + ((i % 5) << 23));
}
)cuda";
  CudaEmulator emu(source);

  const size_t n = 100003;
  std::vector<float> x = random_floats(n, 1);
  DeviceBuffer arena(8 * n + 4);
  std::memcpy(arena.get(), x.data(), 4 * n);
  arena.at<float>(8 * n)[0] = 12345.0f;  // just past y
  emu.launch("half_plus_tanh", 7, 128, 0, arena.get(), nullptr);  // 896 threads: ~112 elements each
  const float* y = arena.at<float>(4 * n);
  double worst = 0;
  for (size_t i = 0; i < n; ++i) worst = std::max(worst, std::abs(y[i] - (0.5 * x[i] + std::tanh(double(x[i])))));
  CHECK(worst < 1e-6);
  CHECK(arena.at<float>(8 * n)[0] == 12345.0f);

  DeviceBuffer vec(8 * 4096);
  std::vector<float> v = random_floats(4096, 2);
  std::memcpy(vec.get(), v.data(), 4 * 4096);
  emu.launch("negate_vec4", 4, 256, 0, vec.get(), nullptr);
  int wrong = 0;
  for (int i = 0; i < 4096; ++i) wrong += vec.at<float>(4 * 4096)[i] != -v[i];
  CHECK(wrong == 0);

  emu.launch("scale_exponent", 16, 256, 0, vec.get(), nullptr);
  wrong = 0;
  for (int i = 0; i < 4096; ++i) wrong += vec.at<float>(4 * 4096)[i] != std::ldexp(v[i], i % 5);
  CHECK(wrong == 0);
}

TEST_CASE("cuda emulator: a kernel's by-value offsets parameter reaches every thread, launch by launch") {
  // codegen/cuda's signature: operands at arena + off.at[j]; one function,
  // launched on two sets of operands.
  const std::string source = R"cuda(
template <int N> struct Offsets { long long at[N]; };
#ifdef NAPKIN_HOST_EMULATION
#define OFFSETS(n) Offsets<n>&
#else
#define OFFSETS(n) Offsets<n>
#endif
extern "C" __global__ void axpy(char* __restrict__ arena, char* __restrict__ scratch, const OFFSETS(3) off) {
  const float* x = (const float*)(arena + off.at[0]);
  const float* y = (const float*)(arena + off.at[1]);
  float* out = (float*)(arena + off.at[2]);
  for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < 1000u; i += gridDim.x * blockDim.x) out[i] = 3.0f * x[i] + y[i];
}
)cuda";
  CudaEmulator emu(source);
  const size_t n = 1000;
  std::vector<float> v = random_floats(4 * n, 7);
  DeviceBuffer arena(4 * 6 * n);
  std::memcpy(arena.get(), v.data(), 4 * 4 * n);
  emu.launch("axpy", 3, 128, 0, arena.get(), nullptr, {0, 4 * n, 4 * 4 * n});
  emu.launch("axpy", 2, 256, 0, arena.get(), nullptr, {4 * 2 * n, 4 * 3 * n, 4 * 5 * n});
  for (size_t i = 0; i < n; ++i) {
    CHECK(arena.at<float>(4 * 4 * n)[i] == 3.0f * v[i] + v[n + i]);
    CHECK(arena.at<float>(4 * 5 * n)[i] == 3.0f * v[2 * n + i] + v[3 * n + i]);
  }
}

TEST_CASE("cuda emulator: a block reduction through __shared__ and a __syncthreads tree") {
  const std::string source = R"cuda(
// One block per row of 1000 floats: strided partial sums, then a tree.
extern "C" __global__ void row_sums(char* __restrict__ arena, char* __restrict__ scratch) {
  __shared__ float partial[256];
  const float* x = reinterpret_cast<const float*>(arena) + blockIdx.x * 1000;
  float* out = reinterpret_cast<float*>(arena + 4 * 1000 * 64);
  float s = 0.0f;
  for (int c = threadIdx.x; c < 1000; c += blockDim.x) s += x[c];
  partial[threadIdx.x] = s;
  __syncthreads();
  for (unsigned stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = partial[0];
}
)cuda";
  CudaEmulator emu(source);
  std::vector<float> x = random_floats(64 * 1000, 3);
  DeviceBuffer arena(4 * 64 * 1000 + 4 * 64);
  std::memcpy(arena.get(), x.data(), 4 * x.size());
  for (int block : {256, 64, 32}) {
    CAPTURE(block);
    std::memset(arena.at<float>(4 * 64 * 1000), 0, 4 * 64);
    emu.launch("row_sums", 64, block, 0, arena.get(), nullptr);
    for (int r = 0; r < 64; ++r) {
      double want = 0, magnitude = 0;
      for (int c = 0; c < 1000; ++c) want += x[r * 1000 + c], magnitude += std::abs(x[r * 1000 + c]);
      CHECK(std::abs(arena.at<float>(4 * 64 * 1000)[r] - want) <= 1e-6 * magnitude);
    }
  }
}

TEST_CASE("cuda emulator: __shfl_xor_sync is CUDA's butterfly, with width segments and every value type") {
  const std::string source = R"cuda(
extern "C" __global__ void shuffle_lanes(char* __restrict__ arena, char* __restrict__ scratch) {
  int t = threadIdx.x;
  int* xor5 = reinterpret_cast<int*>(arena);
  int* xor8_width8 = xor5 + 64;
  double* xor1_double = reinterpret_cast<double*>(arena + 512);
  long long* xor31_long = reinterpret_cast<long long*>(arena + 1024);
  unsigned* xor2_width4 = reinterpret_cast<unsigned*>(arena + 1536);
  xor5[t] = __shfl_xor_sync(0xffffffffu, t, 5);
  xor8_width8[t] = __shfl_xor_sync(0xffffffffu, t, 8, 8);
  xor1_double[t] = __shfl_xor_sync(0xffffffffu, t + 0.5, 1);
  xor31_long[t] = __shfl_xor_sync(0xffffffffu, (long long)t << 40, 31);
  xor2_width4[t] = __shfl_xor_sync(0xffffffffu, (unsigned)t, 2, 4);
}
)cuda";
  CudaEmulator emu(source);
  DeviceBuffer arena(2048);
  emu.launch("shuffle_lanes", 1, 64, 0, arena.get(), nullptr);
  for (int t = 0; t < 64; ++t) {
    CAPTURE(t);
    int warp_base = t / 32 * 32, lane = t % 32;
    // CUDA's rule for width w: lane l reads l ^ m, or keeps its own value when
    // l ^ m lies in a later w-lane group than l.
    auto source_lane = [&](int m, int w) { return (lane ^ m) / w > lane / w ? lane : lane ^ m; };
    CHECK(arena.at<int>(0)[t] == warp_base + (lane ^ 5));
    CHECK(arena.at<int>(256)[t] == warp_base + source_lane(8, 8));
    CHECK(arena.at<double>(512)[t] == warp_base + (lane ^ 1) + 0.5);
    CHECK(arena.at<long long>(1024)[t] == static_cast<long long>(warp_base + (lane ^ 31)) << 40);
    CHECK(arena.at<unsigned>(1536)[t] == static_cast<unsigned>(warp_base + source_lane(2, 4)));
  }
  // Lanes 8-15 read the earlier group (0-7); lanes 0-7 keep their own.
  CHECK(arena.at<int>(256)[3] == 3);
  CHECK(arena.at<int>(256)[11] == 3);
}

TEST_CASE("cuda emulator: a warp-shuffle reduction combined across warps through __shared__") {
  const std::string source = R"cuda(
template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
  for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int m = 16; m > 0; m >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, m));
  return v;
}

__device__ __forceinline__ unsigned warp_xor(unsigned v) {
  for (int m = 16; m > 0; m >>= 1) v ^= __shfl_xor_sync(0xffffffffu, v, m);
  return v;
}

// Per row of 777 floats: sum, max, sum of squares (double), positives
// (long long), negatives (int), and the xor of all bit patterns.
extern "C" __global__ void row_stats(char* __restrict__ arena, char* __restrict__ scratch) {
  __shared__ float warp_sums[32];
  __shared__ float warp_maxes[32];
  __shared__ double warp_squares[32];
  __shared__ long long warp_positives[32];
  __shared__ int warp_negatives[32];
  __shared__ unsigned warp_bits[32];
  const int rows = 40, cols = 777;
  const float* x = reinterpret_cast<const float*>(arena) + blockIdx.x * cols;
  char* out = arena + 4 * rows * cols;
  float sum = 0.0f, mx = __int_as_float(0xff800000);  // -inf
  double squares = 0.0;
  long long positives = 0;
  int negatives = 0;
  unsigned bits = 0;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) {
    float v = x[c];
    sum += v;
    mx = fmaxf(mx, v);
    squares += (double)v * v;
    positives += v > 0.0f;
    negatives += v < 0.0f;
    bits ^= __float_as_uint(v);
  }
  sum = warp_sum(sum);
  mx = warp_max(mx);
  squares = warp_sum(squares);
  positives = warp_sum(positives);
  negatives = warp_sum(negatives);
  bits = warp_xor(bits);
  int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  if (lane == 0) {
    warp_sums[warp] = sum;
    warp_maxes[warp] = mx;
    warp_squares[warp] = squares;
    warp_positives[warp] = positives;
    warp_negatives[warp] = negatives;
    warp_bits[warp] = bits;
  }
  __syncthreads();
  if (warp == 0) {
    sum = warp_sum(lane < warps ? warp_sums[lane] : 0.0f);
    mx = warp_max(lane < warps ? warp_maxes[lane] : __int_as_float(0xff800000));
    squares = warp_sum(lane < warps ? warp_squares[lane] : 0.0);
    positives = warp_sum(lane < warps ? warp_positives[lane] : 0ll);
    negatives = warp_sum(lane < warps ? warp_negatives[lane] : 0);
    bits = warp_xor(lane < warps ? warp_bits[lane] : 0u);
    if (lane == 0) {
      reinterpret_cast<float*>(out)[blockIdx.x] = sum;
      reinterpret_cast<float*>(out + 4 * rows)[blockIdx.x] = mx;
      reinterpret_cast<double*>(out + 8 * rows)[blockIdx.x] = squares;
      reinterpret_cast<long long*>(out + 16 * rows)[blockIdx.x] = positives;
      reinterpret_cast<int*>(out + 24 * rows)[blockIdx.x] = negatives;
      reinterpret_cast<unsigned*>(out + 28 * rows)[blockIdx.x] = bits;
    }
  }
}
)cuda";
  CudaEmulator emu(source);
  const int rows = 40, cols = 777;
  std::vector<float> x = random_floats(rows * cols, 4);
  for (int i = 0; i < rows * cols; i += 97) x[i] = 0.0f;  // neither positive nor negative
  DeviceBuffer arena(4 * rows * cols + 32 * rows);
  std::memcpy(arena.get(), x.data(), 4 * x.size());
  char* out = arena.get() + 4 * rows * cols;
  for (int block : {1024, 128, 32}) {
    CAPTURE(block);
    std::memset(out, 0, 32 * rows);
    emu.launch("row_stats", rows, block, 0, arena.get(), nullptr);
    for (int r = 0; r < rows; ++r) {
      CAPTURE(r);
      double sum = 0, magnitude = 0, squares = 0;
      float mx = -INFINITY;
      long long positives = 0;
      int negatives = 0;
      unsigned bits = 0;
      for (int c = 0; c < cols; ++c) {
        float v = x[r * cols + c];
        sum += v, magnitude += std::abs(v), squares += double(v) * v;
        mx = std::max(mx, v);
        positives += v > 0, negatives += v < 0;
        uint32_t b;
        std::memcpy(&b, &v, 4);
        bits ^= b;
      }
      CHECK(std::abs(reinterpret_cast<float*>(out)[r] - sum) <= 1e-6 * magnitude);
      CHECK(reinterpret_cast<float*>(out + 4 * rows)[r] == mx);
      CHECK(std::abs(reinterpret_cast<double*>(out + 8 * rows)[r] - squares) <= 1e-12 * squares);
      CHECK(reinterpret_cast<long long*>(out + 16 * rows)[r] == positives);
      CHECK(reinterpret_cast<int*>(out + 24 * rows)[r] == negatives);
      CHECK(reinterpret_cast<unsigned*>(out + 28 * rows)[r] == bits);
    }
  }
}

TEST_CASE("cuda emulator: NAPKIN_DYNAMIC_SHARED is the launch's dynamic shared memory, unwritten bytes poisoned") {
  // The #ifndef is the GPU's side of the macro; the shim defines the host's.
  const std::string source = R"cuda(
#ifndef NAPKIN_HOST_EMULATION
#define NAPKIN_DYNAMIC_SHARED(type, name) extern __shared__ __align__(16) type name[]
#endif

// Reverses each row of 300 floats through shared memory: every thread reads
// what others wrote, so it is right only if the barrier holds them all.
extern "C" __global__ void reverse_rows(char* __restrict__ arena, char* __restrict__ scratch) {
  NAPKIN_DYNAMIC_SHARED(float, row);
  const int cols = 300;
  const float* x = reinterpret_cast<const float*>(arena) + blockIdx.x * cols;
  float* y = reinterpret_cast<float*>(arena + 4 * 300 * 8) + blockIdx.x * cols;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) row[c] = x[c];
  __syncthreads();
  for (int c = threadIdx.x; c < cols; c += blockDim.x) y[c] = row[cols - 1 - c];
}

// Reads shared memory that nothing in the block wrote.
extern "C" __global__ void read_unwritten(char* __restrict__ arena, char* __restrict__ scratch) {
  NAPKIN_DYNAMIC_SHARED(double, unwritten);
  reinterpret_cast<double*>(arena)[threadIdx.x] = unwritten[threadIdx.x];
}
)cuda";
  CudaEmulator emu(source);
  std::vector<float> x = random_floats(8 * 300, 5);
  DeviceBuffer arena(2 * 4 * 8 * 300);
  std::memcpy(arena.get(), x.data(), 4 * x.size());
  emu.launch("reverse_rows", 8, 128, 4 * 300, arena.get(), nullptr);
  int wrong = 0;
  for (int r = 0; r < 8; ++r)
    for (int c = 0; c < 300; ++c) wrong += arena.at<float>(4 * 300 * 8)[r * 300 + c] != x[r * 300 + 299 - c];
  CHECK(wrong == 0);

  emu.launch("read_unwritten", 1, 64, 8 * 64, arena.get(), nullptr);
  for (int t = 0; t < 64; ++t) CHECK(std::isnan(arena.at<double>(0)[t]));
}

TEST_CASE("cuda emulator: a two-launch sum passes block partials through scratch") {
  const std::string source = R"cuda(
// Launch 1 (40 blocks): each block's share of 100000 floats, grid-stride.
extern "C" __global__ void partial_sums(char* __restrict__ arena, char* __restrict__ scratch) {
  __shared__ float partial[256];
  const float* x = reinterpret_cast<const float*>(arena);
  float s = 0.0f;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < 100000; i += gridDim.x * blockDim.x) s += x[i];
  partial[threadIdx.x] = s;
  __syncthreads();
  for (unsigned stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) reinterpret_cast<float*>(scratch)[blockIdx.x] = partial[0];
}

// Launch 2 (one block of 64): the 40 partials, in a fixed order.
extern "C" __global__ void final_sum(char* __restrict__ arena, char* __restrict__ scratch) {
  __shared__ float partial[64];
  partial[threadIdx.x] = threadIdx.x < 40 ? reinterpret_cast<const float*>(scratch)[threadIdx.x] : 0.0f;
  __syncthreads();
  for (unsigned stride = 32; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) reinterpret_cast<float*>(arena + 4 * 100000)[0] = partial[0];
}
)cuda";
  CudaEmulator emu(source);
  std::vector<float> x = random_floats(100000, 6);
  DeviceBuffer arena(4 * 100000 + 4), scratch(4 * 40);
  std::memcpy(arena.get(), x.data(), 4 * x.size());
  emu.launch("partial_sums", 40, 256, 0, arena.get(), scratch.get());
  emu.launch("final_sum", 1, 64, 0, arena.get(), scratch.get());
  double want = 0, magnitude = 0;
  for (float v : x) want += v, magnitude += std::abs(v);
  CHECK(std::abs(arena.at<float>(4 * 100000)[0] - want) <= 1e-6 * magnitude);
  // Each partial is its block's grid-stride share.
  double block7 = 0;
  for (int i = 7 * 256; i < 100000; i += 40 * 256)
    for (int j = i; j < std::min(i + 256, 100000); ++j) block7 += x[j];
  CHECK(std::abs(scratch.at<float>(0)[7] - block7) <= 1e-6 * magnitude);
}

TEST_CASE("cuda emulator: __device__ globals and atomicCAS") {
  const std::string source = R"cuda(
__device__ unsigned long long first_negative_plus_one;

extern "C" __global__ void find_negative(char* __restrict__ arena, char* __restrict__ scratch) {
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < 5000 && reinterpret_cast<const float*>(arena)[i] < 0.0f)
    atomicCAS(&first_negative_plus_one, 0ull, (unsigned long long)i + 1);
}
)cuda";
  CudaEmulator emu(source);
  DeviceBuffer arena(4 * 5000);
  for (int i = 0; i < 5000; ++i) arena.at<float>(0)[i] = i == 3217 ? -1.0f : 1.0f;
  emu.launch("find_negative", 20, 256, 0, arena.get(), nullptr);
  CHECK(*static_cast<unsigned long long*>(emu.global("first_negative_plus_one")) == 3218);
  arena.at<float>(0)[3217] = 1.0f;
  arena.at<float>(0)[11] = -1.0f;
  emu.launch("find_negative", 20, 256, 0, arena.get(), nullptr);  // compare fails: the first value stays
  CHECK(*static_cast<unsigned long long*>(emu.global("first_negative_plus_one")) == 3218);
  CHECK(contains(error_of([&] { emu.global("no_such_variable"); }), "no __device__ variable 'no_such_variable'"));
}

TEST_CASE("cuda emulator: a barrier some threads never reach is an error naming the kernel, not a hang") {
  const std::string source = R"cuda(
extern "C" __global__ void early_return(char* __restrict__ arena, char* __restrict__ scratch) {
  float* y = reinterpret_cast<float*>(arena);
  if (threadIdx.x >= 100) return;
  y[threadIdx.x] = 1.0f;
  __syncthreads();
  y[threadIdx.x] += y[(threadIdx.x + 1) % 100];
}

extern "C" __global__ void lane_returns_before_shuffle(char* __restrict__ arena, char* __restrict__ scratch) {
  if (threadIdx.x % 32 == 7) return;
  reinterpret_cast<float*>(arena)[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
}

extern "C" __global__ void lane_at_other_barrier(char* __restrict__ arena, char* __restrict__ scratch) {
  float v = 1.0f;
  if (threadIdx.x == 35)
    __syncthreads();
  else
    v = __shfl_xor_sync(0xffffffffu, v, 1);
  reinterpret_cast<float*>(arena)[threadIdx.x] = v;
}

extern "C" __global__ void partial_warp_shuffle(char* __restrict__ arena, char* __restrict__ scratch) {
  reinterpret_cast<float*>(arena)[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 16);
}

extern "C" __global__ void ones(char* __restrict__ arena, char* __restrict__ scratch) {
  __shared__ float s[128];
  s[threadIdx.x] = 1.0f;
  __syncthreads();
  reinterpret_cast<float*>(arena)[blockIdx.x * blockDim.x + threadIdx.x] = s[127 - threadIdx.x];
}
)cuda";
  CudaEmulator emu(source);
  DeviceBuffer arena(4 * 1024);
  std::string e = error_of([&] { emu.launch("early_return", 2, 128, 0, arena.get(), nullptr); });
  CHECK(contains(e, "kernel 'early_return' (grid 2, block 128), block 0"));
  CHECK(contains(e, "__syncthreads() can never complete: 100 of the 128 threads wait at it (thread 0 first), 28 "
                    "returned without reaching it (thread 100 first)"));

  e = error_of([&] { emu.launch("lane_returns_before_shuffle", 1, 64, 0, arena.get(), nullptr); });
  CHECK(contains(e, "kernel 'lane_returns_before_shuffle'"));
  CHECK(contains(e, "31 of the 32 lanes of warp 0 wait at __shfl_xor_sync (lane 0 first), which lane 7 never "
                    "reaches: it returned"));

  e = error_of([&] { emu.launch("lane_at_other_barrier", 1, 64, 0, arena.get(), nullptr); });
  CHECK(contains(e, "warp 1 wait at __shfl_xor_sync (lane 0 first), which lane 3 never reaches: it waits at "
                    "__syncthreads()"));

  e = error_of([&] { emu.launch("partial_warp_shuffle", 1, 48, 0, arena.get(), nullptr); });
  CHECK(contains(e, "thread 32: a shuffle reads lane 16, which warp 1 of a 48-thread block does not have"));

  CHECK(contains(error_of([&] { emu.launch("ones", 1, 1025, 0, arena.get(), nullptr); }), "invalid launch"));
  CHECK(contains(error_of([&] { emu.launch("ones", 0, 128, 0, arena.get(), nullptr); }), "invalid launch"));
  CHECK(contains(error_of([&] { emu.launch("ones", 1, 128, 0, arena.get() + 4, nullptr); }), "16-byte aligned"));
  CHECK(contains(error_of([&] { emu.launch("no_such_kernel", 1, 1, 0, arena.get(), nullptr); }),
                 "no __global__ function 'no_such_kernel'"));

  // The failed launches' stopped threads are discarded, not kept: 100 per
  // failure would exhaust the 1024 coroutines in 11 failures.
  for (int i = 0; i < 12; ++i)
    CHECK(contains(error_of([&] { emu.launch("early_return", 1, 128, 0, arena.get(), nullptr); }), "early_return"));
  emu.launch("ones", 8, 128, 0, arena.get(), nullptr);
  int wrong = 0;
  for (int i = 0; i < 1024; ++i) wrong += arena.at<float>(0)[i] != 1.0f;
  CHECK(wrong == 0);
}

TEST_CASE("cuda emulator: a source that does not compile throws with the compiler's message") {
  const std::string source = R"cuda(
extern "C" __global__ void broken(char* __restrict__ arena, char* __restrict__ scratch) {
  reinterpret_cast<float*>(arena)[threadIdx.x] = undeclared_value;
}
)cuda";
  std::string e = error_of([&] { CudaEmulator emu(source); });
  CHECK(contains(e, "the host compiler failed"));
  CHECK(contains(e, "undeclared_value"));  // g++ quotes it with the locale's quote marks
  CHECK(contains(e, "was not declared in this scope"));
}
