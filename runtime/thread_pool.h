// The runtime's one source of CPU parallelism. A generated trainer makes one
// ThreadPool at start-up and runs every parallel kernel on it: elementwise
// loops, reductions and the matmuls (runtime/gemm.h, which runs a
// single-threaded BLAS inside the pool's chunks), so no second thread pool
// (OpenMP, OpenBLAS's own threads) competes with it for the cores.
//
// Model: N workers, of which the calling thread is worker 0 (N = 2 means one
// extra thread). parallel_for(n, fn, ctx) cuts [0, n) into N contiguous chunks,
//   chunk i = [i*q + min(i, r), (i+1)*q + min(i+1, r))   with q = n / N, r = n % N
// (the first r chunks are one longer), runs chunk i on worker i, and returns
// when all are done. The split depends only on (n, N), never on timing, so a
// kernel that reduces within its chunk gives bit-identical results every run.
//
// Runs inline (one call fn(ctx, 0, n) on the caller) when N == 1 or n < N.
// A call made while the pool is already busy (from inside a chunk, i.e.
// nested, or from a second thread concurrently) is safe: it runs on the
// calling thread, calling fn once per chunk of the same split, so results
// stay identical.
//
// Dispatch: the caller publishes the job and bumps an atomic epoch; idle
// workers spin on the epoch for `spin_us` (default 100 µs) after their last
// job and then sleep on a futex, so an idle pool burns no core. A dispatch
// to spinning workers and the join cost about 1 µs (bench/README.md); waking
// a sleeping worker costs a futex wake (tens of µs on a VM).
//
// fn may throw: the first exception (the caller's own chunk first) is
// rethrown by parallel_for after every chunk has finished.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace napkin::runtime {

// Number of CPUs this process may run on (sched_getaffinity), or the value of
// the environment variable NAPKIN_NUM_THREADS when it is a positive integer.
int default_thread_count();

class ThreadPool {
 public:
  using Fn = void (*)(void* ctx, int64_t begin, int64_t end);

  // threads <= 0 means default_thread_count(). spin_us: how long an idle
  // worker (and the caller waiting at the join) spins before sleeping.
  explicit ThreadPool(int threads = 0, int spin_us = 100);
  ~ThreadPool();  // joins the workers (sleeping or spinning)
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // The chunk of worker i (0 <= i < parts) when [0, n) is cut into parts.
  static std::pair<int64_t, int64_t> chunk(int64_t n, int parts, int i) {
    int64_t q = n / parts, r = n % parts;
    int64_t b = i * q + (i < r ? i : r);
    return {b, b + q + (i < r ? 1 : 0)};
  }

  void parallel_for(int64_t n, Fn fn, void* ctx);

  // Any callable f(int64_t begin, int64_t end).
  template <class F>
  void parallel_for(int64_t n, F&& f) {
    using T = std::remove_reference_t<F>;
    parallel_for(
        n, [](void* c, int64_t b, int64_t e) { (*static_cast<T*>(c))(b, e); },
        const_cast<void*>(static_cast<const void*>(&f)));
  }

  // Runs fn(ctx, i, i + 1) on worker i for every i in [0, num_threads()):
  // one call per worker, e.g. to split 2-D work by hand.
  void run_on_all(Fn fn, void* ctx) { parallel_for(num_threads_, fn, ctx); }

 private:
  void worker_main(int index);
  void run_chunk(int index);
  void finish_chunk();

  int num_threads_;
  int spin_us_;
  std::vector<std::thread> threads_;

  // The current job, written by the caller before the epoch is bumped.
  Fn fn_ = nullptr;
  void* ctx_ = nullptr;
  int64_t n_ = 0;

  alignas(64) std::atomic<uint32_t> epoch_{0};     // futex word the workers wait on
  std::atomic<int> sleepers_{0};                   // workers asleep (or about to be) on epoch_
  alignas(64) std::atomic<uint32_t> pending_{0};   // chunks of the current job not yet done
  std::atomic<int> caller_sleeping_{0};            // caller asleep on pending_
  alignas(64) std::atomic<bool> busy_{false};      // a job is in flight
  std::atomic<bool> stop_{false};
  std::exception_ptr error_;                       // first worker exception, guarded by error_taken_
  std::atomic<bool> error_taken_{false};
};

}  // namespace napkin::runtime
