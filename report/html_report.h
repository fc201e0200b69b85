// The report as one self-contained HTML page (`napkin report MODEL --html
// FILE`): no network, no external scripts or fonts, charts as inline SVG
// (report/svg_chart.h). What it shows, per model (two side by side with
// --compare):
//  - the summary a user reads first: parameters, FLOPs by phase, predicted
//    step time and MFU on the device, peak memory and the arena, the napkin
//    math (6·N·D against the step's FLOPs, bytes per parameter);
//  - a memory timeline over the schedule, stacked by category, the phase
//    boundaries and the peak marked, what is live at the peak in a table
//    with each buffer's YAML line;
//  - a roofline on the device: each kernel after fusion at its arithmetic
//    intensity (FLOPs / bytes) and predicted FLOP/s, sized by its time,
//    coloured by class, under the bandwidth and compute roofs; the kernels
//    with the most predicted time in a table with their YAML lines;
//  - the fusion groups and the AMP audit as collapsible tables.
// The JSON report (render_report_json) is embedded as
// <script type="application/json" class="napkin-report"> (with '<', '>',
// '&', U+2028 and U+2029 as \u escapes, so no string in it can end the
// script or open a comment), so every figure on
// the page can be checked against it; each mark carries its numbers as
// data-* attributes (the timeline's data-peak, each kernel's data-flops,
// data-bytes, data-intensity). docs/report.md#html says what each chart's
// numbers are.
#pragma once

#include <string>
#include <vector>

#include "analysis/cost.h"
#include "analysis/devices.h"
#include "analysis/memory.h"
#include "ir/graph.h"

namespace napkin::report {

// One model's report as the page shows it.
struct HtmlReportInput {
  const ir::Graph* graph = nullptr;
  const analysis::StepCost* cost = nullptr;
  const analysis::MemoryReport* memory = nullptr;
  std::string json;   // render_report_json's text
  std::string label;  // "models/gpt.yaml" or "models/gpt.yaml --dims d=64"
};

// The page for one model, or several side by side; `device` is the roofline's.
std::string render_report_html(const std::vector<HtmlReportInput>& models, const analysis::Device& device);

}  // namespace napkin::report
