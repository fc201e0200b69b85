// Rendering of the resource report (`napkin report`) as text and as JSON.
// The numbers come from analysis/cost and analysis/memory; conventions are in docs/report.md.
#pragma once

#include <string>

#include "analysis/cost.h"
#include "analysis/distributed.h"
#include "analysis/memory.h"
#include "ir/graph.h"
#include "passes/pipeline.h"
#include "report/moe_report.h"

namespace napkin::report {

struct ReportOptions {
  std::string model_path;  // as the user gave it, for the header
  bool show_ops = true;    // the per-op table, and in the text the AMP audit's every cast
  const passes::RecomputeReport* recompute = nullptr;  // what --memory-budget recomputed, when given
  // The same model compiled with precision fp32, for the AMP audit's comparison (null: left out).
  const ir::Graph* fp32_step = nullptr;
  // What the pipeline's passes did (passes/pipeline.h): the fused-attention
  // and fused-classifier sections, what rematerialization recomputed, and what
  // the cast passes rewrote (null: none of these).
  const passes::PipelineResult* pipeline = nullptr;
  // The same step with the casts where the precision policy put them
  // (sink_casts and matmul_epilogues off), for the fusion section's
  // comparison with the pipeline's cast placement (null: left out).
  const ir::Graph* policy_casts_step = nullptr;
  // The distributed step over `ranks` ranks on `interconnect` (analysis/distributed.h), with a device;
  // null interconnect: no section.
  int ranks = 1;
  const analysis::Interconnect* interconnect = nullptr;
  // Two levels: nodes of ranks_per_node ranks on `interconnect`, joined by `inter_node` (null: one level).
  const analysis::Interconnect* inter_node = nullptr;
  int ranks_per_node = 0;
  // Micro-batches per rank per step (gradient accumulation); 0: the model's train.accumulate.
  int64_t accumulate = 0;
  // `--memory-per-rank`: each stage's fit against the limit, in the distributed section (null: left out).
  const analysis::MemoryFit* memory_fit = nullptr;
  // `--metrics FILE`: the tokens the trainer dropped per moe() layer (null: left out).
  const DroppedTokens* dropped = nullptr;
};

std::string render_report_text(const ir::Graph& g, const analysis::StepCost& cost, const analysis::MemoryReport& memory,
                               const ReportOptions& options);
std::string render_report_json(const ir::Graph& g, const analysis::StepCost& cost, const analysis::MemoryReport& memory,
                               const ReportOptions& options);

}  // namespace napkin::report
