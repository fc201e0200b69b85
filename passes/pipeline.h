// The default pipelines, top to bottom. Each later stage (mixed precision,
// fusion, memory planning) adds its pass to run_training_pipeline, in order.
#pragma once

#include "passes/pass.h"
#include "passes/recompute.h"

namespace napkin::passes {

// The forward pipeline: clean the frontend's graph so the report counts only
// what the loss needs.
bool run_forward_pipeline(ir::Graph& g, ir::Diagnostics& diag, const PipelineOptions& options = {});

// The whole training step: the forward graph, its backward (autodiff) and the
// optimizer's update, so everything a step does is IR. With a memory budget,
// activations are recomputed until the planned arena fits it.
bool run_training_pipeline(ir::Graph& g, ir::Diagnostics& diag, const PipelineOptions& options = {},
                           const MemoryBudget& budget = {});

// The inference program of a language model (passes/derive_inference.h):
// the forward graph's attention fused and its precision policy applied, then
// the prefill and decode phases derived from it, then fused as the training
// step is. False with errors in diag when the model cannot be sampled.
bool run_inference_pipeline(ir::Graph& g, ir::Diagnostics& diag, const PipelineOptions& options = {});

}  // namespace napkin::passes
