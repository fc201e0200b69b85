// What elementwise fusion (passes/fuse_elementwise.h) bought, for
// `napkin report`: kernels, bytes moved and the memory peak of the step
// before and after fusion, and the groups it formed. Computed from the fused
// graph alone; this file computes and renders, report.cpp calls it.
//
// Terms:
//  - kernel: a fused group (ir/fusion_group.h) or a non-view node outside
//    every group; "before" counts every non-view node as its own kernel,
//    except the constants the groups inline (the pass copies a constant into
//    each group reading it; before fusion those were fewer kernels, and they
//    move 4 or 8 bytes): they count neither before nor after.
//  - bytes moved: bytes read plus bytes written. Before: the op table's cost
//    rule of each non-view node (docs/report.md). After: the same for unfused
//    nodes; a fused kernel reads each of its inputs once (its distinct
//    elements: a broadcast axis is read once) and writes its outputs;
//    internal values are never moved.
//  - memory peak before: analysis/memory on the same schedule with the group
//    annotations removed (each node its own kernel, every value a buffer).
//  - GEMM epilogues: groups headed by a contraction (passes/fuse_gemm_epilogues.h),
//    counted by the parts of the form they use; a weight gradient's GEMM
//    storing its bias gradient (ir/gemm_epilogue.h GemmBiasGrad) counted
//    apart, with the bytes of B the sum no longer reads a second time.
//  - pattern of a group: "<optimizer> update" when it writes an update of a
//    parameter, "optimizer scalars" for the 0-d optimizer kernel, else its
//    members' op names in order (constants left out). Groups with the same
//    pattern are counted together.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ir/fusion_group.h"
#include "ir/graph.h"
#include "passes/pass.h"

namespace napkin::report {

struct FusionPattern {
  std::string name;
  int groups = 0;
  int ops = 0;      // non-constant members over all those groups
  int kernels = 0;  // the groups' kernels: fewer than groups where batches run several as one
};

struct FusionSummary {
  std::array<int, ir::kNumPhases> kernels_before{}, kernels_after{};  // indexed by ir::Phase
  double bytes_before = 0, bytes_after = 0;
  int64_t peak_before = 0, peak_after = 0;
  int groups = 0, fused_ops = 0, folded_constants = 0;
  std::vector<FusionPattern> patterns;  // most groups first
  std::vector<int> largest;             // group ids, most ops first (at most 3)
  // Composite ops that are one kernel by construction: "softmax" -> count.
  std::vector<std::pair<std::string, int>> composite;
  // GEMM epilogue groups (ir/gemm_epilogue.h): how many, how many add a
  // residual, a bias, store D narrower than f32, apply a gelu or its
  // gradient, and the bytes of the f32 sums they never store.
  struct Epilogues {
    int gemms = 0, residual = 0, bias = 0, narrowed = 0, gelu = 0, gelu_grad = 0;
    double sums_bytes = 0;
    int bias_grads = 0;           // weight gradients' GEMMs storing a bias gradient
    double bias_grad_bytes = 0;   // the bytes of their B, read once instead of twice
  } epilogues;
};

// Where the cast passes put the precision policy's casts, against the same
// step with the casts where the policy put them: rewrites by rule, and the
// kernels and bytes moved (after fusion) of both.
struct CastSummary {
  passes::CastPlacement rewrites;
  int kernels_policy = 0, kernels_placed = 0;
  double bytes_policy = 0, bytes_placed = 0;
};

// The pattern of every fusion group of `groups` (g's), by group id (see
// "pattern of a group" above).
std::vector<std::string> group_patterns(const ir::Graph& g, const ir::FusionGroups& groups);

FusionSummary summarize_fusion(const ir::Graph& g);
// `policy_casts_step`: g's step with sink_casts and matmul_epilogues off.
CastSummary summarize_casts(const FusionSummary& placed, const passes::CastPlacement& rewrites,
                            const ir::Graph& policy_casts_step);
// `casts`: printed when given and some rule fired.
std::string fusion_section_text(const ir::Graph& g, const FusionSummary& s, const CastSummary* casts = nullptr);
nlohmann::json fusion_json(const ir::Graph& g, const FusionSummary& s, const CastSummary* casts = nullptr);

}  // namespace napkin::report
