// Rendering of the resource report (`napkin report`) as text and as JSON.
// The numbers come from passes/cost and passes/memory; conventions are in docs/report.md.
#pragma once

#include <string>

#include "ir/graph.h"
#include "passes/cost.h"
#include "passes/memory.h"
#include "passes/recompute.h"

namespace napkin::passes {

struct ReportOptions {
  std::string model_path;  // as the user gave it, for the header
  bool show_ops = true;    // the per-op table
  const RecomputeReport* recompute = nullptr;  // what --memory-budget recomputed, when given
  // The same model compiled with precision fp32, for the AMP audit's comparison (null: left out).
  const ir::Graph* fp32_step = nullptr;
};

std::string render_report_text(const ir::Graph& g, const StepCost& cost, const MemoryReport& memory,
                               const ReportOptions& options);
std::string render_report_json(const ir::Graph& g, const StepCost& cost, const MemoryReport& memory,
                               const ReportOptions& options);

// Human-readable quantities: "1.23 GFLOP", "2.00 MiB", "3.4 ms", "124,439,808".
std::string human_flops(double flops);
std::string human_bytes(double bytes);
std::string human_seconds(double seconds);
std::string with_commas(double n);

}  // namespace napkin::passes
