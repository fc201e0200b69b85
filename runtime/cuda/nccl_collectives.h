// NCCL for a CUDA trainer's ranks: the gradient all-reduce on the GPU,
// between the backward and the optimizer, in place in the arena.
// libnccl.so.2 is opened with dlopen (like the driver and cuBLASLt), and
// the communicator is bootstrapped over MPI as llm.c does: rank 0 makes the
// unique id, MPI broadcasts it, every rank joins (ncclCommInitRank).
//
// Terms:
//  - average: ncclAllReduce with ncclAvg of every gradient, grouped
//    (ncclGroupStart/End: NCCL fuses them into few kernels), enqueued on
//    the engine's stream; each gradient in its own dtype (f32, bf16, f16,
//    f64).
//  - collective kernel (ZeRO-2 and 3: runtime/kernel_spec.h CollectiveSpec),
//    on the engine's stream between the kernels around it: all_reduce_sum
//    is ncclAllReduce (sum), all_gather ncclBroadcast from the parameter's
//    owner (out of place: the owner's x lands in every rank's y),
//    reduce_scatter ncclReduce (sum) of every rank's x into the owner's y.
//    NCCL sums in the operand's dtype (a bf16 gradient's sum is rounded at
//    every addition, unlike the CPU's f32 sum, rounded once).
//  - failure: an NCCL error is an Error naming the call and NCCL's text; a
//    rank that died makes the others wait in the stream synchronization,
//    which the communicator's watchdog times (runtime/communicator.h).
#pragma once

#include <cuda.h>

#include <memory>
#include <string>
#include <vector>

#include "runtime/communicator.h"
#include "runtime/program.h"

namespace napkin::runtime::cuda {

class NcclCollectives {
 public:
  // Loads libnccl.so.2. Throws Error when it cannot be loaded or is too
  // old, saying why.
  NcclCollectives();
  ~NcclCollectives();
  NcclCollectives(const NcclCollectives&) = delete;
  NcclCollectives& operator=(const NcclCollectives&) = delete;

  // "NCCL 2.28.3".
  const std::string& describe() const { return describe_; }

  // Joins the job's ranks (comm.size() > 1), every rank at once. Throws
  // Error when the communicator cannot be made.
  void join(Communicator& comm);

  // Enqueues the average over the ranks of the gradients `which` (indices in
  // program.gradients), in place in the arena at `arena`, on `stream`: one
  // NCCL group. `owners` (ZeRO-2), per gradient index: the rank each is
  // averaged onto (ncclReduce; the others' buffers keep their own
  // gradient); empty: every rank (ncclAllReduce).
  void average_gradients(const Program& program, const std::vector<int>& which, const std::vector<int>& owners,
                         CUdeviceptr arena, CUstream stream);

  // Enqueues one collective kernel on `stream`: x and y are its operand's and
  // output's device addresses, `owner` its parameter's owner (the root of a
  // gather or a reduce). `average`: a reduce averages (ncclAvg) instead of
  // summing.
  void collective(const CollectiveSpec& spec, int owner, CUdeviceptr x, CUdeviceptr y, CUstream stream,
                  bool average = false);
  // Enqueues every tensor (in the arena at `arena`) from its owner's copy
  // into every rank's, in place, on `stream`: one NCCL group.
  void broadcast(const std::vector<const TensorSpec*>& tensors, const std::vector<int>& owners, CUdeviceptr arena,
                 CUstream stream);

 private:
  struct Api;
  std::unique_ptr<Api> api_;
  std::string describe_;
};

}  // namespace napkin::runtime::cuda
