// The CUDA execution model on the host, for the restricted CUDA C that
// codegen/cuda emits: force-included (g++ -include) into a kernel source that
// is compiled as C++17 with -DNAPKIN_HOST_EMULATION into a shared library,
// which tests/support/cuda_emulator.h loads and launches. Everything here is
// compiled into that one library, so each loaded source has its own state.
//
// Terms:
//  - thread: one CUDA thread, threadIdx.x in [0, block). Warp w of a block is
//    threads [32w, 32w + 32); a last, partial warp has fewer lanes.
//  - coroutine: a host execution context (own stack of kStackBytes plus a
//    guard page; entered through ucontext, switched by _setjmp/_longjmp) that
//    runs CUDA threads. A coroutine runs a thread
//    until it returns or waits at a barrier; when its thread returns, it takes
//    the next thread of the block not yet started, so a block without
//    barriers runs on one coroutine with no context switch at all. A thread
//    that waits keeps its coroutine until it returns. Coroutines and stacks
//    are created once and reused by every later block and launch.
//  - scheduler: the launching (OS) thread. Blocks run one after another; in a
//    block it resumes coroutines whose thread a barrier released, in release
//    order, and starts a coroutine on the next unstarted thread when none is
//    runnable. Only one coroutine runs at a time, so shared and global memory
//    need no locks, and atomicCAS is a plain compare-and-store.
//  - block barrier: __syncthreads(); completes when every thread of the
//    block has arrived. warp barrier: __syncwarp(), __shfl_xor_sync(),
//    __shfl_sync() (and ldmatrix, napkin_emu_ldmatrix_x4, made of them) and
//    the tensor-core mma (napkin_emu_mma_m16n8k16, which needs all 32 lanes);
//    completes when every lane of the warp has arrived at the same kind of
//    barrier; a shuffle's values are exchanged, and an mma's product
//    computed from every lane's fragments, when it completes. The last
//    thread to arrive releases the others and runs on.
//  - failure: a barrier that can never complete (a thread returned without
//    reaching it, or lanes of a warp wait at different barriers), a shuffle
//    that reads a lane the block does not have, or a launch shape CUDA
//    rejects. The launch stops at once, napkin_emu_last_error() names the
//    kernel, block and threads, and the stopped coroutines are discarded.
//  - shared memory: `__shared__` is `static`, so each such variable is one
//    object the blocks use in turn, as the blocks run in turn. The dynamic
//    buffer (NAPKIN_DYNAMIC_SHARED, declared inside a kernel function) is
//    filled with 0xff bytes (a NaN for every float type) before each block,
//    so a read before the block wrote it shows up.
//
// Threads of a block run one after another between barriers, in an order
// that is one of the orders a GPU may run them in; a kernel whose result
// depends on threads running in lockstep without a barrier is wrong on the GPU
// too. The shim defines its state in this header: it goes into exactly one
// translation unit, the kernel source. One launch at a time per library.
#pragma once

#ifndef NAPKIN_HOST_EMULATION
#error "cuda_host_shim.h is only for compiling CUDA C as C++ with -DNAPKIN_HOST_EMULATION"
#endif

// glibc's fortified longjmp refuses to jump to another stack, which is what
// switching coroutines is.
#undef _FORTIFY_SOURCE

#include <math.h>  // the C++ <math.h>: float overloads (exp(float)) in the global namespace, as in CUDA
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <setjmp.h>
#include <sys/mman.h>
#include <ucontext.h>

#include <type_traits>

// ---- Declaration specifiers -------------------------------------------------

#define __global__ __attribute__((visibility("default")))
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ static
#define NAPKIN_DYNAMIC_SHARED(type, name) \
  type* const name = reinterpret_cast<type*>(napkin_emu::dynamic_shared)

// ---- Vector types and bit casts ---------------------------------------------

struct uint3 {
  unsigned x, y, z;
};
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
struct alignas(16) float4 {
  float x, y, z, w;
};
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }

