// The prelude of every CUDA translation unit (codegen/cuda/kernel_source.h):
// the helpers the generated kernels call, written once here so the kernels
// stay short and the numerics live in one place.
//
// Terms:
//  - compute type: float for f32, f16, bf16 and the fp8 formats; double for
//    f64; the integer itself for i32/i64; bool for bool (stored as one byte).
//    The same as the CPU backend's (codegen/cpu/loop_emitter.h).
//  - storage bits: how a dtype sits in memory: unsigned short for bf16/f16,
//    unsigned char for fp8 and bool.
//  - device-only: everything under `#ifndef NAPKIN_HOST_EMULATION`. Under host
//    emulation (tests/support/cuda_host_shim.h, included before the prelude)
//    the shim defines the CUDA keywords, thread indices, __syncthreads,
//    __shfl_xor_sync, __shfl_sync, napkin_emu_mma_m16n8k16 (mma.sync),
//    napkin_emu_ldmatrix_x4 (ldmatrix), atomicCAS, uint4 and
//    NAPKIN_DYNAMIC_SHARED; the rest of
//    the prelude (the global napkin_bad_index included) is plain C++17.
//
// The API (all NAPKIN_DEVICE = __device__ __forceinline__):
//  bits:       napkin_f32_bits, napkin_f32_from_bits, napkin_f64_bits, napkin_f64_from_bits
//  dtypes:     napkin_bf16_to_f32 / napkin_f32_to_bf16 / napkin_round_bf16, and the same
//              for f16, e4m3, e5m2 (load exact; store nearest-even with subnormals,
//              NaN and overflow as runtime/float_formats.cpp); napkin_to_i32_sat,
//              napkin_to_i64_sat (float/double -> int: toward zero, saturating, NaN -> 0)
//  constants:  napkin_inf_f32, napkin_inf_f64, napkin_nan_f32
//  math:       napkin_exp, _log, _sqrt, _sin, _cos, _pow, _erf, _fabs (float and double
//              overloads); napkin_tanh (the CPU backend's exp-based tanh,
//              codegen/cpu/scalar_ops.cpp); napkin_maximum/_minimum (NaN-propagating,
//              +0 > -0, as llvm.maximum/minimum), napkin_maxnum (NaN-ignoring, as llvm.maxnum).
//              The primitives of ir/elementwise_formulas.h: the elementwise ops'
//              formulas (gelu, sigmoid, ...) are written there, once, and
//              codegen/cuda/elementwise.cpp spells them as expressions over these.
//  random:     napkin_philox_word0 (runtime/rng.h's Philox4x32-10, word 0: dropout's keep test)
//  reductions: napkin_sum_op, napkin_max_op, napkin_min_op, napkin_maxnum_op (combiners);
//              napkin_warp_reduce(v, op) (xor butterfly: every lane gets the same bits),
//              napkin_block_reduce(v, op, identity, shared32) (every thread gets the same
//              bits; call it from every thread of the block)
//  bad index:  NAPKIN_BAD_INDEX(kernel, id, bound): see napkin_bad_index below
//  routing:    napkin_top_k_beats (top_k's order, ir/loop.h TopKParams)
//  offsets:    NapkinOffsets<N>, NAPKIN_OFFSETS(N) (the kernels' third parameter's type)
//  tensor cores: napkin_mma_m16n8k16_bf16 / _f16 (mma.sync, f32 accumulators; a
//              warp-collective the shim emulates), napkin_ldmatrix_x4 / _x4_trans
//              (ldmatrix, likewise), napkin_pack_bf16x2 / _f16x2 (two floats rounded
//              to nearest even into one register)
//  async copy: napkin_cp_async16, napkin_cp_async_commit, napkin_cp_async_wait<N>
//              (cp.async: global -> shared without registers)
//  attention:  the fused attention templates (codegen/cuda/attention_device.cpp),
//              appended after the rest
//  misc:       NAPKIN_UNROLL (#pragma unroll on the device), NAPKIN_DYNAMIC_SHARED(type, name)
#include <string>

