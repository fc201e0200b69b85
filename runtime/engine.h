// What the trainer (runtime/trainer.h) runs a program on: the CPU executor
// (runtime/cpu_engine.h) or the CUDA one (runtime/cuda/cuda_engine.h). The
// trainer owns flags, init, data, checkpoints and progress; an engine owns
// where the arena lives and how kernels run.
//
// Terms:
//  - host tensor: a named tensor of the program (param, state, input, rng, loss)
//    as host memory with the tensor's dtype and shape, contiguous. Init,
//    --init weights, checkpoints and the data loader read and write these.
//    On the CPU they are the arena itself; on a GPU, pinned host buffers.
//  - upload / download: copy host tensors of one role (param, state) to the
//    arena or back. No-ops on the CPU. Inputs and the rng tensor
//    (runtime/rng_tensor.h) go up by themselves at the start of run_forward;
//    the loss comes down in loss().
//  - step: run_forward(), loss(), run_backward(), then run_optimizer() (the
//    optimizer phase and the update copies). The trainer looks at the loss
//    before the optimizer, so a NaN stops it before any weight changes.
//    Between the backward and the optimizer the gradients are complete
//    (Program::gradients): a step of several micro-batches or ranks reads
//    them down, accumulates and all-reduces them, and writes the mean back
//    (runtime/gradient_stage.h).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/communicator.h"
#include "runtime/program.h"

namespace napkin::runtime {

// What a GPU engine's arena holds (Engine::device_arena_memory).
struct DeviceArenaMemory {
  int64_t reserved = 0;     // its address range (a whole number of granules)
  int64_t mapped = 0;       // backed by physical memory now
  int64_t peak_mapped = 0;  // the most at any time
  int64_t granule = 0;      // the unit of mapping; 0 without virtual memory management
  std::string not_virtual;  // why the arena is one cuMemAlloc ("" when it is mapped by granules)
};

class Engine {
 public:
  virtual ~Engine() = default;

  virtual const Program& program() const = 0;
  // "2 threads" / "NVIDIA H100 80GB HBM3 (sm_90), cubin": for the banner.
  virtual std::string describe() const = 0;

  virtual char* host(const TensorSpec& t) = 0;
  virtual void upload(TensorRole role) = 0;
  virtual void download(TensorRole role) = 0;
  virtual void download_tensor(const TensorSpec& t) = 0;  // one tensor (the sampler's logits)

  virtual void run_forward() = 0;
  virtual double loss() = 0;
  // An inference program's (runtime/sampler.h): run_setup() computes what
  // its parameters and constants alone give (Program::num_setup_kernels),
  // once after the parameters are up and before any prefill or decode step,
  // which both read it; run_forward() is its prefill; run_decode() its
  // one-token step, the kernels after the prefill (the inputs go up first).
  // download_tensor brings its logits down.
  virtual void run_setup() = 0;
  virtual void run_decode() = 0;
  virtual void run_backward() = 0;
  virtual void run_optimizer() = 0;

  // Every gradient's bytes (Program::gradients), packed in the program's
  // order, read from the arena or written into it. Synchronous.
  virtual void download_gradients(char* dst) = 0;
  virtual void upload_gradients(const char* src) = 0;
  // The same for one gradient, Program::gradients[index] (ZeRO-2 reads and
  // writes them in its owners' order).
  virtual void download_gradient(size_t index, char* dst) = 0;
  virtual void upload_gradient(size_t index, const char* src) = 0;
  // Makes Program::gradients[index] zero, holding as little memory as the
  // engine can for it (the CPU gives its whole pages back): ZeRO-3's other
  // ranks' gradients, which this rank never writes.
  virtual void zero_gradient(size_t index) = 0;