template <typename To, typename From>
inline To napkin_emu_bit_cast(From v) {
  static_assert(sizeof(To) == sizeof(From));
  To r;
  __builtin_memcpy(&r, &v, sizeof r);
  return r;
}
inline float __int_as_float(int v) { return napkin_emu_bit_cast<float>(v); }
inline int __float_as_int(float v) { return napkin_emu_bit_cast<int>(v); }
inline float __uint_as_float(unsigned v) { return napkin_emu_bit_cast<float>(v); }
inline unsigned __float_as_uint(float v) { return napkin_emu_bit_cast<unsigned>(v); }

// ---- Math: <math.h> has the rest (expf, tanhf, fmaxf, fmaf, ...) ------------

inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __fdividef(float x, float y) { return x / y; }

// ---- Emulator state ----------------------------------------------------------
// Hidden (not static) globals: the compiler must assume a call it cannot see
// into (the context switch) changes them, so kernels re-read threadIdx and
// memory after a barrier. Only the kernels, the source's own globals and the
// two extern "C" entry points at the end are visible outside the library.

#pragma GCC visibility push(hidden)

namespace napkin_emu {

constexpr int kMaxBlock = 1024;             // CUDA's limit on threads per block
constexpr int kMaxDynamicShared = 232448;   // sm_90's 227 KiB per block
constexpr long long kMaxGrid = 2147483647;  // gridDim.x limit
constexpr size_t kStackBytes = 64 * 1024;
constexpr size_t kGuardBytes = 4096;

enum class Wait : unsigned char { kNone, kBlock, kSyncWarp, kShuffle, kMma, kReturned };

struct Coroutine {
  jmp_buf suspended;      // where it goes on when resumed
  ucontext_t start;       // its first entry, into coroutine_main
  char* stack = nullptr;  // kGuardBytes of PROT_NONE, then kStackBytes
  bool started = false;   // entered, and not discarded since
  int thread = -1;        // the CUDA thread it runs, -1 when idle
};

// A kernel with its third parameter `const NapkinOffsets<N>& off` (the
// prelude's NAPKIN_OFFSETS under host emulation) is called as taking a
// pointer to N long longs: a reference is passed as a pointer.
using KernelWithOffsets = void (*)(char*, char*, const long long*);
using KernelWithout = void (*)(char*, char*);

struct Launch {
  void (*kernel)() = nullptr;  // a KernelWithOffsets when offsets is set, else a KernelWithout
  char* arena = nullptr;
  char* scratch = nullptr;
  const long long* offsets = nullptr;
  const char* name = "";
  long long grid = 0;
  int block = 0;
  int shared_bytes = 0;  // dynamic shared memory of the launch
  long long block_index = 0;
  int next_thread = 0;  // first thread of the block not started
  int returned = 0;     // threads of the block that returned
  int block_arrived = 0;
  int warp_arrived[kMaxBlock / 32];
  // Per thread of the block.
  Wait wait[kMaxBlock];
  Coroutine* coroutine_of[kMaxBlock];
  unsigned long long shuffle_value[kMaxBlock];
  int shuffle_source[kMaxBlock];  // the lane read, already clamped to the segment
  unsigned long long shuffle_result[kMaxBlock];
  // mma.sync m16n8k16 (napkin_emu_mma_m16n8k16): each lane's A, B elements
  // and C accumulators in, its D accumulators out.
  float mma_a[kMaxBlock][8];
  float mma_b[kMaxBlock][4];
  float mma_c[kMaxBlock][4];
  // Coroutines whose thread a barrier released, in release order (a ring).
  Coroutine* runnable[kMaxBlock];
  int runnable_head = 0, runnable_count = 0;
};

uint3 thread_idx{0, 0, 0};
uint3 block_idx{0, 0, 0};
uint3 block_dim{1, 1, 1};
uint3 grid_dim{1, 1, 1};
char* dynamic_shared = nullptr;

Launch launch;
jmp_buf scheduler;  // in resume(), which the running coroutine returns to
Coroutine coroutines[kMaxBlock];
int coroutines_made = 0;  // coroutines[0, made) have stacks
Coroutine* idle[kMaxBlock];  // coroutines without a thread
int idle_count = 0;
Coroutine* current = nullptr;
bool failed = false;
char error[2048];
char* dynamic_buffer = nullptr;

// Records why the launch failed (the first reason only).
__attribute__((format(printf, 1, 2))) inline void record_error(const char* format, ...) {
  if (failed) return;
  failed = true;
  int n = snprintf(error, sizeof error, "CUDA emulation: kernel '%s' (grid %lld, block %d)", launch.name, launch.grid,
                   launch.block);
  if (n > 0 && launch.block_index >= 0) n += snprintf(error + n, sizeof error - n, ", block %lld", launch.block_index);
  if (n > 0 && static_cast<size_t>(n) < sizeof error) n += snprintf(error + n, sizeof error - n, ": ");
  if (n < 0 || static_cast<size_t>(n) >= sizeof error) return;
  va_list args;
  va_start(args, format);
  vsnprintf(error + n, sizeof error - n, format, args);
  va_end(args);
}

// From a coroutine: back to the scheduler for good, after record_error.
[[noreturn]] __attribute__((noinline)) inline void abandon() { _longjmp(scheduler, 1); }
#define NAPKIN_EMU_FAIL(...)                  \
  do {                                        \
    ::napkin_emu::record_error(__VA_ARGS__);  \
    ::napkin_emu::abandon();                  \
  } while (0)

// Suspends the running coroutine. Not inlined: the kernels that call it stay
// free of setjmp, and the call tells the compiler that memory changed.
__attribute__((noinline)) inline void switch_to_scheduler() {
  if (_setjmp(current->suspended) == 0) _longjmp(scheduler, 1);
}

inline void take_thread(Coroutine* c, int t) {
  c->thread = t;
  launch.coroutine_of[t] = c;
  launch.wait[t] = Wait::kNone;
}

inline void make_runnable(Coroutine* c) {
  launch.runnable[(launch.runnable_head + launch.runnable_count) % kMaxBlock] = c;
  ++launch.runnable_count;
}

// A coroutine's life: run threads of the current block while there are
// unstarted ones, then wait idle for the next block.
inline void coroutine_main() {
  Coroutine* self = current;
  for (;;) {
    while (launch.next_thread < launch.block) {
      int t = launch.next_thread++;
      take_thread(self, t);
      thread_idx.x = static_cast<unsigned>(t);
      if (launch.offsets != nullptr)
        reinterpret_cast<KernelWithOffsets>(launch.kernel)(launch.arena, launch.scratch, launch.offsets);
      else
        reinterpret_cast<KernelWithout>(launch.kernel)(launch.arena, launch.scratch);
      launch.wait[t] = Wait::kReturned;
      ++launch.returned;
    }
    self->thread = -1;
    idle[idle_count++] = self;
    switch_to_scheduler();
  }
}

// ---- Barriers ------------------------------------------------------------

inline void release(int first, int count) {
  for (int t = first; t < first + count; ++t) {
    launch.wait[t] = Wait::kNone;
    if (t != current->thread) make_runnable(launch.coroutine_of[t]);
  }
}

inline void block_barrier() {
  int t = current->thread;
  launch.wait[t] = Wait::kBlock;
  if (++launch.block_arrived == launch.block) {  // no other thread ran since this one last suspended
    launch.block_arrived = 0;
    release(0, launch.block);
    return;
  }
  switch_to_scheduler();
}

inline int warp_lanes(int warp) {
  int left = launch.block - warp * 32;
  return left < 32 ? left : 32;
}

// D = A B + C of the 32 lanes from first on, each lane's elements placed by
// the PTX ISA's m16n8k16 fragment layouts (.f16/.bf16 A and B, .f32 C/D),
// with g = lane >> 2 and c = lane % 4:
//   A (16x16): a[0..1] = A[g][2c + {0,1}], a[2..3] = A[g + 8][2c + {0,1}],
//              a[4..5] = A[g][2c + 8 + {0,1}], a[6..7] = A[g + 8][2c + 8 + {0,1}]
//   B (16x8):  b[0..1] = B[2c + {0,1}][g], b[2..3] = B[2c + 8 + {0,1}][g]
//   C, D (16x8): c[0..1] = C[g][2c + {0,1}], c[2..3] = C[g + 8][2c + {0,1}]
// The products of 16-bit floats are exact in double and the sum of 16 of
// them nearly so; D is that sum plus C rounded once to float (the hardware
// rounds differently, within f32 accumulation's error).
inline void mma_m16n8k16(int first) {
  float A[16][16], B[16][8], C[16][8];
  for (int l = 0; l < 32; ++l) {
    const float* a = launch.mma_a[first + l];
    const float* b = launch.mma_b[first + l];
    const float* c = launch.mma_c[first + l];
    int g = l >> 2, k = 2 * (l & 3);
    for (int e = 0; e < 2; ++e) {
      A[g][k + e] = a[e];
      A[g + 8][k + e] = a[2 + e];
      A[g][k + 8 + e] = a[4 + e];
      A[g + 8][k + 8 + e] = a[6 + e];
      B[k + e][g] = b[e];
      B[k + 8 + e][g] = b[2 + e];
      C[g][k + e] = c[e];
      C[g + 8][k + e] = c[2 + e];
    }
  }
  for (int l = 0; l < 32; ++l) {
    int g = l >> 2, k = 2 * (l & 3);
    for (int e = 0; e < 4; ++e) {
      int row = g + 8 * (e >> 1), col = k + (e & 1);
      double sum = 0;
      for (int i = 0; i < 16; ++i) sum += static_cast<double>(A[row][i]) * B[i][col];
      launch.mma_c[first + l][e] = static_cast<float>(sum + C[row][col]);
    }
  }
}

inline void complete_warp(int warp) {
  int first = warp * 32, lanes = warp_lanes(warp);
  for (int l = 0; l < lanes; ++l)
    if (launch.wait[first + l] != launch.wait[first])
      NAPKIN_EMU_FAIL("lanes %d and %d of warp %d wait at different warp barriers (__syncwarp vs __shfl_xor_sync)",
           0, l, warp);
  if (launch.wait[first] == Wait::kShuffle) {
    for (int l = 0; l < lanes; ++l) {
      int source = launch.shuffle_source[first + l];
      if (source >= lanes)
        NAPKIN_EMU_FAIL("thread %d: a shuffle reads lane %d, which warp %d of a %d-thread block does not have",
             first + l, source, warp, launch.block);
      launch.shuffle_result[first + l] = launch.shuffle_value[first + source];
    }
  }
  if (launch.wait[first] == Wait::kMma) {
    if (lanes != 32)
      NAPKIN_EMU_FAIL("thread %d: mma.sync needs all 32 lanes; warp %d of a %d-thread block has %d", first, warp,
                      launch.block, lanes);
    mma_m16n8k16(first);
  }
  launch.warp_arrived[warp] = 0;
  release(first, lanes);
}

inline void warp_barrier(Wait kind) {
  int t = current->thread, warp = t / 32;
  launch.wait[t] = kind;
  if (++launch.warp_arrived[warp] == warp_lanes(warp)) {
    complete_warp(warp);
    return;
  }
  switch_to_scheduler();
}

// ---- The scheduler -------------------------------------------------------

// Runs `c` until it suspends, fails or goes idle. A switch is a _setjmp and
// a _longjmp (no signal-mask system call, unlike swapcontext); ucontext only
// enters a coroutine's stack the first time.
__attribute__((noinline)) inline void resume(Coroutine* c) {
  current = c;
  if (c->thread >= 0) thread_idx.x = static_cast<unsigned>(c->thread);
  if (_setjmp(scheduler) != 0) return;
  if (c->started) _longjmp(c->suspended, 1);
  c->started = true;
  getcontext(&c->start);
  c->start.uc_stack.ss_sp = c->stack + kGuardBytes;
  c->start.uc_stack.ss_size = kStackBytes;
  c->start.uc_link = nullptr;  // coroutine_main never returns
  makecontext(&c->start, coroutine_main, 0);
  setcontext(&c->start);
}

inline Coroutine* idle_coroutine() {
  if (idle_count > 0) {
    return idle[--idle_count];
  }
  if (coroutines_made == kMaxBlock) return nullptr;  // only if a failed launch's coroutines were kept
  Coroutine* c = &coroutines[coroutines_made];
  void* memory = mmap(nullptr, kGuardBytes + kStackBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (memory == MAP_FAILED) return nullptr;
  mprotect(memory, kGuardBytes, PROT_NONE);  // a stack overflow faults instead of corrupting memory
  c->stack = static_cast<char*>(memory);
  ++coroutines_made;
  idle[idle_count++] = c;
  return idle_coroutine();
}

// Why the block cannot go on: no thread runs or waits to start, and some
// wait at a barrier that the others, returned or waiting elsewhere, never reach.
inline void report_deadlock() {
  for (int w = 0; w * 32 < launch.block; ++w) {
    int first = w * 32, lanes = warp_lanes(w), waiting = 0, lane = -1, other = -1;
    for (int l = 0; l < lanes; ++l) {
      Wait k = launch.wait[first + l];
      if (k == Wait::kSyncWarp || k == Wait::kShuffle || k == Wait::kMma) {
        if (++waiting == 1) lane = l;
      } else if (other < 0) {
        other = l;
      }
    }
    if (waiting > 0) {
      record_error("%d of the %d lanes of warp %d wait at %s (lane %d first), which lane %d never reaches: it %s",
                   waiting, lanes, w,
                   launch.wait[first + lane] == Wait::kShuffle ? "__shfl_xor_sync"
                   : launch.wait[first + lane] == Wait::kMma   ? "mma.sync"
                                                               : "__syncwarp",
                   lane, other,
                   launch.wait[first + other] == Wait::kReturned ? "returned" : "waits at __syncthreads()");
      return;
    }
  }
  int returned = 0, waiting = 0, first_returned = -1, first_waiting = -1;
  for (int t = 0; t < launch.block; ++t) {
    if (launch.wait[t] == Wait::kReturned && ++returned == 1) first_returned = t;
    if (launch.wait[t] == Wait::kBlock && ++waiting == 1) first_waiting = t;
  }
  record_error("__syncthreads() can never complete: %d of the %d threads wait at it (thread %d first), %d returned "
               "without reaching it (thread %d first)",
               waiting, launch.block, first_waiting, returned, first_returned);
}

// After a failure: the coroutines' stacks hold stopped kernel frames; they
// start afresh when next used.
inline void discard_coroutines() {
  idle_count = 0;
  for (int i = 0; i < coroutines_made; ++i) {
    coroutines[i].started = false;
    coroutines[i].thread = -1;
    idle[idle_count++] = &coroutines[i];
  }
}

inline void run_block() {
  launch.next_thread = 0;
  launch.returned = 0;
  launch.block_arrived = 0;
  for (int w = 0; w * 32 < launch.block; ++w) launch.warp_arrived[w] = 0;
  launch.runnable_head = launch.runnable_count = 0;
  while (launch.returned < launch.block && !failed) {
    if (launch.runnable_count > 0) {
      Coroutine* c = launch.runnable[launch.runnable_head];
      launch.runnable_head = (launch.runnable_head + 1) % kMaxBlock;
      --launch.runnable_count;
      resume(c);
    } else if (launch.next_thread < launch.block) {
      Coroutine* c = idle_coroutine();
      if (c == nullptr) {
        record_error("cannot allocate a coroutine stack");
        return;
      }
      resume(c);
    } else {
      report_deadlock();
    }
  }
}

inline void run(void (*kernel)(), long long grid, int block, int shared_bytes, char* arena, char* scratch,
                const long long* offsets, const char* name) {
  failed = false;
  error[0] = '\0';
  launch.kernel = kernel;
  launch.arena = arena;
  launch.scratch = scratch;
  launch.offsets = offsets;
  launch.name = name;
  launch.grid = grid;
  launch.block = block;
  launch.shared_bytes = shared_bytes;
  launch.block_index = -1;  // before the first block
  if (grid < 1 || grid > kMaxGrid || block < 1 || block > kMaxBlock || shared_bytes < 0 ||
      shared_bytes > kMaxDynamicShared) {
    record_error("invalid launch: grid must be in [1, %lld], block in [1, %d], dynamic shared bytes in [0, %d] "
                 "(got %d)",
                 kMaxGrid, kMaxBlock, kMaxDynamicShared, shared_bytes);
    return;
  }
  if (dynamic_buffer == nullptr) {
    dynamic_buffer = static_cast<char*>(aligned_alloc(128, kMaxDynamicShared));
    if (dynamic_buffer == nullptr) {
      record_error("cannot allocate the dynamic shared memory buffer");
      return;
    }
  }
  // A kernel that declares dynamic shared memory but is launched without
  // any gets a pointer it must not use, as on the GPU.
  dynamic_shared = dynamic_buffer;
  block_dim = uint3{static_cast<unsigned>(block), 1, 1};
  grid_dim = uint3{static_cast<unsigned>(grid), 1, 1};
  thread_idx = uint3{0, 0, 0};
  for (long long b = 0; b < grid && !failed; ++b) {
    launch.block_index = b;
    block_idx = uint3{static_cast<unsigned>(b), 0, 0};
    __builtin_memset(dynamic_buffer, 0xff, static_cast<size_t>(shared_bytes));
    run_block();
  }
  if (failed) discard_coroutines();
  current = nullptr;
}

}  // namespace napkin_emu

// ---- What kernels see ------------------------------------------------------

static const uint3& threadIdx = napkin_emu::thread_idx;
static const uint3& blockIdx = napkin_emu::block_idx;
static const uint3& blockDim = napkin_emu::block_dim;
static const uint3& gridDim = napkin_emu::grid_dim;
constexpr int warpSize = 32;

inline void __syncthreads() { napkin_emu::block_barrier(); }

inline void __syncwarp(unsigned mask = 0xffffffffu) {
  if (mask != 0xffffffffu)
    NAPKIN_EMU_FAIL("thread %d: __syncwarp with mask 0x%x; only the full mask is emulated",
                    napkin_emu::current->thread, mask);
  napkin_emu::warp_barrier(napkin_emu::Wait::kSyncWarp);
}

namespace napkin_emu {
// A shuffle's exchange: this thread reads lane `source` of its warp's value
// once every lane has arrived (the lane's check against the warp's size is
// complete_warp's).
template <typename T>
inline T shuffle(const char* name, unsigned mask, T var, int source) {
  static_assert(std::is_trivially_copyable_v<T> && (sizeof(T) == 4 || sizeof(T) == 8),
                "a shuffle exchanges 4- and 8-byte values");
  int t = current->thread;
  if (mask != 0xffffffffu) NAPKIN_EMU_FAIL("thread %d: %s with mask 0x%x; only the full mask is emulated", t, name, mask);
  launch.shuffle_source[t] = source;
  launch.shuffle_value[t] = 0;
  __builtin_memcpy(&launch.shuffle_value[t], &var, sizeof(T));
  warp_barrier(Wait::kShuffle);
  T result;
  __builtin_memcpy(&result, &launch.shuffle_result[current->thread], sizeof(T));
  return result;
}
}  // namespace napkin_emu

// CUDA's butterfly shuffle (PTX shfl.sync.bfly with clamp 31 and segment mask
// 32 - width): lane l reads lane l ^ (laneMask & 31), or its own value when
// that lane lies past the end of l's width-lane segment.
template <typename T>
inline T __shfl_xor_sync(unsigned mask, T var, int laneMask, int width = 32) {
  using namespace napkin_emu;
  int t = current->thread, lane = t % 32;
  if (width < 1 || width > 32 || (width & (width - 1)) != 0)
    NAPKIN_EMU_FAIL("thread %d: __shfl_xor_sync width %d is not a power of two in [1, 32]", t, width);
  int segment = 32 - width;
  int max_lane = (lane & segment) | (31 & ~segment);
  int source = lane ^ (laneMask & 31);
  return shuffle("__shfl_xor_sync", mask, var, source > max_lane ? lane : source);
}

// CUDA's indexed shuffle (PTX shfl.sync.idx, width 32): every lane reads
// lane srcLane & 31's value.
template <typename T>
inline T __shfl_sync(unsigned mask, T var, int srcLane, int width = 32) {
  using namespace napkin_emu;
  if (width != 32) NAPKIN_EMU_FAIL("thread %d: __shfl_sync width %d; only 32 is emulated", current->thread, width);
  return shuffle("__shfl_sync", mask, var, srcLane & 31);
}

// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 as the prelude's
// napkin_ldmatrix_x4* call it: lanes 8m .. 8m + 7 give the addresses of rows
// 0..7 of matrix m (8 16-bit elements each, 16-byte aligned, in the block's
// dynamic shared memory); lane l gets in r[m] elements (l / 4, 2 (l % 4) + {0, 1})
// of matrix m, or with trans those of its transpose: (2 (l % 4) + {0, 1}, l / 4).
// The lower column in the low half. Every lane of the warp must call it.
inline void napkin_emu_ldmatrix_x4(unsigned (&r)[4], const unsigned short* row, bool trans) {
  using namespace napkin_emu;
  int t = current->thread, lane = t % 32;
  const char* p = reinterpret_cast<const char*>(row);
  if (reinterpret_cast<unsigned long long>(p) % 16 != 0 || p < dynamic_shared || p + 16 > dynamic_shared + launch.shared_bytes)
    NAPKIN_EMU_FAIL("thread %d: ldmatrix row address %p is not a 16-byte aligned row of the block's dynamic shared memory",
                    t, static_cast<const void*>(p));
  for (int m = 0; m < 4; ++m) {
    if (!trans) {
      const unsigned short* src = __shfl_sync(0xffffffffu, row, 8 * m + lane / 4);
      r[m] = static_cast<unsigned>(src[2 * (lane % 4)]) | (static_cast<unsigned>(src[2 * (lane % 4) + 1]) << 16);
    } else {
      const unsigned short* lo = __shfl_sync(0xffffffffu, row, 8 * m + 2 * (lane % 4));
      const unsigned short* hi = __shfl_sync(0xffffffffu, row, 8 * m + 2 * (lane % 4) + 1);
      r[m] = static_cast<unsigned>(lo[lane / 4]) | (static_cast<unsigned>(hi[lane / 4]) << 16);
    }
  }
}

// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32 as the
// prelude's napkin_mma_m16n8k16_* call it: this lane's 8 A and 4 B elements
// (already converted to float) and its 4 accumulators d, which come back as
// D = A B + C once every lane of the warp has arrived (see mma_m16n8k16).
inline void napkin_emu_mma_m16n8k16(float* d, const float* a, const float* b) {
  using namespace napkin_emu;
  int t = current->thread;
  __builtin_memcpy(launch.mma_a[t], a, sizeof launch.mma_a[t]);
  __builtin_memcpy(launch.mma_b[t], b, sizeof launch.mma_b[t]);
  __builtin_memcpy(launch.mma_c[t], d, sizeof launch.mma_c[t]);
  warp_barrier(Wait::kMma);
  __builtin_memcpy(d, launch.mma_c[current->thread], sizeof launch.mma_c[0]);
}

inline unsigned long long atomicCAS(unsigned long long* address, unsigned long long compare,
                                    unsigned long long value) {
  unsigned long long old = *address;
  if (old == compare) *address = value;
  return old;
}

// CUDA's integer and float min/max overloads.
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline unsigned long long min(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
inline unsigned long long max(unsigned long long a, unsigned long long b) { return a > b ? a : b; }
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }
inline double min(double a, double b) { return fmin(a, b); }
inline double max(double a, double b) { return fmax(a, b); }

#pragma GCC visibility pop

// ---- The library's entry points (cuda_emulator.cpp finds them by name) ------

// `offsets`: nullptr for a kernel of two parameters, else its third.
extern "C" __attribute__((visibility("default"))) void napkin_emu_launch(void (*kernel)(), long long grid, int block,
                                                                         int shared_bytes, char* arena, char* scratch,
                                                                         const long long* offsets, const char* name) {
  napkin_emu::run(kernel, grid, block, shared_bytes, arena, scratch, offsets, name);
}

// The last launch's failure, or nullptr when it completed.
extern "C" __attribute__((visibility("default"))) const char* napkin_emu_last_error() {
  return napkin_emu::failed ? napkin_emu::error : nullptr;
}
