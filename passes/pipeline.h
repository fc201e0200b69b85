// The default pipelines, top to bottom. Each later stage (mixed precision,
// fusion, memory planning) adds its pass to run_training_pipeline, in order.
#pragma once

#include <optional>
#include <vector>

#include "passes/fuse_attention.h"
#include "passes/fuse_classifier.h"
#include "passes/pass.h"
#include "passes/recompute.h"
#include "passes/rematerialize.h"
#include "passes/shard_parameters.h"

namespace napkin::passes {

// What the passes of a pipeline found and did, for the report: each pass
// writes its part, and a later pass may correct an earlier one's
// (fuse_gemm_epilogues, the rematerialized FLOPs).
struct PipelineResult {
  std::vector<AttentionSite> attention_sites;    // fuse_attention: each site fused or why not
  std::vector<ClassifierSite> classifier_sites;  // fuse_classifier: each cross_entropy fused or why not
  CastPlacement cast_placement;                  // sink_casts and matmul_epilogues: what they rewrote
  Rematerialized rematerialized;                 // rematerialize: what it recomputes
  RecomputeReport recompute;                     // recompute under --memory-budget (ran: a budget was given)
  ShardSchedule shard_schedule;                  // ZeRO-3's units and the prefetch of their gathers (ran: --zero 3)
};

// The forward pipeline: clean the frontend's graph so the report counts only
// what the loss needs. Nullopt with errors in diag.
std::optional<PipelineResult> run_forward_pipeline(ir::Graph& g, ir::Diagnostics& diag,
                                                   const PipelineOptions& options = {});

// The whole training step: the forward graph, its backward (autodiff) and the
// optimizer's update, so everything a step does is IR. With a memory budget,
// activations are recomputed until the planned arena fits it.
std::optional<PipelineResult> run_training_pipeline(ir::Graph& g, ir::Diagnostics& diag,
                                                    const PipelineOptions& options = {},
                                                    const MemoryBudget& budget = {});

// The inference program of a language model (passes/derive_inference.h):
// the forward graph's attention fused and its precision policy applied, then
// the prefill and decode phases derived from it, then fused as the training
// step is. Nullopt with errors in diag when the model cannot be sampled.
std::optional<PipelineResult> run_inference_pipeline(ir::Graph& g, ir::Diagnostics& diag,
                                                     const PipelineOptions& options = {});

}  // namespace napkin::passes
