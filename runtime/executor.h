// Runs a program's kernels over its arena: the whole step (forward, backward,
// optimizer, then the update copies) or the forward kernels alone (eval).
//
// The arena is allocated once, an anonymous mapping (page-aligned) of
// exactly the program's planned size, zero (optimizer state starts at zero)
// and backed by memory only where written, in huge pages where the kernel
// allows (fewer TLB misses in the memory-bound kernels). Loop kernels are
// generated functions; the runtime splits a parallel one's dim-0 range across
// the thread pool, deterministically (same split every step). Matmul kernels
// go to runtime/gemm.h.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <variant>
#include <vector>

#include "runtime/attention.h"
#include "runtime/cached_attention.h"
#include "runtime/classifier.h"
#include "runtime/gemm.h"
#include "runtime/program.h"
#include "runtime/rope.h"
#include "runtime/tensor_element.h"
#include "runtime/thread_pool.h"

namespace napkin::runtime {

// A loop kernel's generated code: dim-0 indices [begin, end) of its loop,
// its operands at the byte offsets `offsets` of the arena. Kernels that
// differ only in their operands (a transformer's layers) share the code.
using KernelFn = void (*)(char* arena, int64_t begin, int64_t end, const int64_t* offsets);
// An entry of the generated object's kernel table (codegen/cpu/cpu_backend.h).
struct KernelCode {
  KernelFn fn;  // a loop's code, a GEMM's epilogue; null for the other kinds
  const int64_t* offsets;
};

class Executor {
 public:
  // code: the program's kernel table, one entry per kernel.
  Executor(const Program& program, const KernelCode* code, int threads);
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  char* arena() { return arena_; }
  const Program& program() const { return program_; }
  int threads() const { return pool_.num_threads(); }

  // Kernels [first, last) in order.
  void run_kernels(int first, int last);
  void run_setup() { run_kernels(0, program_.num_setup_kernels); }
  void run_forward() { run_kernels(program_.num_setup_kernels, program_.num_forward_kernels); }
  void run_backward() { run_kernels(program_.num_forward_kernels, program_.num_gradient_kernels); }
  void run_optimizer() { run_kernels(program_.num_gradient_kernels, static_cast<int>(program_.kernels.size())); }
  // Backward and optimizer: the rest of a one-micro-batch step.
  void run_rest() { run_kernels(program_.num_forward_kernels, static_cast<int>(program_.kernels.size())); }
  // Copies each update whose value was not written in place into its target.
  void apply_updates();

  // The loss after the forward kernels ran, as double.
  double loss() const;

  // Called around every kernel when set (tests compare each kernel with the
  // reference interpreter; --debug-nan checks each output).
  std::function<void(int kernel)> before_kernel, after_kernel;

  // Kernels and update copies not run (ZeRO-1: another rank's optimizer
  // work), by index; empty: none. A collective kernel runs whatever this
  // says: every rank must reach it.
  std::vector<bool> skip_kernel, skip_update;
  // What a collective kernel (CollectiveSpec) does with its input `x` and
  // output `y`: ZeRO-2's sum of the ranks' parts, ZeRO-3's gather and reduce
  // of a parameter (Engine::set_collectives). Null: a copy of x into y, the
  // identity, right wherever each rank's value is already the whole (one
  // process, data parallel and ZeRO-1, whose gradients are averaged before
  // the optimizer).
  std::function<void(const CollectiveSpec& spec, const char* x, char* y)> collectives;
  // ZeRO-3's prefetch: called before each kernel with its index, and with
  // -1 when a run of kernels ends, to wait for the collectives issued ahead
  // that must be complete by then (runtime/parameter_collectives.h). Null:
  // every collective is complete when its kernel returns.
  std::function<void(int kernel)> wait_collectives;
  // Per kernel: the batch members to run (empty: all).
  std::vector<std::vector<bool>> run_member;

  // Gives back the memory of arena bytes [offset, offset + bytes) (the whole
  // pages inside it), which then reads as zero: another rank's optimizer
  // state under ZeRO-1.
  void release(int64_t offset, int64_t bytes);
  // Makes arena bytes [offset, offset + bytes) read as zero, backing none
  // of the whole pages inside them (released) and writing only the partial
  // pages at either end.
  void zero(int64_t offset, int64_t bytes);

  // Seconds spent in each kernel, accumulated while profiling is on.
  bool profile = false;
  std::vector<double> kernel_seconds;

 private:
  const Program& program_;
  const KernelCode* code_;
  ThreadPool pool_;
  char* arena_ = nullptr;
  size_t arena_mapped_ = 0;
  // One runner per kernel, built by prepare() from its payload's kind: what
  // it needs besides its spec and fns_ (a GEMM's plan, an attention's buffers).
  using Runner = std::variant<std::monostate, std::unique_ptr<Gemm>, std::unique_ptr<Attention>,
                              std::unique_ptr<CachedAttention>, std::unique_ptr<Classifier>, std::unique_ptr<RopeKernel>>;
  std::vector<Runner> runners_;
  void prepare();
  void run_kernel(int i);
  void run_loop(int i, const LoopSpec& s);
};

// The executor running generated code now: napkin_rt_bad_index (called by a
// kernel that meets an out-of-range id) names its kernel from it.
const Program* active_program();

}  // namespace napkin::runtime

// Called by generated kernels: an embedding or class id outside [0, bound).
// Prints which kernel (and YAML line) and exits with status 1.
extern "C" [[noreturn]] void napkin_rt_bad_index(int64_t kernel, int64_t id, int64_t bound);
