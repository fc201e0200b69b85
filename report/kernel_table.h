// The kernels of a step after fusion, heaviest first: `napkin report
// --device` lists where the predicted time goes, so a user (and the next
// fusion) sees which kernels to remove. Kernels alike across layers (same
// phase, class, pattern and YAML lines) are summed into one row: GPT-2's
// twelve "cast > add > gelu > cast" groups at line 48 are one row of 12.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "analysis/step_time.h"
#include "ir/graph.h"

namespace napkin::report {

struct KernelKind {
  std::string phase;  // "forward", "backward", "optimizer"
  std::string kind;   // analysis::kernel_class_name
  std::string what;   // a group's pattern (fusion_report.h) or the op's name
  std::string lines;  // "models/gpt.yaml:48"
  int count = 0;      // kernels summed
  double flops = 0, bytes = 0;
  double seconds = 0;           // predicted (time model, launch included)
  double roofline_seconds = 0;  // each at peak FLOP/s or main-memory bandwidth, no launch
  int compute_bound = 0;        // of `count`, those whose compute term is the larger
};

// Every kind of kernel in `t`, most predicted seconds first.
std::vector<KernelKind> kernel_kinds(const ir::Graph& g, const analysis::StepTime& t);

// The `top` heaviest kinds as a text section, with the share of the step the rest take.
std::string kernel_table_text(const std::vector<KernelKind>& kinds, double step_seconds, size_t top = 15);
nlohmann::json kernel_table_json(const std::vector<KernelKind>& kinds);

}  // namespace napkin::report
