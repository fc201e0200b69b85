// ZeRO stage 1 for a data-parallel job (docs/distributed.md): each rank
// updates only the parameters it owns, with their optimizer state, and then
// every parameter goes from its owner to the other ranks. The gradients are
// all-reduced as without it (every rank needs the whole gradient for global
// clipping and fp16's overflow check), so the update each owner computes is
// the one every rank would have computed: a ZeRO-1 run is bit-identical to
// plain data parallelism, and its optimizer state is touched by one rank
// each.
//
// Terms:
//  - unit: parameters that share an optimizer kernel (codegen/plan.h
//    Kernel::serves) whose members cannot run apart, owned together so that
//    the kernel runs on one rank. A batch whose program lists its members
//    can (the CPU's, by each member's work items: Launch::member_work; a
//    CUDA batch of updates, by its run mask: codegen/cuda/batches.cpp), so
//    there every parameter is a unit; a batch without its members listed
//    cannot. A kernel that serves every parameter (the gradient norm) binds
//    none: every rank runs it (under ZeRO-2 it sums this rank's part of the
//    norm, which an all_reduce_sum kernel then adds over the ranks).
//  - ownership: units, largest first (parameter and state bytes; ties by the
//    first parameter's index), each to the rank with the fewest bytes so far
//    (ties: the lowest rank). A pure function of the program and the rank
//    count.
//  - skipped: an optimizer kernel that serves no parameter of this rank (or
//    a batch member), an update copy of another rank's parameter or state.
//    Shared kernels (the learning rate, the step counter) run everywhere.
//  - memory: the other ranks' optimizer state is never read here; a CPU
//    rank gives its pages back (runtime/executor.h release), so each rank
//    holds its own share of the state.
//  - gather: one broadcast per parameter from its owner, after every step;
//    before a single-file checkpoint, each state tensor from its owner to
//    rank 0, so that rank 0 holds the whole run while it writes it. A
//    sharded checkpoint gathers nothing: each rank writes what it owns
//    (tensor_owner).
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/communicator.h"
#include "runtime/engine.h"

namespace napkin::runtime {

class OptimizerShards {
 public:
  OptimizerShards(const Program& program, int ranks, int rank);

  int owner(const std::string& param) const { return owner_.at(param); }
  // The rank whose shard of a sharded checkpoint holds `t`, a parameter or
  // optimizer state: its parameter's owner; rank 0 for the state every
  // update shares (the step counter, the loss scale).
  int tensor_owner(const TensorSpec& t) const;
  const std::vector<bool>& skip_kernel() const { return skip_kernel_; }
  const std::vector<bool>& skip_update() const { return skip_update_; }
  const std::vector<std::vector<bool>>& run_member() const { return run_member_; }
  // The optimizer state of the other ranks' parameters: never read here.
  const std::vector<const TensorSpec*>& others_state() const { return others_state_; }
  // ZeRO-3: the other ranks' parameters, which this rank's step gathers
  // where it uses them and never reads in place.
  const std::vector<const TensorSpec*>& others_params() const { return others_params_; }
  int64_t owned_param_bytes() const { return owned_param_bytes_; }
  int64_t param_bytes() const { return param_bytes_; }
  // This rank's share: parameters owned, and their optimizer state bytes of all.
  int owned_params() const { return owned_params_; }
  int64_t owned_state_bytes() const { return owned_state_bytes_; }
  int64_t state_bytes() const { return state_bytes_; }

  // After the optimizer: every parameter from its owner.
  void gather_params(Engine& engine, Communicator& comm) const;
  // Before a checkpoint: every parameter's optimizer state from its owner
  // to rank 0 (which may then release it again: others_state()).
  void gather_state(Engine& engine, Communicator& comm) const { gather_to_root(engine, comm, TensorRole::State); }
  // ZeRO-3, before a checkpoint: every parameter from its owner to rank 0.
  void gather_params_to_root(Engine& engine, Communicator& comm) const {
    gather_to_root(engine, comm, TensorRole::Param);
  }

 private:
  // Every tensor of `role` from its owner (tensor_owner) to rank 0.
  void gather_to_root(Engine& engine, Communicator& comm, TensorRole role) const;

  const Program& program_;
  int rank_ = 0;
  std::unordered_map<std::string, int> owner_;  // param -> rank
  std::vector<bool> skip_kernel_, skip_update_;
  std::vector<std::vector<bool>> run_member_;
  std::vector<const TensorSpec*> others_state_, others_params_;
  int owned_params_ = 0;
  int64_t owned_state_bytes_ = 0, state_bytes_ = 0, owned_param_bytes_ = 0, param_bytes_ = 0;
};

}  // namespace napkin::runtime
