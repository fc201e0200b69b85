#include "analysis/step_kernels.h"

#include <fmt/format.h>

#include <iterator>

#include "analysis/contraction.h"
#include "analysis/cost.h"
#include "ir/internal_check.h"
#include "ir/loop.h"

namespace napkin::analysis {

std::string_view kernel_class_name(KernelClass c) {
  static constexpr std::string_view kNames[] = {"matmul", "attention", "elementwise", "normalization", "loss", "optimizer", "copy"};
  static_assert(std::size(kNames) == kNumKernelClasses);
  return kNames[static_cast<int>(c)];
}

namespace {

// The kind of one node's kernel, from its op's loop kind.
KernelKind node_kind(const ir::Graph& g, const ir::Node& n) {
  switch (ir::op_info(n.op).loop) {
    case ir::LoopKind::Fill: return KernelKind::Fill;
    case ir::LoopKind::Elementwise: return KernelKind::Elementwise;
    case ir::LoopKind::Reduction: return KernelKind::Reduction;
    case ir::LoopKind::Contraction:
      return gemm_takes(g.value(n.in(0)).type.dtype, g.value(n.in(1)).type.dtype, g.value(n.out()).type.dtype) &&
                     lower_to_gemm(contraction_axes(g, n, n.out()))
                 ? KernelKind::Gemm
                 : KernelKind::ContractionLoops;
    case ir::LoopKind::Concat: return KernelKind::Concat;
    case ir::LoopKind::Gather: return KernelKind::Gather;
    case ir::LoopKind::ScatterAdd: return KernelKind::ScatterAdd;
    case ir::LoopKind::Rows: return KernelKind::Rows;
    case ir::LoopKind::Mse: return KernelKind::Mse;
    case ir::LoopKind::Attention: return KernelKind::Attention;
    case ir::LoopKind::Classifier: return KernelKind::Classifier;
    case ir::LoopKind::CachedAttention: return KernelKind::CachedAttention;
    case ir::LoopKind::Rope: return KernelKind::Rope;
    case ir::LoopKind::Collective: return KernelKind::Collective;
    case ir::LoopKind::TopK: return KernelKind::TopK;
    case ir::LoopKind::MoeSlots: return KernelKind::MoeSlots;
    case ir::LoopKind::View: break;
  }
  NAPKIN_INTERNAL_CHECK(false, "a view has no kernel (node {})", n.id);
  return KernelKind::Elementwise;
}

std::string_view op_of(const ir::Graph& g, ir::NodeId id) { return ir::op_name(g.node(id).op); }

}  // namespace

std::vector<StepKernel> step_kernels(const ir::Graph& g, const ir::FusionGroups& groups) {
  std::vector<StepKernel> kernels;
  const std::vector<ir::NodeId>& schedule = g.schedule();
  for (int position = 0; position < static_cast<int>(schedule.size()); ++position) {
    const ir::Node& n = g.node(schedule[position]);
    if (ir::op_info(n.op).op_class == ir::OpClass::View) continue;
    const size_t index = kernels.size();
    const int group = groups.group_at[position];
    if (group < 0) {
      kernels.push_back({node_kind(g, n), n.phase, fmt::format("k{}_{}", index, ir::op_name(n.op)), {n.id}});
      continue;
    }
    const ir::FusionGroup& fg = groups.groups[group];
    StepKernel k;
    k.phase = fg.phase, k.group = group, k.batch = groups.batch_of[group];
    // Listed at its first member (a batch's: its first group's), which runs it whole.
    if (fg.first != position || (k.batch >= 0 && groups.batches[k.batch].groups.front() != group)) continue;
    k.kind = fg.contraction != ir::kNoNode ? KernelKind::Gemm
             : fg.reduction != ir::kNoNode ? KernelKind::Reduction
                                           : KernelKind::FusedElementwise;
    const std::vector<int> members = k.batch >= 0 ? groups.batches[k.batch].groups : std::vector<int>{group};
    for (int member : members) k.nodes.insert(k.nodes.end(), groups.groups[member].nodes.begin(), groups.groups[member].nodes.end());
    if (k.batch >= 0) k.name = fmt::format("k{}_batched_{}_x{}", index, op_of(g, fg.nodes.back()), members.size());
    else if (fg.contraction == ir::kNoNode) k.name = fmt::format("k{}_fused_{}", index, op_of(g, fg.nodes.back()));
    else if (fg.reduction == ir::kNoNode) k.name = fmt::format("k{}_{}_epilogue", index, op_of(g, fg.contraction));
    else k.name = fmt::format("k{}_{}_bias_grad", index, op_of(g, fg.contraction));
    kernels.push_back(std::move(k));
  }
  return kernels;
}

KernelClass kernel_class(const ir::Graph& g, const StepKernel& k) {
  if (k.phase == ir::Phase::Optimizer) return KernelClass::Optimizer;
  const ir::Node& n = g.node(k.nodes.back());
  switch (k.kind) {
    case KernelKind::Fill:
    case KernelKind::FusedElementwise:
    case KernelKind::Reduction: return KernelClass::Elementwise;
    case KernelKind::Elementwise:
      return ir::op_info(n.op).op_class == ir::OpClass::Copy ? KernelClass::Copy : KernelClass::Elementwise;
    case KernelKind::Gemm:
    case KernelKind::ContractionLoops:
      // A GEMM with its epilogue or bias gradient counts as a weight matmul.
      return k.group >= 0 || matmul_role(g, n) == MatmulRole::Weight ? KernelClass::Matmul : KernelClass::Attention;
    case KernelKind::Concat:
    case KernelKind::Gather:
    case KernelKind::ScatterAdd: return KernelClass::Copy;
    case KernelKind::Rows:
      switch (std::get<ir::RowParams>(ir::loop_params(n.op, n.attrs)).variant) {
        case ir::RowVariant::Softmax:
        case ir::RowVariant::SoftmaxGrad: return KernelClass::Attention;
        case ir::RowVariant::CrossEntropy:
        case ir::RowVariant::CrossEntropyGrad: return KernelClass::Loss;
        case ir::RowVariant::LogSoftmax:
        case ir::RowVariant::Norm:
        case ir::RowVariant::NormGrad: return KernelClass::Normalization;
      }
      break;
    case KernelKind::Mse: return KernelClass::Loss;
    case KernelKind::Attention:
    case KernelKind::CachedAttention: return KernelClass::Attention;
    case KernelKind::Classifier: return KernelClass::Matmul;
    case KernelKind::Rope: return KernelClass::Elementwise;  // a pass over x, memory-bound
    case KernelKind::Collective: return KernelClass::Elementwise;  // a copy on one device (the ranks' part is the runtime's)
    case KernelKind::TopK:
    case KernelKind::MoeSlots: return KernelClass::Elementwise;  // comparisons and counts over small rows, memory-bound
  }
  return KernelClass::Elementwise;
}

}  // namespace napkin::analysis
