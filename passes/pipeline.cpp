#include "passes/pipeline.h"

#include "passes/autodiff.h"
#include "passes/dce.h"
#include "passes/fuse_elementwise.h"
#include "passes/optimizer.h"

namespace napkin::passes {

bool run_forward_pipeline(ir::Graph& g, ir::Diagnostics& diag, const PipelineOptions& options) {
  PassManager pm(options);
  pm.add(make_dce_pass());  // drop forward values the loss does not need
  if (!pm.run(g, diag)) return false;
  warn_unused_params(g, diag);
  return true;
}

bool run_training_pipeline(ir::Graph& g, ir::Diagnostics& diag, const PipelineOptions& options) {
  PassManager pm(options);
  pm.add(make_dce_pass());        // drop forward values the loss does not need
  pm.add(make_autodiff_pass());   // d loss / d param for every param: the backward phase
  pm.add(make_dce_pass());        // drop gradients no parameter needs (e.g. of the data)
  pm.add(make_optimizer_pass());  // new params and optimizer state: the optimizer phase
  pm.add(make_dce_pass());        // drop scalars the chosen rule did not use (t under a constant lr)
  pm.add(make_fuse_elementwise_pass());  // elementwise chains become one kernel each: last, it only groups
  if (!pm.run(g, diag)) return false;
  warn_unused_params(g, diag);
  return true;
}

}  // namespace napkin::passes
