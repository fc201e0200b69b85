// The AMP audit of `napkin report`: what the precision policy did to a
// training step and what it bought, from the compiled graph alone (this file
// computes and renders; the rules are passes/mixed_precision.h's).
//
// Terms:
//  - inserted cast: a forward cast node with the `amp` attr (its reason);
//    backward casts are autodiff's gradients of those casts, counted apart;
//    the nodes of fp8 quantization (attr `amp` "fp8 scaling",
//    passes/fp8_scaling.h) are counted apart, not among the ops below.
//  - compute dtype of a node: the dtype of its floating operands (after the
//    pass they agree, casts aside); of a cast, its source dtype; of a node
//    without floating operands, its output dtype.
//  - rule of a forward node other than an inserted cast: amp_rule
//    (passes/mixed_precision.h); inserted casts are listed, not counted as ops; of a
//    backward node: "backward" (autodiff's, from its forward node's dtypes).
//  - accumulator dtype of a contraction: f32 when its operands are narrower
//    than f32 (the CPU GEMM and the interpreter accumulate wide), else the
//    operand dtype.
//  - versus fp32: the same model compiled with precision fp32 (the caller
//    supplies it), analyzed the same way: saved activations, the step's
//    peak, bytes read + written (analysis/cost, analysis/memory). Without it the
//    comparison is left out.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>

#include "analysis/cost.h"
#include "analysis/memory.h"
#include "ir/graph.h"

namespace napkin::report {

// The "AMP audit" section of the text report (one line under fp32). show_ops
// lists every forward op with its compute dtype and rule after the summary.
std::string render_amp_audit_text(const ir::Graph& g, const analysis::StepCost& cost, const analysis::MemoryReport& memory,
                                  const ir::Graph* fp32_step, bool show_ops);

// The same as the JSON object report["amp_audit"].
void add_amp_audit_json(nlohmann::json& report, const ir::Graph& g, const analysis::StepCost& cost, const analysis::MemoryReport& memory,
                        const ir::Graph* fp32_step);

}  // namespace napkin::report