  // Collectives on the device, for a job of several ranks: joins `comm`'s
  // ranks and says what it will use ("NCCL 2.28.3 on the GPU in 13
  // buckets, ..."), or "" when this engine has none (the CPU) or cannot (no
  // NCCL: `why` says so). Then run_backward() also averages every gradient
  // over the ranks in place (in buckets as the backward writes them, where
  // the engine can), and average_gradients_on_device() waits for it. The
  // gradient stage falls back to the host when "". After
  // run_collectives_on_device under stage 2 (ZeRO-2), each gradient is
  // averaged onto its parameter's owner instead, and the other ranks' copies
  // of it are zeroed; under stage 3 the step's reduces average instead of
  // summing, and run_backward adds nothing.
  virtual std::string join_device_collectives(Communicator& comm, std::string& why) {
    (void)comm;
    why.clear();
    return "";
  }
  virtual void average_gradients_on_device() {}
  // ZeRO-2 and 3 on the device, instead of set_collectives: joins `comm`'s
  // ranks with the device's collectives, and each collective kernel then
  // runs there, in the step's order: all_reduce_sum always; under `stage` 3
  // all_gather from and reduce_scatter onto owner(param); under stage 2 the
  // gathers and reduces of a program built for stage 3 stay the copies they
  // are (every rank holds every parameter). Says what it uses ("NCCL
  // 2.28.0"), or "" when this engine has none (the CPU) or cannot (`why`
  // says so): every rank gets the same answer, and then calls
  // set_collectives. Once, before the first step.
  virtual std::string run_collectives_on_device(Communicator& comm, std::function<int(const std::string& param)> owner,
                                                int stage, std::string& why) {
    (void)comm, (void)owner, (void)stage;
    why.clear();
    return "";
  }
  // ZeRO-1 and 2, after the optimizer: every parameter from its owner to
  // every rank, enqueued on the device's collectives (the communicator
  // run_collectives_on_device or join_device_collectives joined, the whole
  // job's). False when this engine has none joined: the caller gathers them
  // through the host.
  virtual bool broadcast_params_on_device(const std::function<int(const std::string& param)>& owner) {
    (void)owner;
    return false;
  }

  // ZeRO-1 (runtime/optimizer_shards.h): kernels and update copies this
  // rank skips, per index in the program (empty: none), and per batch
  // kernel the members it runs (empty: all; engines whose batches cannot
  // be split get none). Set once, before the first step.
  virtual void skip(const std::vector<bool>& kernels, const std::vector<bool>& updates,
                    const std::vector<std::vector<bool>>& members) = 0;
  // ZeRO-2 and 3: what each collective kernel (runtime/kernel_spec.h
  // CollectiveSpec) makes of its input `x` in its output `y`: `fn` sums it
  // over the ranks, gathers it from its parameter's owner, or sums it onto
  // the owner (runtime/parameter_collectives.h). Unset: a copy (the
  // identity). Set once, before the first step; an engine that cannot run
  // them throws Error.
  virtual void set_collectives(std::function<void(const CollectiveSpec& spec, const char* x, char* y)> fn) = 0;
  // ZeRO-3's prefetch: `fn` is called before each kernel with its index,
  // and with -1 when a run of kernels ends, to wait for the collectives
  // issued ahead that must be complete then (runtime/parameter_collectives.h).
  // False: this engine does not call it, so each collective must be
  // complete when its kernel returns.
  virtual bool set_collective_waits(std::function<void(int kernel)> fn) {
    (void)fn;
    return false;
  }
  // ZeRO-1: the memory of these tensors, which this rank never reads, may
  // be given back. On the CPU they then read as zero. On a GPU upload and
  // download skip them from then on (their host copies keep what they hold:
  // what a checkpoint gathered there), and the arena's granules lying wholly
  // inside them are unmapped where the GPU has virtual memory management.
  virtual void release(const std::vector<const TensorSpec*>& tensors) { (void)tensors; }
  // A GPU arena's memory (runtime/cuda/device_arena.h), for the banner and
  // the end of the run; none where the arena is host memory, which the
  // resident set counts.
  virtual std::optional<DeviceArenaMemory> device_arena_memory() const { return std::nullopt; }

  // Debugging and profiling, both slow (every kernel runs on its own):
  // after each kernel, `inspect` gets the kernel's index and its output in
  // host memory (out_dtype, out_numel elements); profiling accumulates each
  // kernel's seconds.
  virtual void inspect_each_kernel(std::function<void(int kernel, const char* output)> inspect) = 0;
  virtual void set_profiling(bool on) = 0;
  virtual const std::vector<double>& kernel_seconds() const = 0;
};

// Makes the engine a trainer or a sampler runs on, for its parsed program
// and --threads (0: the CPUs this process may use). Throws Error when it
// cannot (a CUDA trainer on a machine without a GPU).
using EngineFactory = std::function<std::unique_ptr<Engine>(const Program& program, int threads)>;

}  // namespace napkin::runtime
