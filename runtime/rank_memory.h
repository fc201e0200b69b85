// One rank's memory in a CPU training job, predicted before step 1 from the
// program, the ZeRO stage and the rank count, and measured
// (docs/distributed.md, "Memory per rank"). The trainer prints the
// prediction beside the arena and beside each rank's measured peak, and
// `--memory-limit` refuses a job whose prediction is over it.
//
// A rank's resident memory at its peak is
//   the arena: an anonymous mapping backed where written. Every planned
//     byte is written in a step except what the rank gives back before
//     anything touches it (runtime/optimizer_shards.h): the other ranks'
//     optimizer state (stages 1-3) and, under stage 3, their parameters
//     (gathered where the step uses them, into buffers of the plan). Every
//     gradient is written by every rank's backward at stages 0-2 (stage 2
//     reduce-scatters them after it); under stage 3 a rank's reduce writes
//     only its own parameters' gradients, and the others' read as zero by
//     giving their pages back (Engine::zero_gradient): what stays backed of
//     them is what the plan lets a kernel's output use of their bytes
//     earlier in the step (a kernel's output range, out to whole pages: its
//     extra outputs, such as attention's lse, are not counted);
//   + the gradient stage's host buffers (runtime/gradient_stage.h);
//   + what MPI allocates inside the gradient collectives, which Open MPI's
//     ring algorithms (4.1, "tuned") size by the message: an all-reduce of B
//     bytes over N ranks one block of B/N (N = 2) or two (N > 2), a
//     reduce-scatter of a bucket of B about 2B (measured: peak resident
//     memory on 2 and 4 ranks less every other term, bench/data_parallel.py);
//   + the matmuls' packing scratch (runtime/gemm.cpp: an operand BLAS cannot
//     stride is packed into a per-thread buffer kept at its largest): two of
//     the largest parameter, fitted to the same measurements at one thread
//     a rank;
//   + the process without its arena: the trainer, its libraries, MPI and its
//     shared-memory transport, measured at start-up (VmRSS before the arena
//     is touched), and kRuntimeGrowth, what it grows by while it trains
//     (oneDNN, the threads, the data's pages, MPI's smaller temporaries).
// Released ranges shrink to whole pages, as Executor::release gives them back.
#pragma once

#include <cstdint>

#include "runtime/program.h"

namespace napkin::runtime {

// What a rank's resident memory grows by after start-up besides the terms
// above: 10-12 MiB in the runs of a GPT of d = 256 on 4 ranks
// (tests/e2e/rank_memory_test.cpp) and of d = 1024 on 2 and 4
// (bench/data_parallel.py), one thread each.
inline constexpr int64_t kRuntimeGrowth = 10 << 20;

struct RankMemory {
  int rank = 0;
  int64_t arena = 0;            // the planned arena
  int64_t others_params = 0;    // stage 3: the other ranks' parameters, given back (whole pages)
  int64_t others_state = 0;     // stages 1-3: the other ranks' optimizer state, given back
  int64_t others_grads = 0;     // stage 3: the other ranks' gradients no kernel writes, given back
  int64_t gradient_stage = 0;   // host buffers besides the arena
  int64_t collectives = 0;      // MPI's temporaries inside the gradient collectives
  int64_t scratch = 0;          // the matmuls' packing scratch
  int64_t process = 0;          // the process without its arena (start-up + kRuntimeGrowth)
  int64_t total() const {
    return arena - others_params - others_state - others_grads + gradient_stage + collectives + scratch + process;
  }
};

// Rank `rank`'s memory in a job of `ranks` under `stage`, each rank running
// `micro_batches` per step; `process`: the process's bytes without its arena.
RankMemory predict_rank_memory(const Program& program, int stage, int ranks, int rank, int64_t micro_batches,
                               int64_t process);
// The rank that needs the most.
RankMemory predict_job_memory(const Program& program, int stage, int ranks, int64_t micro_batches, int64_t process);

// This process's resident set now (VmRSS) and its peak (VmHWM), from
// /proc/self/status; 0 where there is none.
int64_t resident_bytes();
int64_t peak_resident_bytes();

}  // namespace napkin::runtime
