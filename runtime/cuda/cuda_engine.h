// The CUDA engine: a CUDA program's step on GPU 0 (runtime/engine.h says
// what an engine does for the trainer).
//
// Terms:
//  - module: the program's kernels (codegen/cuda/kernel_source.h), loaded
//    from the cubin NVRTC compiled for program.cuda.arch; when the driver
//    says the cubin does not run on this GPU (CUDA_ERROR_NO_BINARY_FOR_GPU,
//    CUDA_ERROR_INVALID_IMAGE), from the PTX, which the driver JIT-compiles
//    for it. describe() says which: "NVIDIA H100 80GB HBM3, sm_90, cubin" or
//    "NVIDIA A100-SXM4-80GB, sm_80, PTX JIT from sm_90".
//  - memory: one device arena of program.arena_bytes
//    (runtime/cuda/device_arena.h: mapped by granules when the first work
//    touches it, and zeroed then, so optimizer state starts at 0; release()
//    unmaps what another rank owns), one scratch buffer of program.cuda.scratch_bytes
//    that a kernel's launches share (and a classifier's GEMMs: its chunk of
//    logits), a 32 MiB cuBLASLt workspace that every
//    matmul shares (one stream: they never overlap), and one pinned host
//    block holding every named tensor (param, state, input, loss) at its own
//    64-byte aligned place: host(t).
//  - stream: everything runs in order on one stream. run_forward enqueues
//    the inputs' copies up (from their pinned buffers) and the forward
//    kernels; loss() copies the loss down and synchronizes, so once it
//    returns the host may refill the inputs; run_backward enqueues the
//    backward, run_optimizer the optimizer and the update copies, without
//    waiting for them: the next loss(), upload or download does.
//  - graphs: the forward kernels are captured once into one CUDA graph, the
//    backward into another, the optimizer and update copies into a third,
//    and replayed;
//    each is captured at its second use, the first running eagerly so that
//    everything loaded lazily (the module's functions, cuBLASLt's kernels)
//    is loaded before capture, where loading is not allowed. The input
//    copies stay outside the graph: one plain copy per input costs nothing
//    to enqueue and keeps the graphs device-only. No graphs while a kernel
//    is inspected or profiled (each kernel then runs and is waited for on
//    its own), nor when the environment sets NAPKIN_CUDA_GRAPHS=0.
//  - ZeRO-2 and 3: with NCCL (run_collectives_on_device) the step's
//    collective kernels are NCCL calls on the stream, captured into the
//    phases' graphs like the kernels around them; without it
//    (set_collectives) each runs on the host between them, with no graphs.
//  - data parallel: with NCCL (join_device_collectives), the backward runs
//    as segments, each its own graph; when a segment has written a bucket
//    of gradients (Program::bucket_bytes, in the order the backward finishes
//    them: GradientSpec::ready_after), an event lets a second stream
//    all-reduce that bucket (ncclAvg, in place) while the next segment
//    runs; the optimizer waits for the last. NAPKIN_CUDA_OVERLAP=0 makes it
//    one bucket after the whole backward.
//  - bad index: kernels that read embedding or class ids set the module's
//    device global napkin_bad_index ({kernel, id, bound}; element 0 is -1
//    until one meets an id outside [0, bound)). loss() reads it with the
//    loss and throws Error naming the kernel, as the CPU runtime reports it.
#pragma once

#include <array>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <variant>
#include <vector>

#include "runtime/cuda/cublaslt_matmul.h"
#include "runtime/cuda/cuda_classifier.h"
#include "runtime/cuda/cuda_driver.h"
#include "runtime/cuda/device_arena.h"
#include "runtime/cuda/nccl_collectives.h"
#include "runtime/engine.h"

namespace napkin::runtime::cuda {

// cuLaunchKernel's kernelParams for a kernel (char* arena, char* scratch,
// NapkinOffsets<N> off): element j points to parameter j's value, from which
// the driver copies as many bytes as the cubin says parameter j has, when the
// launch is enqueued or captured. `off` is a struct passed by value, so
// element 2 points to its bytes, the N offsets themselves (not to a pointer
// to them).
std::array<void*, 3> kernel_params(CUdeviceptr& arena, CUdeviceptr& scratch, std::vector<long long>& offsets);

class CudaEngine final : public Engine {
 public:
  // cubin: the module compiled for program.cuda.arch (may be empty); ptx:
  // the same kernels as PTX. Throws Error when there is no usable GPU,
  // saying why and that `napkin build --target cpu` trains on this machine.
  CudaEngine(const Program& program, std::string_view cubin, std::string_view ptx);
  ~CudaEngine() override;
  CudaEngine(const CudaEngine&) = delete;
  CudaEngine& operator=(const CudaEngine&) = delete;

