// What the collective kernels of a step (runtime/kernel_spec.h
// CollectiveSpec) do in a job of several ranks, under ZeRO-2 and ZeRO-3
// (docs/distributed.md): the executor calls this with each kernel's
// operand `x` and output `y`.
//
//  - all_reduce_sum: x copied to y and summed over the ranks in place (each
//    rank's part of the clipping norm or of fp16's overflow probe), stages
//    2 and 3.
//  - all_gather (stage 3): the parameter's value, from its owner
//    (OptimizerShards::owner) to every rank: the owner copies x to y, then
//    one broadcast. The others never read x, their home copy of the
//    parameter, whose memory is given back.
//  - reduce_scatter (stage 3): the sum over the ranks of each rank's
//    gradient x, into y on the parameter's owner (MPI_Reduce); the others'
//    y is not written, and the gradient stage zeroes it without backing it
//    (runtime/gradient_stage.h). A gradient in another dtype than f32 is
//    summed in f32 and rounded once.
// Elsewhere (stages 0 and 1, or a gather or reduce under stage 2), a copy.
//
// Under stage 2 a program built for stage 3 keeps its gathers and reduces
// as copies: every rank holds every parameter, and the gradient stage
// reduce-scatters the gradients itself.
//
// Prefetch (stage 3, start_thread()): a gather the step issues ahead of its
// use (CollectiveSpec::wait >= 0) returns at once and runs on this object's
// communication thread while the rank computes; the engine waits for it
// before kernel `wait` (wait_before). Every collective of the step then runs
// on that thread, in the step's order, so the ranks meet in the same order
// and only one thread calls MPI while a step runs (MPI_THREAD_SERIALIZED).
// A collective not issued ahead is waited for at once.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "runtime/communicator.h"
#include "runtime/kernel_spec.h"
#include "runtime/optimizer_shards.h"

namespace napkin::runtime {

class ParameterCollectives {
 public:
  ParameterCollectives(const OptimizerShards& shards, Communicator& comm, int stage);
  ~ParameterCollectives();
  ParameterCollectives(const ParameterCollectives&) = delete;
  ParameterCollectives& operator=(const ParameterCollectives&) = delete;

  void operator()(const CollectiveSpec& spec, const char* x, char* y);

  // Runs the collectives on a thread of their own from now on, so that the
  // gathers issued ahead overlap the kernels before their use. Only where
  // the engine calls wait_before (Engine::set_collective_waits) and MPI lets
  // another thread call it (Communicator::serialized_threads).
  void start_thread();
  bool threaded() const { return worker_.joinable(); }
  // Before kernel `kernel`: returns once every collective that must be
  // complete by then is (-1: every collective issued so far). Rethrows an
  // error the thread met.
  void wait_before(int kernel);

  // What the gathers and reduces took so far: calls, seconds (the wait for
  // the slowest rank included) and bytes this rank sent or received.
  struct Totals {
    int64_t calls = 0;
    double seconds = 0, bytes = 0;
  };
  const Totals& gathers() const { return gathers_; }
  const Totals& reduces() const { return reduces_; }
  // The rank's waits for them: every collective's whole time without the
  // thread; with it, only what the kernels did not hide.
  const Totals& waits() const { return waits_; }
  // Off: the calls are not counted (an eval's forwards).
  void set_counting(bool on) { counting_ = on; }

 private:
  void run(const CollectiveSpec& spec, const char* x, char* y);
  void wait_for(int64_t job);  // until job `job` (1-based) is done
  void work();                 // the thread

  const OptimizerShards& shards_;
  Communicator& comm_;
  int stage_ = 2;
  std::vector<float> staging_;  // a gradient not in f32, widened
  Totals gathers_, reduces_, waits_;
  std::atomic<bool> counting_{true};

  struct Job {
    const CollectiveSpec* spec;
    const char* x;
    char* y;
  };
  std::thread worker_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Job> queue_;
  int64_t issued_ = 0, done_ = 0;      // jobs, counted from 1
  std::map<int64_t, int64_t> due_;     // kernel -> the last job that must be done before it
  std::exception_ptr error_;
  bool stopping_ = false;
};

// Whether a program's step gathers its parameters itself (napkin build
// --zero 3: passes/shard_parameters.h).
bool gathers_parameters(const Program& program);

}  // namespace napkin::runtime
