#include "passes/pipeline.h"

#include "passes/dce.h"

namespace napkin::passes {

bool run_forward_pipeline(ir::Graph& g, ir::Diagnostics& diag, const PipelineOptions& options) {
  PassManager pm(options);
  pm.add(make_dce_pass());  // drop forward values the loss does not need
  if (!pm.run(g, diag)) return false;
  warn_unused_params(g, diag);
  return true;
}

}  // namespace napkin::passes
