#include <cmath>
// The kind of each kernel is decided once: every op's table row names the
// loop it runs as (ir/loop.h), which agrees with the op's class, and the plan
// stamps each kernel's KernelKind with the loop's parameters from it
// (codegen/plan.h), which the backends and the interpreter switch on.
#include <doctest/doctest.h>

#include <map>
#include <set>

#include "codegen/plan.h"
#include "ir/op.h"
#include "support/test_models.h"

namespace napkin {
namespace {

using codegen::KernelKind;
using ir::LoopKind;

TEST_CASE("op table: every op's row names its loop kind, which agrees with its class") {
  const std::map<ir::OpClass, std::set<LoopKind>> allowed = {
      {ir::OpClass::Source, {LoopKind::Fill}},
      {ir::OpClass::Elementwise, {LoopKind::Elementwise}},
      {ir::OpClass::Reduction, {LoopKind::Reduction}},
      {ir::OpClass::Contraction, {LoopKind::Contraction}},
      {ir::OpClass::View, {LoopKind::View}},
      {ir::OpClass::Copy, {LoopKind::Elementwise, LoopKind::Concat}},
      {ir::OpClass::Gather, {LoopKind::Gather, LoopKind::ScatterAdd}},
      {ir::OpClass::Normalization, {LoopKind::Rows}},
      {ir::OpClass::Loss, {LoopKind::Rows, LoopKind::Mse}},
      {ir::OpClass::Attention, {LoopKind::Attention, LoopKind::CachedAttention}},
      {ir::OpClass::Classifier, {LoopKind::Classifier}},
      {ir::OpClass::Rotary, {LoopKind::Rope}},
      {ir::OpClass::Collective, {LoopKind::Collective}},
      {ir::OpClass::Routing, {LoopKind::TopK, LoopKind::MoeSlots}},
  };
  for (int i = 0; i < ir::kNumOps; ++i) {
    const ir::OpInfo& info = ir::op_info(static_cast<ir::Op>(i));
    INFO(info.name);
    CHECK(allowed.at(info.op_class).count(info.loop) == 1);
    if (info.element_index != ir::ElementIndex::None) CHECK(info.loop == LoopKind::Elementwise);
  }
  CHECK(ir::op_info(ir::Op::Triu).element_index == ir::ElementIndex::RowCol);
  CHECK(ir::op_info(ir::Op::CausalMask).element_index == ir::ElementIndex::RowCol);
  CHECK(ir::op_info(ir::Op::Dropout).element_index == ir::ElementIndex::Flat);
}

TEST_CASE("kernel plan: each kernel's kind and parameters are stamped from its op's loop kind") {
  const std::map<LoopKind, std::set<KernelKind>> kinds = {
      {LoopKind::Fill, {KernelKind::Fill}},
      {LoopKind::Elementwise, {KernelKind::Elementwise}},
      {LoopKind::Reduction, {KernelKind::Reduction}},
      {LoopKind::Contraction, {KernelKind::Gemm, KernelKind::ContractionLoops}},
      {LoopKind::Concat, {KernelKind::Concat}},
      {LoopKind::Gather, {KernelKind::Gather}},
      {LoopKind::ScatterAdd, {KernelKind::ScatterAdd}},
      {LoopKind::Rows, {KernelKind::Rows}},
      {LoopKind::Mse, {KernelKind::Mse}},
      {LoopKind::Attention, {KernelKind::Attention}},
      {LoopKind::Classifier, {KernelKind::Classifier}},
      {LoopKind::CachedAttention, {KernelKind::CachedAttention}},
      {LoopKind::Rope, {KernelKind::Rope}},
      {LoopKind::TopK, {KernelKind::TopK}},
      {LoopKind::MoeSlots, {KernelKind::MoeSlots}},
      {LoopKind::Collective, {KernelKind::Collective}},
  };
  std::set<KernelKind> seen;
  int fused_reductions = 0, gemm_epilogues = 0;
  for (const auto& model : testing::model_files()) {
    ir::Graph g = testing::compile_small_model(model);
    const codegen::KernelPlan plan = codegen::plan_kernels(g);
    for (const codegen::Kernel& k : plan.kernels) {
      INFO(model.stem().string() << " " << k.name);
      seen.insert(k.kind);
      // A fusion group is a fused elementwise kernel, or a reduction with its
      // prologue (the group's last member, the kernel's op and parameters).
      // A Gemm with an epilogue (ir/gemm_epilogue.h) has its group's ops too, the contraction first.
      const bool fused_kind = k.kind == KernelKind::FusedElementwise || k.kind == KernelKind::Reduction ||
                              (k.kind == KernelKind::Gemm && k.epilogue.has_value());
      if (k.fused) CHECK(fused_kind);
      if (k.epilogue) {
        REQUIRE(k.fused.has_value());
        CHECK(ir::op_info(k.fused->ops.front().op).op_class == ir::OpClass::Contraction);
        CHECK(k.fused->outputs.size() == (k.epilogue->aux_output >= 0 ? 2u : 1u));  // D, and a gelu's input
        ++gemm_epilogues;
      }
      if (k.kind == KernelKind::FusedElementwise) CHECK(k.fused.has_value());
      CHECK((k.kind == KernelKind::Gemm) == k.matmul.has_value());
      if (k.fused && k.kind == KernelKind::Reduction) {
        CHECK(k.fused->ops.back().op == k.op);
        CHECK(ir::op_info(k.op).loop == ir::LoopKind::Reduction);
        CHECK(k.params.index() == ir::loop_params(k.op, k.attrs).index());
        ++fused_reductions;
      }
      if (k.fused) continue;
      CHECK(kinds.at(ir::op_info(k.op).loop).count(k.kind) == 1);
      CHECK(k.params.index() == ir::loop_params(k.op, k.attrs).index());
    }
  }
  for (KernelKind kind : {KernelKind::Elementwise, KernelKind::FusedElementwise, KernelKind::Reduction, KernelKind::Gemm,
                          KernelKind::Gather, KernelKind::ScatterAdd, KernelKind::Rows, KernelKind::Mse,
                          KernelKind::Collective})
    CHECK_MESSAGE(seen.count(kind) == 1, "no built-in model has a kernel of kind " << static_cast<int>(kind));
  CHECK(fused_reductions > 0);  // gradient clipping's squares and their sums
  CHECK(gemm_epilogues > 0);    // bias adds and residuals after a matmul
}

TEST_CASE("kernel plan: a GPT's row kernels carry their variant, axis, centering and eps") {
  ir::Graph g = testing::compile_small_model(testing::source_path("models/gpt.yaml"));
  const codegen::KernelPlan plan = codegen::plan_kernels(g);
  std::map<ir::Op, int> rows_of;
  for (const codegen::Kernel& k : plan.kernels) {
    if (k.kind != KernelKind::Rows) continue;
    INFO(k.name);
    ++rows_of[k.op];
    const ir::RowParams& p = k.rows();
    switch (k.op) {
      case ir::Op::Softmax:
        CHECK(p.variant == ir::RowVariant::Softmax);
        CHECK(p.axis == k.attrs.get_int("axis"));
        break;
      case ir::Op::SoftmaxGrad: CHECK(p.variant == ir::RowVariant::SoftmaxGrad); break;
      case ir::Op::LayerNorm:
        CHECK(p.variant == ir::RowVariant::Norm);
        CHECK(p.centered);
        CHECK(p.eps == k.attrs.get_double("eps"));
        break;
      case ir::Op::LayerNormGrad:
        CHECK(p.variant == ir::RowVariant::NormGrad);
        CHECK(p.centered);
        CHECK(p.gains);  // the gain's and bias's gradients from the same pass
        CHECK(k.extra_outputs.size() == 2u);
        break;
      case ir::Op::CrossEntropy: CHECK(p.variant == ir::RowVariant::CrossEntropy); break;
      case ir::Op::CrossEntropyGrad: CHECK(p.variant == ir::RowVariant::CrossEntropyGrad); break;
      default: FAIL_CHECK("unexpected row op " << ir::op_name(k.op));
    }
  }
  // Softmax and its gradient are inside the fused attention kernels
  // (passes/fuse_attention.h), cross_entropy and its gradient inside the
  // fused classifier's (passes/fuse_classifier.h); the gains' gradients
  // inside layernorm_grad's.
  for (ir::Op op : {ir::Op::LayerNorm, ir::Op::LayerNormGrad})
    CHECK_MESSAGE(rows_of[op] > 0, ir::op_name(op));
  int classifier = 0;
  for (const codegen::Kernel& k : plan.kernels)
    if (k.kind == KernelKind::Classifier) {
      ++classifier;
      CHECK(k.classifier().backward == (k.op == ir::Op::LinearCrossEntropyGrad));
      CHECK(k.extra_outputs.size() == 1u);  // lse forward, dw backward
    }
  CHECK(classifier == 2);
  int attention = 0;
  for (const codegen::Kernel& k : plan.kernels)
    if (k.kind == KernelKind::Attention) {
      ++attention;
      CHECK(k.attention().causal);
      CHECK(k.attention().scale == doctest::Approx(1 / std::sqrt(double(k.inputs[0].sizes[3]))));
      // lse forward; dk and dv backward, unless dq, dk and dv are packed in one output (passes/attention_layout.h).
      const bool packed = k.attention().backward && k.attention().packed_grad;
      CHECK(k.extra_outputs.size() == (packed ? 0u : k.attention().backward ? 2u : 1u));
      if (k.attention().backward) CHECK(codegen::attention_gradients(k).size() == 3u);
    }
  CHECK(attention > 0);
}

}  // namespace
}  // namespace napkin
