// The default pipeline, top to bottom. Each later stage (autodiff, optimizer,
// mixed precision, fusion, memory planning) adds its pass here, in order.
#pragma once

#include "passes/pass.h"

namespace napkin::passes {

// The forward pipeline: clean the frontend's graph so the report counts only
// what the loss needs.
bool run_forward_pipeline(ir::Graph& g, ir::Diagnostics& diag, const PipelineOptions& options = {});

}  // namespace napkin::passes