#include "codegen/cuda/emit.h"
#include "codegen/cuda/kernel_source.h"

namespace napkin::codegen::cuda {

std::string_view cuda_prelude() {
  static constexpr std::string_view text = R"PRELUDE(// ---- napkin CUDA prelude (codegen/cuda/prelude.cpp) ----
#ifndef NAPKIN_HOST_EMULATION
#define NAPKIN_DEVICE __device__ __forceinline__
#define NAPKIN_UNROLL _Pragma("unroll")
#define NAPKIN_DYNAMIC_SHARED(type, name) extern __shared__ __align__(16) type name[]
NAPKIN_DEVICE float napkin_f32_from_bits(unsigned u) { return __uint_as_float(u); }
NAPKIN_DEVICE unsigned napkin_f32_bits(float f) { return __float_as_uint(f); }
NAPKIN_DEVICE double napkin_f64_from_bits(unsigned long long u) { return __longlong_as_double((long long)u); }
NAPKIN_DEVICE unsigned long long napkin_f64_bits(double d) { return (unsigned long long)__double_as_longlong(d); }
#else
#define NAPKIN_DEVICE inline
#define NAPKIN_UNROLL
NAPKIN_DEVICE float napkin_f32_from_bits(unsigned u) { float f; __builtin_memcpy(&f, &u, 4); return f; }
NAPKIN_DEVICE unsigned napkin_f32_bits(float f) { unsigned u; __builtin_memcpy(&u, &f, 4); return u; }
NAPKIN_DEVICE double napkin_f64_from_bits(unsigned long long u) { double d; __builtin_memcpy(&d, &u, 8); return d; }
NAPKIN_DEVICE unsigned long long napkin_f64_bits(double d) { unsigned long long u; __builtin_memcpy(&u, &d, 8); return u; }
#endif

// A kernel's operand byte offsets (codegen/cuda/kernel_source.h, signature):
// by value on the device, where kernel parameters live in constant memory;
// by reference under host emulation, so the emulator passes any N as a pointer
// to N long longs.
template <int N> struct NapkinOffsets { long long at[N]; };
#ifndef NAPKIN_HOST_EMULATION
#define NAPKIN_OFFSETS(n) NapkinOffsets<n>
#else
#define NAPKIN_OFFSETS(n) NapkinOffsets<n>&
#endif

// An embedding or class id outside [0, bound): the CPU backend calls
// napkin_rt_bad_index and exits. A kernel cannot exit, so the first kernel to
// see one stores {kernel index, id, bound} here (element 0 starts at -1; the
// first writer wins through atomicCAS on it) and skips that element. The
// runtime reads this global (cuModuleGetGlobal "napkin_bad_index") after a step
// and reports it as the CPU does.
__device__ long long napkin_bad_index[3] = {-1, 0, 0};

NAPKIN_DEVICE void napkin_report_bad_index(long long kernel, long long id, long long bound) {
  unsigned long long* first = (unsigned long long*)&napkin_bad_index[0];
  if (atomicCAS(first, ~0ull, (unsigned long long)kernel) == ~0ull) {
    napkin_bad_index[1] = id;
    napkin_bad_index[2] = bound;
  }
}
#define NAPKIN_BAD_INDEX(kernel, id, bound) napkin_report_bad_index((kernel), (long long)(id), (bound))

// top_k's order (ir/loop.h TopKParams): value a at index i comes before value
// b at index j when a is NaN and b is not, or a > b; between equals (and two
// NaNs) the lower index first. A strict total order on (value, index).
template <typename T> NAPKIN_DEVICE bool napkin_top_k_beats(T a, long long i, T b, long long j) {
  const bool a_nan = a != a, b_nan = b != b;
  if (a_nan || b_nan) return a_nan && (!b_nan || i < j);
  return a > b || (a == b && i < j);
}

NAPKIN_DEVICE float napkin_inf_f32() { return napkin_f32_from_bits(0x7F800000u); }
NAPKIN_DEVICE float napkin_nan_f32() { return napkin_f32_from_bits(0x7FC00000u); }
NAPKIN_DEVICE double napkin_inf_f64() { return napkin_f64_from_bits(0x7FF0000000000000ull); }

// ---- dtype conversions (the bits of runtime/float_formats.cpp) ----
// bf16 is the top half of a float32.
NAPKIN_DEVICE float napkin_bf16_to_f32(unsigned short b) { return napkin_f32_from_bits((unsigned)b << 16); }
NAPKIN_DEVICE unsigned short napkin_f32_to_bf16(float x) {
  const unsigned u = napkin_f32_bits(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (unsigned short)(((u >> 16) & 0x8000u) | 0x7FC0u);
  return (unsigned short)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
NAPKIN_DEVICE float napkin_round_bf16(float x) { return napkin_bf16_to_f32(napkin_f32_to_bf16(x)); }

// A finite float32 magnitude rounded (nearest, ties to even) to a format with
// `mbits` fraction bits and minimum normal exponent `min_exp`: its code, which
// may exceed the largest finite code when the value overflows.
NAPKIN_DEVICE unsigned napkin_round_magnitude(unsigned magnitude, int mbits, int min_exp) {
  const int biased = (int)(magnitude >> 23);
  const unsigned significand = (magnitude & 0x7FFFFFu) | (biased ? 0x800000u : 0u);
  const int exponent = (biased > 1 ? biased : 1) - 127;
  const int target = exponent > min_exp ? exponent : min_exp;
  const int shift = target - exponent + 23 - mbits;
  if (shift >= 25) return 0u;
  unsigned q = significand >> shift;
  const unsigned rest = significand & ((1u << shift) - 1u);
  const unsigned half = 1u << (shift - 1);
  if (rest > half || (rest == half && (q & 1u))) ++q;
  return ((unsigned)(target - min_exp) << mbits) + q;
}

// float -> a narrow format's code (non-saturating): NaN -> S.1..1.nan_mantissa,
// too large -> inf (or NaN for finite-only E4M3).
NAPKIN_DEVICE unsigned napkin_encode(float x, int ebits, int mbits, bool finite_only, unsigned nan_mantissa) {
  const unsigned u = napkin_f32_bits(x);
  const unsigned sign = (u >> 31) << (ebits + mbits);
  const unsigned magnitude = u & 0x7FFFFFFFu;
  const unsigned all_ones = (1u << (ebits + mbits)) - 1u;
  const unsigned exponent_ones = ((1u << ebits) - 1u) << mbits;
  const unsigned max_finite = finite_only ? all_ones - 1u : exponent_ones - 1u;
  const unsigned overflow = finite_only ? all_ones : exponent_ones;
  if (magnitude > 0x7F800000u) return sign | exponent_ones | nan_mantissa;
  if (magnitude == 0x7F800000u) return sign | overflow;
  const unsigned code = napkin_round_magnitude(magnitude, mbits, 2 - (1 << (ebits - 1)));
  return sign | (code > max_finite ? overflow : code);
}

// A narrow format's code -> float, exact (NaN payloads moved to the top of
// float32's fraction).
NAPKIN_DEVICE float napkin_decode(unsigned code, int ebits, int mbits, bool finite_only) {
  const unsigned sign = ((code >> (ebits + mbits)) & 1u) << 31;
  const unsigned magnitude = code & ((1u << (ebits + mbits)) - 1u);
  const unsigned exponent = magnitude >> mbits;
  const unsigned mantissa = magnitude & ((1u << mbits) - 1u);
  const int bias = (1 << (ebits - 1)) - 1;
  const bool special = finite_only ? magnitude == (1u << (ebits + mbits)) - 1u : exponent == (1u << ebits) - 1u;
  unsigned bits;
  if (special) {
    bits = 0x7F800000u | (mantissa << (23 - mbits));
  } else if (exponent == 0) {  // mantissa * 2^(1 - bias - mbits): a normal float32
    bits = napkin_f32_bits((float)mantissa * napkin_f32_from_bits((unsigned)(127 + 1 - bias - mbits) << 23));
  } else {
    bits = ((exponent + (unsigned)(127 - bias)) << 23) | (mantissa << (23 - mbits));
  }
  return napkin_f32_from_bits(sign | bits);
}

NAPKIN_DEVICE float napkin_f16_to_f32(unsigned short h) { return napkin_decode(h, 5, 10, false); }
NAPKIN_DEVICE unsigned short napkin_f32_to_f16(float x) { return (unsigned short)napkin_encode(x, 5, 10, false, 0x200u); }
NAPKIN_DEVICE float napkin_round_f16(float x) { return napkin_f16_to_f32(napkin_f32_to_f16(x)); }
NAPKIN_DEVICE float napkin_e4m3_to_f32(unsigned char c) { return napkin_decode(c, 4, 3, true); }
NAPKIN_DEVICE unsigned char napkin_f32_to_e4m3(float x) { return (unsigned char)napkin_encode(x, 4, 3, true, 0x7u); }
NAPKIN_DEVICE float napkin_round_e4m3(float x) { return napkin_e4m3_to_f32(napkin_f32_to_e4m3(x)); }
NAPKIN_DEVICE float napkin_e5m2_to_f32(unsigned char c) { return napkin_decode(c, 5, 2, false); }
NAPKIN_DEVICE unsigned char napkin_f32_to_e5m2(float x) { return (unsigned char)napkin_encode(x, 5, 2, false, 0x3u); }
NAPKIN_DEVICE float napkin_round_e5m2(float x) { return napkin_e5m2_to_f32(napkin_f32_to_e5m2(x)); }

// float -> integer: toward zero, saturating, NaN -> 0 (llvm.fptosi.sat).
NAPKIN_DEVICE int napkin_to_i32_sat(double v) {
  if (v != v) return 0;
  if (v >= 2147483648.0) return 2147483647;
  if (v <= -2147483648.0) return -2147483647 - 1;
  return (int)v;
}
NAPKIN_DEVICE int napkin_to_i32_sat(float v) { return napkin_to_i32_sat((double)v); }
NAPKIN_DEVICE long long napkin_to_i64_sat(double v) {
  if (v != v) return 0;
  if (v >= 9223372036854775808.0) return 9223372036854775807LL;
  if (v <= -9223372036854775808.0) return -9223372036854775807LL - 1;
  return (long long)v;
}
NAPKIN_DEVICE long long napkin_to_i64_sat(float v) { return napkin_to_i64_sat((double)v); }

// ---- math: float and double overloads ----
NAPKIN_DEVICE float napkin_exp(float x) { return expf(x); }
NAPKIN_DEVICE double napkin_exp(double x) { return exp(x); }
NAPKIN_DEVICE float napkin_log(float x) { return logf(x); }
NAPKIN_DEVICE double napkin_log(double x) { return log(x); }
NAPKIN_DEVICE float napkin_sqrt(float x) { return sqrtf(x); }
NAPKIN_DEVICE double napkin_sqrt(double x) { return sqrt(x); }
NAPKIN_DEVICE float napkin_sin(float x) { return sinf(x); }
NAPKIN_DEVICE double napkin_sin(double x) { return sin(x); }
NAPKIN_DEVICE float napkin_cos(float x) { return cosf(x); }
NAPKIN_DEVICE double napkin_cos(double x) { return cos(x); }
NAPKIN_DEVICE float napkin_pow(float x, float y) { return powf(x, y); }
NAPKIN_DEVICE double napkin_pow(double x, double y) { return pow(x, y); }
NAPKIN_DEVICE float napkin_erf(float x) { return erff(x); }
NAPKIN_DEVICE double napkin_erf(double x) { return erf(x); }
NAPKIN_DEVICE float napkin_fabs(float x) { return fabsf(x); }
NAPKIN_DEVICE double napkin_fabs(double x) { return fabs(x); }
NAPKIN_DEVICE float napkin_maxnum(float a, float b) { return fmaxf(a, b); }
NAPKIN_DEVICE double napkin_maxnum(double a, double b) { return fmax(a, b); }
NAPKIN_DEVICE bool napkin_sign_bit(float x) { return (napkin_f32_bits(x) >> 31) != 0u; }
NAPKIN_DEVICE bool napkin_sign_bit(double x) { return (napkin_f64_bits(x) >> 63) != 0ull; }

template <typename T> NAPKIN_DEVICE T napkin_maximum(T a, T b) {
  if (a != a) return a;
  if (b != b) return b;
  if (a == b) return napkin_sign_bit(a) ? b : a;  // +0 over -0
  return a > b ? a : b;
}
template <typename T> NAPKIN_DEVICE T napkin_minimum(T a, T b) {
  if (a != a) return a;
  if (b != b) return b;
  if (a == b) return napkin_sign_bit(a) ? a : b;  // -0 under +0
  return a < b ? a : b;
}
NAPKIN_DEVICE int napkin_maximum(int a, int b) { return a > b ? a : b; }
NAPKIN_DEVICE long long napkin_maximum(long long a, long long b) { return a > b ? a : b; }
NAPKIN_DEVICE int napkin_minimum(int a, int b) { return a < b ? a : b; }
NAPKIN_DEVICE long long napkin_minimum(long long a, long long b) { return a < b ? a : b; }

// tanh(x) = sign(x) (1 - 2 / (exp(2|x|) + 1)); |x| < 2^-4: x (1 - x^2/3 + 2x^4/15).
template <typename T> NAPKIN_DEVICE T napkin_tanh(T x) {
  const T ax = napkin_fabs(x);
  T big = T(1) - T(2) / (napkin_exp(T(2) * ax) + T(1));
  if (napkin_sign_bit(x) != napkin_sign_bit(big)) big = -big;
  const T x2 = x * x;
  const T poly = T(-0x1.5555555555555p-2) + x2 * T(0x1.1111111111111p-3);
  const T small = x * (T(1) + x2 * poly);
  return ax < T(0.0625) ? small : big;
}

// ---- random: dropout's keep test (ir/rng.h) ----
// Word 0 of Philox4x32-10: runtime/rng.cpp's rounds and constants, each
// 32x32 -> 64-bit product split into its high and low words.
NAPKIN_DEVICE unsigned napkin_philox_word0(unsigned c0, unsigned c1, unsigned c2, unsigned c3, unsigned k0, unsigned k1) {
  NAPKIN_UNROLL
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    const unsigned long long p0 = (unsigned long long)0xD2511F53u * c0;
    const unsigned long long p1 = (unsigned long long)0xCD9E8D57u * c2;
    const unsigned n0 = (unsigned)(p1 >> 32) ^ c1 ^ k0;
    const unsigned n2 = (unsigned)(p0 >> 32) ^ c3 ^ k1;
    c1 = (unsigned)p1;
    c3 = (unsigned)p0;
    c0 = n0;
    c2 = n2;
  }
  return c0;
}

// ---- reductions in a fixed order ----
NAPKIN_DEVICE float napkin_shfl_xor(float v, int m) { return __shfl_xor_sync(0xFFFFFFFFu, v, m); }
NAPKIN_DEVICE double napkin_shfl_xor(double v, int m) { return __shfl_xor_sync(0xFFFFFFFFu, v, m); }
NAPKIN_DEVICE int napkin_shfl_xor(int v, int m) { return __shfl_xor_sync(0xFFFFFFFFu, v, m); }
NAPKIN_DEVICE long long napkin_shfl_xor(long long v, int m) {
  const int lo = napkin_shfl_xor((int)(unsigned)(unsigned long long)v, m);
  const int hi = napkin_shfl_xor((int)(unsigned)((unsigned long long)v >> 32), m);
  return (long long)(((unsigned long long)(unsigned)hi << 32) | (unsigned)lo);
}

struct napkin_sum_op {
  template <typename T> NAPKIN_DEVICE T operator()(T a, T b) const { return a + b; }
};
struct napkin_max_op {
  template <typename T> NAPKIN_DEVICE T operator()(T a, T b) const { return napkin_maximum(a, b); }
};
struct napkin_min_op {
  template <typename T> NAPKIN_DEVICE T operator()(T a, T b) const { return napkin_minimum(a, b); }
};
struct napkin_maxnum_op {
  template <typename T> NAPKIN_DEVICE T operator()(T a, T b) const { return napkin_maxnum(a, b); }
};

// Over the 32 lanes of a warp (all active): a butterfly, so every lane ends
// with the same value (each step combines the same two values, commuted).
template <typename T, typename Op> NAPKIN_DEVICE T napkin_warp_reduce(T v, Op op) {
  for (int m = 16; m > 0; m >>= 1) v = op(v, napkin_shfl_xor(v, m));
  return v;
}

// Over the block: warps reduce, then every warp reduces the per-warp values
// in warp order, so every thread returns the same value. `shared` holds 32
// values; the first barrier lets a previous call's readers finish.
template <typename T, typename Op> NAPKIN_DEVICE T napkin_block_reduce(T v, Op op, T identity, T* shared) {
  const int lane = (int)(threadIdx.x & 31u), warp = (int)(threadIdx.x >> 5);
  const int warps = (int)((blockDim.x + 31u) >> 5);
  v = napkin_warp_reduce(v, op);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  return napkin_warp_reduce(lane < warps ? shared[lane] : identity, op);
}

// ---- tensor cores: mma.sync m16n8k16, f32 accumulators ----
// d (4 floats) += a (16x16, 4 registers of 2 elements) * b (16x8, 2
// registers), the fragment layouts of the PTX ISA ("Matrix Fragments for
// mma.m16n8k16 with floating point type"): with g = lane >> 2, c = lane % 4,
// a register j holds A[g + 8 (j & 1)][2c + 8 (j >> 1) + {0, 1}], b register j
// holds B[2c + 8j + {0, 1}][g], d[e] is D[g + 8 (e >> 1)][2c + (e & 1)]; the
// lower index sits in the lower 16 bits. Every lane of the warp must call it
// together. Under host emulation the shim's warp-collective
// napkin_emu_mma_m16n8k16 computes it from all 32 lanes' elements.
#ifndef NAPKIN_HOST_EMULATION
NAPKIN_DEVICE void napkin_mma_m16n8k16_bf16(float* d, const unsigned* a, const unsigned* b) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
NAPKIN_DEVICE void napkin_mma_m16n8k16_f16(float* d, const unsigned* a, const unsigned* b) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: lanes 8m .. 8m + 7 give
// the addresses of rows 0..7 of 8x8 matrix m (16-byte aligned rows in shared
// memory); r[m] gets this lane's fragment of matrix m, elements
// (lane / 4, 2 (lane % 4) + {0, 1}), or of its transpose with _trans: the
// m16n8k16 A and B fragments from row-major tiles, 4 registers in one
// instruction and no transposed copy.
NAPKIN_DEVICE void napkin_ldmatrix_x4(unsigned (&r)[4], const unsigned short* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"((unsigned)__cvta_generic_to_shared(row)));
}
NAPKIN_DEVICE void napkin_ldmatrix_x4_trans(unsigned (&r)[4], const unsigned short* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"((unsigned)__cvta_generic_to_shared(row)));
}
// cp.async.cg.shared.global: 16 bytes from global to shared memory without
// passing through registers (zeros when !valid: nothing is read), complete
// for this thread at napkin_cp_async_wait<N>() (all but the N most recently
// committed groups), for the block after a barrier that follows it.
NAPKIN_DEVICE void napkin_cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"((unsigned)__cvta_generic_to_shared(dst)),
               "l"(src), "r"(valid ? 16 : 0)
               : "memory");
}
NAPKIN_DEVICE void napkin_cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
NAPKIN_DEVICE void napkin_cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
// Two floats rounded to nearest even, lo in the low half (cvt packs its first
// source into the upper half).
NAPKIN_DEVICE unsigned napkin_pack_bf16x2(float lo, float hi) {
  unsigned r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
NAPKIN_DEVICE unsigned napkin_pack_f16x2(float lo, float hi) {
  unsigned r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
#else
NAPKIN_DEVICE void napkin_mma_m16n8k16_bf16(float* d, const unsigned* a, const unsigned* b) {
  float af[8], bf[4];
  for (int j = 0; j < 4; ++j) {
    af[2 * j] = napkin_bf16_to_f32((unsigned short)(a[j] & 0xFFFFu));
    af[2 * j + 1] = napkin_bf16_to_f32((unsigned short)(a[j] >> 16));
  }
  for (int j = 0; j < 2; ++j) {
    bf[2 * j] = napkin_bf16_to_f32((unsigned short)(b[j] & 0xFFFFu));
    bf[2 * j + 1] = napkin_bf16_to_f32((unsigned short)(b[j] >> 16));
  }
  napkin_emu_mma_m16n8k16(d, af, bf);
}
NAPKIN_DEVICE void napkin_mma_m16n8k16_f16(float* d, const unsigned* a, const unsigned* b) {
  float af[8], bf[4];
  for (int j = 0; j < 4; ++j) {
    af[2 * j] = napkin_f16_to_f32((unsigned short)(a[j] & 0xFFFFu));
    af[2 * j + 1] = napkin_f16_to_f32((unsigned short)(a[j] >> 16));
  }
  for (int j = 0; j < 2; ++j) {
    bf[2 * j] = napkin_f16_to_f32((unsigned short)(b[j] & 0xFFFFu));
    bf[2 * j + 1] = napkin_f16_to_f32((unsigned short)(b[j] >> 16));
  }
  napkin_emu_mma_m16n8k16(d, af, bf);
}
NAPKIN_DEVICE void napkin_ldmatrix_x4(unsigned (&r)[4], const unsigned short* row) {
  napkin_emu_ldmatrix_x4(r, row, false);
}
// The copy happens at once: a kernel that reads before it waits and syncs
// reads the right bytes here but not on a GPU (compute-sanitizer's racecheck
// and bench/gpu/verify.py are what check that).
NAPKIN_DEVICE void napkin_cp_async16(void* dst, const void* src, bool valid) {
  if (valid)
    __builtin_memcpy(dst, src, 16);
  else
    __builtin_memset(dst, 0, 16);
}
NAPKIN_DEVICE void napkin_cp_async_commit() {}
template <int N>
NAPKIN_DEVICE void napkin_cp_async_wait() {}
NAPKIN_DEVICE void napkin_ldmatrix_x4_trans(unsigned (&r)[4], const unsigned short* row) {
  napkin_emu_ldmatrix_x4(r, row, true);
}
NAPKIN_DEVICE unsigned napkin_pack_bf16x2(float lo, float hi) {
  return (unsigned)napkin_f32_to_bf16(lo) | ((unsigned)napkin_f32_to_bf16(hi) << 16);
}
NAPKIN_DEVICE unsigned napkin_pack_f16x2(float lo, float hi) {
  return (unsigned)napkin_f32_to_f16(lo) | ((unsigned)napkin_f32_to_f16(hi) << 16);
}
#endif
// ---- end of prelude ----
)PRELUDE";
  static const std::string with_attention = std::string(text) + std::string(detail::attention_prelude());
  return with_attention;
}

}  // namespace napkin::codegen::cuda
