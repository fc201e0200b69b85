// GFLOP/s of runtime::Attention (the CPU fused attention) forward and
// backward on napkin's model shapes: models/gpt.yaml (B=16, H=4, T=128,
// D=64) and a T=1024 variant (B=8, H=12), causal, f32 and bf16, on the
// default ThreadPool (all CPUs, or NAPKIN_NUM_THREADS).
//
// FLOP convention (as FlashAttention's benchmarks): per visible (query, key)
// pair, forward 4 D (Q Kᵀ and P V), backward 10 D (S recomputed, dP, dV, dK,
// dQ); visible pairs per (batch, head): T S, or T (T + 1) / 2 causal (T = S).
//
//   attention_cpu [reps]     (default 5; the best of reps is reported)
// The last column divides by the process's CPU time instead of wall time:
// per-core throughput, steadier than wall time on a shared machine.
//   ATTENTION_BENCH_ONLY=bf16 attention_cpu   (one element type only)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>
#include <vector>

#include "runtime/attention.h"
#include "runtime/float_formats.h"

using namespace napkin::runtime;

namespace {

double seconds_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// CPU seconds of the whole process (all threads): on a machine shared with
// other jobs wall time swings by 2x, CPU time much less.
double cpu_seconds() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

struct Case {
  const char* name;
  int64_t batch, heads, len, dim;
};

void bench(const Case& c, GemmType type, ThreadPool& pool, int reps) {
  AttentionDesc d;
  d.batch = c.batch, d.heads = c.heads, d.kv_heads = c.heads, d.q_len = c.len, d.kv_len = c.len;
  d.head_dim = c.dim, d.causal = true, d.scale = 1.0 / std::sqrt(double(c.dim));
  // q, k, v as views of one [B, T, 3 H D] qkv projection; o, do, dq, dk, dv contiguous.
  const int64_t width = 3 * c.heads * c.dim;
  AttentionDesc::Strides fused{c.len * width, c.dim, width};
  AttentionDesc::Strides dense{c.heads * c.len * c.dim, c.len * c.dim, c.dim};
  d.q = d.k = d.v = fused;
  d.o = d.d_o = d.dq = d.dk = d.dv = dense;
  Attention att(d, type);

  const size_t esize = type == GemmType::F32 ? 4 : 2;
  const size_t n_qkv = size_t(c.batch * c.len * width), n = size_t(c.batch * c.heads * c.len * c.dim);
  std::vector<unsigned char> qkv(n_qkv * esize), o(n * esize), d_o(n * esize), dq(n * esize), dk(n * esize),
      dv(n * esize);
  std::vector<float> lse(size_t(c.batch * c.heads * c.len));
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  auto fill = [&](std::vector<unsigned char>& buf, size_t count) {
    for (size_t i = 0; i < count; ++i) {
      float x = normal(rng);
      if (esize == 4) {
        std::memcpy(&buf[i * 4], &x, 4);
      } else {
        uint16_t h = float_to_bf16_bits(x);
        std::memcpy(&buf[i * 2], &h, 2);
      }
    }
  };
  fill(qkv, n_qkv);
  fill(d_o, n);
  unsigned char* q = qkv.data();
  unsigned char* k = q + size_t(c.heads * c.dim) * esize;
  unsigned char* v = k + size_t(c.heads * c.dim) * esize;

  double best_f = 1e30, best_b = 1e30, best_cpu = 1e30;
  for (int rep = 0; rep <= reps; ++rep) {  // rep 0 warms the caches and scratch
    double c0 = cpu_seconds(), t0 = seconds_now();
    att.forward(q, k, v, o.data(), lse.data(), pool);
    double t1 = seconds_now();
    att.backward(q, k, v, o.data(), lse.data(), d_o.data(), dq.data(), dk.data(), dv.data(), pool);
    double t2 = seconds_now(), c2 = cpu_seconds();
    if (rep > 0) best_f = std::min(best_f, t1 - t0), best_b = std::min(best_b, t2 - t1), best_cpu = std::min(best_cpu, c2 - c0);
  }
  const double pairs = double(c.batch * c.heads) * double(c.len) * double(c.len + 1) / 2;
  const double ff = 4.0 * double(c.dim) * pairs, fb = 10.0 * double(c.dim) * pairs;
  std::printf("%-24s %-4s  fwd %8.3f ms %6.1f GFLOP/s  bwd %8.3f ms %6.1f GFLOP/s  fwd+bwd %6.1f GFLOP/s"
              "  (%5.1f GFLOP per CPU-second)\n",
              c.name, gemm_type_name(type), best_f * 1e3, ff / best_f * 1e-9, best_b * 1e3, fb / best_b * 1e-9,
              (ff + fb) / (best_f + best_b) * 1e-9, (ff + fb) / best_cpu * 1e-9);
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::max(1, std::atoi(argv[1])) : 5;
  ThreadPool pool;
  std::printf("threads: %d, causal, q/k/v strided in a fused qkv buffer\n", pool.num_threads());
  const Case cases[] = {{"gpt B=16 H=4 T=128 D=64", 16, 4, 128, 64}, {"B=8 H=12 T=1024 D=64", 8, 12, 1024, 64}};
  const char* only = std::getenv("ATTENTION_BENCH_ONLY");  // e.g. "bf16": one type only
  for (const Case& c : cases)
    for (GemmType t : {GemmType::F32, GemmType::BF16})
      if (!only || std::strcmp(only, gemm_type_name(t)) == 0) bench(c, t, pool, reps);
}
