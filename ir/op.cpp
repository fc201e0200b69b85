#include "ir/op.h"

#include <fmt/format.h>

#include "ir/internal_check.h"
#include "ir/rope.h"

namespace napkin::ir {

namespace {

RowParams row_params(Op op, const Attrs& a) {
  switch (op) {
    case Op::Softmax: return {RowVariant::Softmax, a.get_int("axis")};
    case Op::LogSoftmax: return {RowVariant::LogSoftmax, a.get_int("axis")};
    case Op::SoftmaxGrad: return {RowVariant::SoftmaxGrad, a.get_int("axis")};
    case Op::CrossEntropy: return {RowVariant::CrossEntropy};
    case Op::CrossEntropyGrad: return {RowVariant::CrossEntropyGrad};
    case Op::LayerNorm: return {RowVariant::Norm, -1, true, a.get_double("eps")};
    case Op::RMSNorm: return {RowVariant::Norm, -1, false, a.get_double("eps")};
    case Op::LayerNormGrad:
    case Op::RMSNormGrad:
      return {RowVariant::NormGrad, -1, op == Op::LayerNormGrad, a.get_double("eps"), a.has("gains") && a.get_int("gains") != 0};
    default: NAPKIN_INTERNAL_CHECK(false, "{} has no row variant", op_name(op));
  }
  return {};
}

// The rotary embeddings an attention node applies to q and k, if any.
std::optional<RopeParams> attention_rope(const Attrs& a) {
  if (!has_rope(a, "rope_")) return std::nullopt;
  return rope_params(a, "rope_");
}

}  // namespace

std::string_view collective_name(Collective c) {
  switch (c) {
    case Collective::AllReduceSum: return "all_reduce_sum";
    case Collective::AllGather: return "all_gather";
    case Collective::ReduceScatter: return "reduce_scatter";
  }
  return "?";
}

LoopParams loop_params(Op op, const Attrs& a) {
  switch (op_info(op).loop) {
    case LoopKind::View:
    case LoopKind::Elementwise:
    case LoopKind::Gather:
    case LoopKind::ScatterAdd:
    case LoopKind::Mse: return std::monostate{};
    case LoopKind::Collective:
      return CollectiveParams{op == Op::AllGather       ? Collective::AllGather
                              : op == Op::ReduceScatter ? Collective::ReduceScatter
                                                        : Collective::AllReduceSum};
    case LoopKind::Fill:
      if (op == Op::Iota) return FillParams{FillPattern::Arange, 0};
      return FillParams{FillPattern::Constant, a.get_double("value")};
    case LoopKind::Reduction: {
      Combiner c = op == Op::ReduceMax ? Combiner::Max : op == Op::ReduceMin ? Combiner::Min : Combiner::Sum;
      return ReductionParams{c, op == Op::ReduceMean, a.get_ints("axes"), a.get_int("keepdims") != 0};
    }
    case LoopKind::Contraction:
      if (op == Op::Einsum) return ContractionParams{true, a.get_ints("lhs"), a.get_ints("rhs"), a.get_ints("out")};
      return ContractionParams{};
    case LoopKind::Concat:
      if (op == Op::Pad) return ConcatParams{a.get_int("axis"), a.get_int("before")};
      return ConcatParams{a.get_int("axis"), std::nullopt};
    case LoopKind::Rows: return row_params(op, a);
    case LoopKind::Attention:
      return AttentionParams{op == Op::AttentionGrad, a.get_int("causal") != 0, a.get_double("scale"),
                             a.has("seq_major_out") && a.get_int("seq_major_out") != 0,
                             a.has("packed_grad") && a.get_int("packed_grad") != 0, attention_rope(a)};
    case LoopKind::Classifier: return ClassifierParams{op == Op::LinearCrossEntropyGrad};
    case LoopKind::CachedAttention: return CachedAttentionParams{a.get_double("scale"), attention_rope(a)};
    case LoopKind::Rope: return rope_params(a);
    case LoopKind::TopK: return TopKParams{a.get_int("k")};
    case LoopKind::MoeSlots: return MoeSlotsParams{a.get_int("experts"), a.get_int("capacity")};
  }
  return std::monostate{};
}

}  // namespace napkin::ir
