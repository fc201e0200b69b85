// AMX tile products and operand packing (runtime/amx.h).
#include "runtime/amx.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "runtime/vector_math.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define NAPKIN_AMX_COMPILED 1
#else
#define NAPKIN_AMX_COMPILED 0
#endif

namespace napkin::runtime::amx {

#if NAPKIN_AMX_COMPILED

namespace {

constexpr long kArchReqXcompPerm = 0x1023;  // arch_prctl: request a dynamically enabled state component
constexpr long kXfeatureXtiledata = 18;     // the tile data registers

bool detect() {
  const char* env = std::getenv("NAPKIN_AMX");
  if (env && std::strcmp(env, "0") == 0) return false;
  unsigned eax, ebx, ecx, edx;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
  const bool amx_bf16 = edx & (1u << 22), amx_tile = edx & (1u << 24);
  if (!amx_bf16 || !amx_tile) return false;
  // The packers and attention_amx.cpp's element loops are AVX-512 (F, DQ,
  // BW, VL): every AMX CPU has it, but a hypervisor may hide it, and the OS
  // must save the opmask and zmm state (XCR0 bits 5-7).
  const unsigned avx512 = (1u << 16) | (1u << 17) | (1u << 30) | (1u << 31);
  if ((ebx & avx512) != avx512) return false;
  unsigned xcr0_lo, xcr0_hi;
  __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  if ((xcr0_lo & 0xE0u) != 0xE0u) return false;
  // Linux (5.16+) hands out the 8 KiB of tile state only on request; the
  // first tile instruction without it is SIGILL.
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

// Palette 1: tiles 0-7 all 16 rows of 64 bytes (16 f32 or 32 bf16).
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
  TileConfig() {
    for (int t = 0; t < 8; ++t) colsb[t] = 64, rows[t] = 16;
  }
};

// The tile instructions as inline assembly (GCC's intrinsics are too; Clang's
// are builtins that need the AMX target features on the function). Loads and
// stores name memory, so the compiler keeps the packers' stores before them.
#define NAPKIN_TILE_LOAD(t, base, stride) \
  __asm__ volatile("tileloadd (%0,%1,1), %%tmm" #t ::"r"(base), "r"(int64_t(stride)) : "memory")
#define NAPKIN_TILE_STORE(t, base, stride) \
  __asm__ volatile("tilestored %%tmm" #t ", (%0,%1,1)" ::"r"(base), "r"(int64_t(stride)) : "memory")
#define NAPKIN_TILE_ZERO(t) __asm__ volatile("tilezero %%tmm" #t ::)
// c += a b: AT&T order, sources first.
#define NAPKIN_TILE_DPBF16PS(c, a, b) __asm__ volatile("tdpbf16ps %%tmm" #b ", %%tmm" #a ", %%tmm" #c ::)

// One block of C, TM x TN tiles of 16 x 16 (tiles 0-3), A in tiles 4-5, B in
// 6-7. Tile numbers are part of the instruction, hence the templates.
template <int TM, int TN>
void block(int64_t k, const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, float* c, int64_t ldc,
           bool accumulate) {
  const int64_t sa = lda * 2, sb = ldb * 2, sc = ldc * 4;  // strides in bytes
  if (accumulate) {
    NAPKIN_TILE_LOAD(0, c, sc);
    if constexpr (TN == 2) NAPKIN_TILE_LOAD(1, c + 16, sc);
    if constexpr (TM == 2) NAPKIN_TILE_LOAD(2, c + 16 * ldc, sc);
    if constexpr (TM == 2 && TN == 2) NAPKIN_TILE_LOAD(3, c + 16 * ldc + 16, sc);
  } else {
    NAPKIN_TILE_ZERO(0);
    if constexpr (TN == 2) NAPKIN_TILE_ZERO(1);
    if constexpr (TM == 2) NAPKIN_TILE_ZERO(2);
    if constexpr (TM == 2 && TN == 2) NAPKIN_TILE_ZERO(3);
  }
  for (int64_t p = 0; p < k; p += 32) {
    NAPKIN_TILE_LOAD(4, a + p, sa);
    NAPKIN_TILE_LOAD(6, b + (p / 2) * ldb, sb);
    if constexpr (TN == 2) NAPKIN_TILE_LOAD(7, b + (p / 2) * ldb + 32, sb);
    NAPKIN_TILE_DPBF16PS(0, 4, 6);
    if constexpr (TN == 2) NAPKIN_TILE_DPBF16PS(1, 4, 7);
    if constexpr (TM == 2) {
      NAPKIN_TILE_LOAD(5, a + 16 * lda + p, sa);
      NAPKIN_TILE_DPBF16PS(2, 5, 6);
      if constexpr (TN == 2) NAPKIN_TILE_DPBF16PS(3, 5, 7);
    }
  }
  NAPKIN_TILE_STORE(0, c, sc);
  if constexpr (TN == 2) NAPKIN_TILE_STORE(1, c + 16, sc);
  if constexpr (TM == 2) NAPKIN_TILE_STORE(2, c + 16 * ldc, sc);
  if constexpr (TM == 2 && TN == 2) NAPKIN_TILE_STORE(3, c + 16 * ldc + 16, sc);
}

}  // namespace

bool available() {
  static const bool ok = detect();
  return ok;
}

// ldtilecfg and tilerelease written out: GCC's intrinsics for them only
// inline into code compiled for AMX (the tile loads and products are inline
// assembly already).
TileScope::TileScope() {
  static const TileConfig config;
  __asm__ volatile("ldtilecfg %0" ::"m"(config));
}

TileScope::~TileScope() { __asm__ volatile("tilerelease" ::); }

void gemm(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, float* c,
          int64_t ldc, bool accumulate) {
  for (int64_t i = 0; i < m; i += 32)
    for (int64_t j = 0; j < n; j += 32) {
      const uint16_t* ai = a + i * lda;
      const uint16_t* bj = b + 2 * j;
      float* cij = c + i * ldc + j;
      const bool two_m = i + 32 <= m, two_n = j + 32 <= n;
      if (two_m && two_n) block<2, 2>(k, ai, lda, bj, ldb, cij, ldc, accumulate);
      else if (two_m) block<2, 1>(k, ai, lda, bj, ldb, cij, ldc, accumulate);
      else if (two_n) block<1, 2>(k, ai, lda, bj, ldb, cij, ldc, accumulate);
      else block<1, 1>(k, ai, lda, bj, ldb, cij, ldc, accumulate);
    }
}

#else  // not x86-64 GCC/Clang: never available, so never called

bool available() { return false; }
TileScope::TileScope() {}
TileScope::~TileScope() {}
void gemm(int64_t, int64_t, int64_t, const uint16_t*, int64_t, const uint16_t*, int64_t, float*, int64_t, bool) {
  std::abort();
}

#endif

void pack_a(const uint16_t* src, int64_t rows, int64_t cols, int64_t ld, uint16_t* dst, int64_t dst_rows,
            int64_t dst_cols) {
  for (int64_t r = 0; r < dst_rows; ++r) {
    uint16_t* d = dst + r * dst_cols;
    if (r < rows) {
      std::memcpy(d, src + r * ld, size_t(cols) * 2);
      std::memset(d + cols, 0, size_t(dst_cols - cols) * 2);
    } else {
      std::memset(d, 0, size_t(dst_cols) * 2);
    }
  }
}

void pack_b(const uint16_t* src, int64_t rows, int64_t cols, int64_t ld, uint16_t* dst, int64_t k_pad, int64_t n_pad) {
  // Row r / 2 of dst is n_pad words: word c = src[r][c] | src[r + 1][c] << 16.
  for (int64_t r = 0; r < k_pad; r += 2) {
    uint32_t* d = reinterpret_cast<uint32_t*>(dst + r * n_pad);
    const uint16_t* s0 = r < rows ? src + r * ld : nullptr;
    const uint16_t* s1 = r + 1 < rows ? src + (r + 1) * ld : nullptr;
    if (s0 && s1) {
      for (int64_t c = 0; c < cols; ++c) d[c] = uint32_t(s0[c]) | uint32_t(s1[c]) << 16;
    } else if (s0) {
      for (int64_t c = 0; c < cols; ++c) d[c] = s0[c];
    } else {
      std::memset(d, 0, size_t(cols) * 4);
    }
    std::memset(d + cols, 0, size_t(n_pad - cols) * 4);
  }
}

#if NAPKIN_AMX_COMPILED
namespace {

// dst rows w0 .. w0 + 16 (of `words` rows; row stride dst_ld words), columns
// n0 .. n0 + 16 = the transpose of the 16 x 16 words of src rows n0 ..
// (src_rows of them; row stride src_ld bf16) at words w0 .. (src_words of
// them): missing rows and words read as zero. AMX CPUs all have AVX-512.
NAPKIN_AVX512 void transpose_words_16x16(const uint16_t* src, int64_t src_ld, int64_t n0, int64_t src_rows,
                                         int64_t w0, int64_t src_words, uint32_t* dst, int64_t dst_ld,
                                         int64_t words) {
  const int64_t have_words = std::min<int64_t>(16, src_words - w0);
  const __mmask16 load_mask = have_words >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << have_words) - 1);
  __m512i a[16];
  for (int i = 0; i < 16; ++i)
    a[i] = n0 + i < src_rows ? _mm512_maskz_loadu_epi32(load_mask, src + (n0 + i) * src_ld + 2 * w0)
                             : _mm512_setzero_si512();
  __m512i b[16], c[16];
  for (int i = 0; i < 16; i += 2) {  // 32-bit interleave of row pairs
    b[i] = _mm512_unpacklo_epi32(a[i], a[i + 1]);
    b[i + 1] = _mm512_unpackhi_epi32(a[i], a[i + 1]);
  }
  for (int g = 0; g < 16; g += 4) {  // 64-bit interleave: c[g + m] lane L = column 4L + m of rows g .. g + 3
    c[g + 0] = _mm512_unpacklo_epi64(b[g], b[g + 2]);
    c[g + 1] = _mm512_unpackhi_epi64(b[g], b[g + 2]);
    c[g + 2] = _mm512_unpacklo_epi64(b[g + 1], b[g + 3]);
    c[g + 3] = _mm512_unpackhi_epi64(b[g + 1], b[g + 3]);
  }
  for (int m = 0; m < 4; ++m) {  // 128-bit lanes: column j = 4L + m gathers lane L of c[m], c[4 + m], c[8 + m], c[12 + m]
    const __m512i even_lo = _mm512_shuffle_i32x4(c[m], c[4 + m], 0x88), odd_lo = _mm512_shuffle_i32x4(c[m], c[4 + m], 0xdd);
    const __m512i even_hi = _mm512_shuffle_i32x4(c[8 + m], c[12 + m], 0x88),
                  odd_hi = _mm512_shuffle_i32x4(c[8 + m], c[12 + m], 0xdd);
    const __m512i out[4] = {_mm512_shuffle_i32x4(even_lo, even_hi, 0x88), _mm512_shuffle_i32x4(odd_lo, odd_hi, 0x88),
                            _mm512_shuffle_i32x4(even_lo, even_hi, 0xdd), _mm512_shuffle_i32x4(odd_lo, odd_hi, 0xdd)};
    for (int l = 0; l < 4; ++l) {
      const int64_t w = w0 + 4 * l + m;
      if (w < words) _mm512_storeu_si512(dst + w * dst_ld + n0, out[l]);
    }
  }
}

}  // namespace
#endif

void pack_b_transposed(const uint16_t* src, int64_t rows, int64_t cols, int64_t ld, uint16_t* dst, int64_t k_pad,
                       int64_t n_pad) {
#if NAPKIN_AMX_COMPILED
  // Even cols: element pairs (kk, kk + 1) of a source row are one word, and
  // the packing is a transpose of words, 16 x 16 at a time (n_pad is a
  // multiple of 16).
  if (cols % 2 == 0 && n_pad % 16 == 0 && available()) {
    uint32_t* d = reinterpret_cast<uint32_t*>(dst);
    const int64_t words = k_pad / 2, src_words = cols / 2;
    for (int64_t w0 = 0; w0 < words; w0 += 16)
      for (int64_t n0 = 0; n0 < n_pad; n0 += 16)
        transpose_words_16x16(src, ld, n0, rows, w0, src_words, d, n_pad, words);
    return;
  }
#endif
  std::memset(dst, 0, size_t(k_pad * n_pad) * 2);
  // B[kk][n] = src[n][kk]: element (kk, n) goes to row kk / 2, slot 2n + kk % 2.
  for (int64_t n = 0; n < rows; ++n) {
    const uint16_t* s = src + n * ld;
    for (int64_t kk = 0; kk < cols; ++kk) dst[(kk / 2) * 2 * n_pad + 2 * n + (kk & 1)] = s[kk];
  }
}

void pack_a_transposed(const uint16_t* src, int64_t rows, int64_t cols, int64_t ld, uint16_t* dst, int64_t dst_rows,
                       int64_t dst_cols) {
#if NAPKIN_AMX_COMPILED
  // Even cols: a transpose of words (pack_b_transposed's), whose row w holds
  // source columns 2w and 2w + 1 in its low and high halves: split them.
  if (cols % 2 == 0 && available()) {
    const int64_t n_pad = round_up(rows, 16);
    thread_local std::vector<uint16_t> words;
    if (int64_t(words.size()) < cols * n_pad) words.resize(size_t(cols * n_pad));
    pack_b_transposed(src, rows, cols, ld, words.data(), cols, n_pad);
    const uint32_t* w = reinterpret_cast<const uint32_t*>(words.data());
    const int64_t width = std::min(n_pad, dst_cols);
    for (int64_t c = 0; c < dst_rows; c += 2) {
      uint16_t* lo = dst + c * dst_cols;
      uint16_t* hi = lo + dst_cols;
      if (c < cols) {
        const uint32_t* row = w + (c / 2) * n_pad;
        for (int64_t r = 0; r < width; ++r) lo[r] = uint16_t(row[r]), hi[r] = uint16_t(row[r] >> 16);
        std::memset(lo + width, 0, size_t(dst_cols - width) * 2);
        std::memset(hi + width, 0, size_t(dst_cols - width) * 2);
      } else {
        std::memset(lo, 0, size_t(dst_cols) * 2);
        if (c + 1 < dst_rows) std::memset(hi, 0, size_t(dst_cols) * 2);
      }
    }
    return;
  }
#endif
  std::memset(dst, 0, size_t(dst_rows * dst_cols) * 2);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[c * dst_cols + r] = src[r * ld + c];
}

}  // namespace napkin::runtime::amx