  const Program& program() const override { return program_; }
  std::string describe() const override { return describe_; }

  char* host(const TensorSpec& t) override;
  void upload(TensorRole role) override;
  void download(TensorRole role) override;

  void run_forward() override;
  double loss() override;
  void run_backward() override;
  void run_setup() override;
  void run_decode() override;
  void download_tensor(const TensorSpec& t) override;
  void run_optimizer() override;
  // Through host memory (each call waits for the stream): what a step of
  // several micro-batches or ranks costs on a GPU until the stage runs on
  // the device (docs/distributed.md).
  void download_gradients(char* dst) override;
  void upload_gradients(const char* src) override;
  void download_gradient(size_t index, char* dst) override;
  void upload_gradient(size_t index, const char* src) override;
  void zero_gradient(size_t index) override;
  // NCCL (runtime/cuda/nccl_collectives.h), unless NAPKIN_NCCL=0.
  std::string join_device_collectives(Communicator& comm, std::string& why) override;
  void average_gradients_on_device() override;
  // A batch's members to run go to its kernel's run mask (codegen/cuda/batches.cpp), a global of the module.
  void skip(const std::vector<bool>& kernels, const std::vector<bool>& updates,
            const std::vector<std::vector<bool>>& members) override;

  // Each collective kernel on the host (no NCCL: NAPKIN_NCCL=0, or a
  // hybrid sharding's group), between the kernels around it; no graphs then.
  void set_collectives(std::function<void(const CollectiveSpec& spec, const char* x, char* y)> fn) override;
  // Each collective kernel through NCCL on the stream (NcclCollectives::
  // collective), captured into the phases' graphs like any kernel.
  std::string run_collectives_on_device(Communicator& comm, std::function<int(const std::string& param)> owner,
                                        int stage, std::string& why) override;
  // One NCCL group of in-place ncclBroadcasts on the stream.
  bool broadcast_params_on_device(const std::function<int(const std::string& param)>& owner) override;

  // ZeRO-1: unmaps the arena's granules wholly inside `tensors` (after
  // waiting for the streams); upload and download skip them from now on.
  void release(const std::vector<const TensorSpec*>& tensors) override;
  std::optional<DeviceArenaMemory> device_arena_memory() const override;

  void inspect_each_kernel(std::function<void(int kernel, const char* output)> inspect) override;
  void set_profiling(bool on) override { profiling_ = on; }
  const std::vector<double>& kernel_seconds() const override { return kernel_seconds_; }

 private:
  struct Launch {
    CUfunction function = nullptr;
    unsigned grid = 1, block = 1, shared_bytes = 0;
    std::vector<long long> offsets;  // the function's third parameter (NapkinOffsets<N>, by value)
  };
  // Kernels [first, last) and, for the rest, the update copies: one graph.
  struct Phase {
    int first = 0, last = 0;
    bool updates = false;
    int eager_runs = 0;
    CUgraphExec graph = nullptr;
  };

  void open_device();
  void load_module(std::string_view cubin, std::string_view ptx);
  void prepare_kernels();
  void allocate();
  void tear_down() noexcept;
  // Copies between pinned host memory and arena bytes, enqueued on the
  // stream after the arena is backed (DeviceArena::back).
  void copy_up(int64_t offset, const void* src, int64_t bytes);
  void copy_down(void* dst, int64_t offset, int64_t bytes);
  bool released(const TensorSpec& t) const { return released_.count(t.name) > 0; }

  void run_phase(Phase& phase);
  void enqueue_phase(const Phase& phase);
  void capture(Phase& phase);
  void enqueue_updates();
  void enqueue_kernel(int i);
  void run_kernel_alone(int i);  // inspect / profile
  // Waits for the stream; throws Error when a kernel met an id out of range.
  void synchronize();

