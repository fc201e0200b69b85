#include "passes/pipeline.h"

#include "passes/attention_layout.h"
#include "passes/autodiff.h"
#include "passes/dce.h"
#include "passes/derive_inference.h"
#include "passes/embedding_grad_into.h"
#include "passes/fp8_scaling.h"
#include "passes/fold_concat_copy.h"
#include "passes/fuse_elementwise.h"
#include "passes/fuse_gemm_epilogues.h"
#include "passes/fuse_rope.h"
#include "passes/loss_scaling.h"
#include "passes/matmul_epilogues.h"
#include "passes/mixed_precision.h"
#include "passes/norm_grad_residual.h"
#include "passes/optimizer.h"
#include "passes/shard_parameters.h"
#include "passes/sink_casts.h"

namespace napkin::passes {

namespace {

// The forward passes, the first of every pipeline: what training
// differentiates and inference derives its phases from.
void add_forward_passes(PassManager& pm, const PipelineOptions& options, PipelineResult& result) {
  pm.add(make_dce_pass());  // drop forward values the loss does not need
  if (options.fuse_attention) {
    pm.add(make_fuse_attention_pass(result.attention_sites));  // spelled-out attention becomes one op
    if (options.fuse_rope) pm.add(make_fuse_rope_pass());  // rope of q and k applied as attention loads them
    pm.add(make_dce_pass());  // drop the scores and probabilities it replaced, and the fused ropes
  }
  pm.add(make_mixed_precision_pass());  // casts of the precision policy, differentiated by autodiff
  if (options.fuse_classifier)
    pm.add(make_fuse_classifier_pass(result.classifier_sites));  // matmul + cross_entropy: no logits stored
  pm.add(make_dce_pass());  // drop the f32 constants the policy remade in the low dtype, the logits the classifier replaced
}

}  // namespace

std::optional<PipelineResult> run_forward_pipeline(ir::Graph& g, ir::Diagnostics& diag, const PipelineOptions& options) {
  PipelineResult result;
  PassManager pm(options);
  add_forward_passes(pm, options, result);
  if (!pm.run(g, diag)) return std::nullopt;
  warn_unused_params(g, diag);
  return result;
}

std::optional<PipelineResult> run_training_pipeline(ir::Graph& g, ir::Diagnostics& diag, const PipelineOptions& options,
                                                    const MemoryBudget& budget) {
  g.config.train.memory_budget = budget.bytes;  // the checkpoints record it (ir/training_config.h)
  PipelineResult result;
  PassManager pm(options);
  add_forward_passes(pm, options, result);
  pm.add(make_autodiff_pass());   // d loss / d param for every param: the backward phase
  pm.add(make_dce_pass());        // drop gradients no parameter needs (e.g. of the data)
  pm.add(make_fold_concat_copy_pass());  // a concat copied to another layout is written there once
  if (options.sink_casts) {
    pm.add(make_dce_pass());         // drop the concats and copies fold_concat_copy replaced
    pm.add(make_sink_casts_pass(result.cast_placement));  // casts where they store the fewest bytes, same bits
    pm.add(make_dce_pass());         // drop the casts and views it replaced
  }
  if (options.matmul_epilogues) {
    pm.add(make_matmul_epilogues_pass(result.cast_placement));  // a matmul stores its f32 sums for a widening cast
    pm.add(make_dce_pass());               // drop the casts it replaced
  }
  if (options.norm_grad_residual) {
    pm.add(make_norm_grad_residual_pass());  // a norm's gradient kernel adds the residual's as it stores dx
    pm.add(make_dce_pass());                 // drop the adds it replaced
  }
  if (options.embedding_grad_into) {
    pm.add(make_embedding_grad_into_pass());  // a tied table's lookup gradient scattered into the classifier's
    pm.add(make_dce_pass());                  // drop the adds it replaced
  }
  pm.add(make_fp8_scaling_pass());  // fp8-mixed: quantize every bf16 contraction's operands
  if (options.shard_parameters)  // ZeRO-3: parameters gathered where used, gradients reduced onto their owners
    pm.add(make_shard_parameters_pass({.keep_gathered = options.keep_gathered,
                                       .prefetch = options.prefetch,
                                       .device = options.shard_device,
                                       .link = options.shard_link,
                                       .ranks = options.shard_ranks},
                                      result.shard_schedule));
  pm.add(make_loss_scaling_pass());  // fp16-mixed: scaled backward seed, unscaled gradients
  pm.add(make_optimizer_pass());  // new params and optimizer state: the optimizer phase
  pm.add(make_skip_nonfinite_updates_pass());  // fp16-mixed: skip the update on Inf/NaN
  pm.add(make_dce_pass());        // drop scalars the chosen rule did not use (t under a constant lr)
  if (options.fuse_attention && options.attention_layout)
    pm.add(make_attention_layout_pass());  // fused attention stores o where the head merge copied it
  if (options.rematerialize) pm.add(make_rematerialize_pass(result.rematerialized));  // recompute cheap values from narrower ones
  if (budget.bytes > 0) pm.add(make_recompute_pass(budget.bytes, result.recompute));  // fit the arena to the budget
  pm.add(make_fuse_elementwise_pass());  // elementwise chains become one kernel each: it only groups
  if (options.matmul_epilogues)
    pm.add(make_fuse_gemm_epilogues_pass(result.rematerialized));  // a contraction joins the group that is its epilogue (bias, residual, cast)
  if (!pm.run(g, diag)) return std::nullopt;
  warn_unused_params(g, diag);
  return result;
}

std::optional<PipelineResult> run_inference_pipeline(ir::Graph& g, ir::Diagnostics& diag,
                                                     const PipelineOptions& options) {
  PipelineOptions forward = options;
  forward.fuse_attention = true;    // the attention that becomes cached_attention
  forward.fuse_rope = true;         // and rotates q and k at the phase's positions
  forward.fuse_classifier = false;  // derive_inference finds the logits as the cross_entropy's operand
  PipelineResult result;
  PassManager pm(options);
  add_forward_passes(pm, forward, result);
  pm.add(make_derive_inference_pass());  // a new graph: the prefill and decode phases
  pm.add(make_dce_pass());
  if (options.sink_casts) {
    pm.add(make_sink_casts_pass(result.cast_placement));  // casts where they store the fewest bytes
    pm.add(make_dce_pass());
  }
  pm.add(make_fuse_elementwise_pass());  // elementwise chains become one kernel each
  if (!pm.run(g, diag)) return std::nullopt;
  return result;
}

}  // namespace napkin::passes
