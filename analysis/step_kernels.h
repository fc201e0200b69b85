// The kernels of a step, listed once: the nodes each runs, its kind and its
// name. The kernel plan (codegen/plan.h), the time model (step_time.h), the
// report and the program description (codegen/program_json.h) all read this
// list, so they describe the same kernels in the same order.
//
// Terms:
//  - kernel: a non-view node of the schedule (a view is a window on its
//    input's buffer: no work), a fusion group (ir/fusion_group.h) or a batch
//    of groups, in schedule order.
//  - kind (KernelKind): which emitter makes it. Its op's ir::LoopKind, except
//    that a fusion group is FusedElementwise, or a Reduction when it ends with
//    one, or a Gemm when it starts with a contraction (with its epilogue or
//    bias gradient: ir/gemm_epilogue.h); and a contraction is a Gemm where
//    the GEMM library takes it (analysis/contraction.h), else ContractionLoops.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ir/fusion_group.h"
#include "ir/graph.h"

namespace napkin::analysis {

// What a kernel runs as (the parameters named are codegen/plan.h's Kernel's).
enum class KernelKind : uint8_t {
  Fill,              // constant, arange: Kernel::fill()
  Elementwise,       // one elementwise op
  FusedElementwise,  // a fusion group: Kernel::fused
  Reduction,         // Kernel::reduction()
  Gemm,              // Kernel::matmul: the GEMM library's call
  ContractionLoops,  // Kernel::contraction as generated loops
  Concat,            // concat, pad: Kernel::concat()
  Gather,            // embedding: embedding_loop
  ScatterAdd,        // the embedding gradient: embedding_loop
  Rows,              // Kernel::rows(): row_loop
  Mse,
  Attention,         // fused attention, forward or backward: Kernel::attention()
  Classifier,        // the fused classifier, forward or backward: Kernel::classifier()
  CachedAttention,   // attention against a KV cache (inference): Kernel::cached_attention()
  Rope,              // rotary position embeddings of one tensor: Kernel::rope()
  Collective,        // all_reduce_sum, all_gather, reduce_scatter: the input copied to the output, the ranks' part the runtime's (ir/loop.h)
  TopK,              // top_k: each row's k largest values and their indices: Kernel::top_k()
  MoeSlots,          // moe_slots: the experts' slots of each token's choices: Kernel::moe_slots()
};

// What a kernel does, for grouping measured and predicted time (docs/report.md,
// "Kernel classes"): kernel_class below, a function of the kernel's kind.
enum class KernelClass : uint8_t { Matmul, Attention, Elementwise, Normalization, Loss, Optimizer, Copy };
inline constexpr int kNumKernelClasses = 7;
std::string_view kernel_class_name(KernelClass c);  // "matmul", "attention", ...

struct StepKernel {
  KernelKind kind = KernelKind::Elementwise;
  ir::Phase phase = ir::Phase::Forward;
  std::string name;  // "k17_einsum": its index and what it runs; unique, a valid C identifier
  std::vector<ir::NodeId> nodes;  // what it runs, schedule order (a batch: each group's members, group after group)
  int group = -1;                 // its fusion group (a batch's first), -1 for one node
  int batch = -1;                 // its batch, -1 for none
};

// The kernels of g, in schedule order; `groups` is ir::fusion_groups(g).
std::vector<StepKernel> step_kernels(const ir::Graph& g, const ir::FusionGroups& groups);

KernelClass kernel_class(const ir::Graph& g, const StepKernel& k);

}  // namespace napkin::analysis