  const Program& program_;
  std::unique_ptr<CudaDriver> driver_;
  std::unique_ptr<CublasLt> lt_;
  std::string describe_;
  bool graphs_enabled_ = true;
  int ordinal_ = 0;  // the GPU's index among the visible ones
  std::vector<bool> skip_kernel_, skip_update_;  // ZeRO-1: another rank's optimizer work
  // Never a collective: the other ranks would wait in it for this one.
  bool skipped(int kernel) const {
    return !skip_kernel_.empty() && skip_kernel_[static_cast<size_t>(kernel)] &&
           !program_.kernels[static_cast<size_t>(kernel)].as<CollectiveSpec>();
  }
  // ZeRO-2 (Engine::set_collectives): each collective kernel's operand
  // copied down, handed to the runtime's collectives (MPI), and its result
  // copied up, between the kernels around it (no graphs then).
  std::function<void(const CollectiveSpec&, const char*, char*)> collectives_;
  std::vector<char> collective_host_;
  void run_collective_on_host(const CollectiveSpec& c);

  // Data parallel (runtime/gradient_stage.h): NCCL, and the backward cut
  // into segments, one per bucket of gradients; after each segment the
  // bucket's all-reduce runs on comm_stream_ while the next segment runs.
  std::unique_ptr<NcclCollectives> nccl_;
  // Loads and joins NCCL once, every rank alike: false (why says) when some
  // rank cannot.
  bool open_nccl(Communicator& comm, std::string& why);
  // ZeRO-2 and 3 through NCCL (run_collectives_on_device): each parameter's
  // owner, and the stage (3: gathers and reduces over the ranks).
  std::function<int(const std::string&)> owner_;
  int collective_stage_ = 0;
  int rank_ = 0;  // in NCCL's communicator
  // ZeRO-2's backward (join_device_collectives after run_collectives_on_device
  // under stage 2): each gradient's owner (index in program.gradients), onto
  // which its bucket averages it; the others' copies are then zeroed, so
  // that the optimizer's norm and overflow probe sum this rank's part.
  std::vector<int> gradient_owner_;
  // ZeRO-3 with one micro-batch (join_device_collectives after
  // run_collectives_on_device under stage 3): the step's reduces average
  // onto the owners, so the gradient stage has nothing left to do; the
  // others' gradients (indices), which their reduces do not write, are
  // zeroed after the backward.
  bool average_reduces_ = false;
  std::vector<int> others_gradients_;
  // Whether a collective kernel runs through NCCL (else it launches: a copy).
  bool runs_on_nccl(const CollectiveSpec& c) const {
    return owner_ && (c.collective == "all_reduce_sum" || collective_stage_ >= 3);
  }
  CUstream comm_stream_ = nullptr;
  std::vector<Phase> segments_;
  std::vector<std::vector<int>> buckets_;  // gradient indices, per segment
  std::vector<CUevent> segment_done_;
  CUevent comm_done_ = nullptr;
  void plan_buckets(bool overlap);

  CUdevice device_ = 0;
  CUcontext context_ = nullptr;
  CUstream stream_ = nullptr;
  CUmodule module_ = nullptr;
  cublasLtHandle_t lt_handle_ = nullptr;
  std::unique_ptr<LtContext> lt_context_;

  std::unique_ptr<DeviceArena> arena_memory_;
  std::unordered_set<std::string> released_;  // tensor names (release())
  CUdeviceptr arena_ = 0;  // arena_memory_'s base, which kernel_params points to
  CUdeviceptr scratch_ = 0, workspace_ = 0;
  CUdeviceptr bad_index_ = 0;  // the module's napkin_bad_index; 0 when no kernel checks ids
  char* pinned_ = nullptr;     // named tensors, the bad-index readback, the inspected output
  std::unordered_map<std::string, char*> host_;  // by tensor name
  long long* bad_index_host_ = nullptr;          // 3 elements
  char* inspect_host_ = nullptr;

  // One runner per kernel, by its payload's kind (prepare_kernels): its
  // launches (a loop, an attention), a GEMM on cuBLASLt, or a classifier's
  // GEMMs between its launches.
  using Launches = std::vector<Launch>;
  struct ClassifierRunner {
    Launches launches;
    std::unique_ptr<CudaClassifier> gemms;
  };
  using Runner = std::variant<Launches, std::unique_ptr<LtMatmul>, ClassifierRunner>;
  std::vector<Runner> runners_;
  Phase forward_, backward_, optimizer_;
  Phase setup_, decode_;  // an inference program's setup (run_setup) and decode step (run_decode)

  std::function<void(int, const char*)> inspect_;
  bool profiling_ = false;
  std::vector<double> kernel_seconds_;
  CUevent kernel_start_ = nullptr, kernel_end_ = nullptr;
};

}  // namespace napkin::runtime::cuda
