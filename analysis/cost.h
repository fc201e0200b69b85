// The cost model behind `napkin report`: FLOPs and bytes per op (from the op
// table's cost rules), per phase of the step (forward, backward, optimizer),
// the parameter count and memory, the tokens a step processes, and the split
// of FLOPs against the 2·tokens·params (forward) and 6·tokens·params (step) rules.
//
// Terms:
//  - a parameter "does matmul work" if some forward contraction reads it
//    (directly, through a view, or through the low-precision copy a mixed
//    precision policy makes of it); embedding tables, biases and norm gains do not.
//  - a weight matmul ("param-matmul") is a forward contraction that reads a
//    parameter, or a backward contraction autodiff made from one (its origin);
//    every other contraction is an activation matmul (attention scores, mixing).
//  - forward - 2·T·P = (forward weight matmuls - 2·T·P_mm) + activation matmuls
//                      + non-matmul ops - 2·T·P_other   (exactly), and for the
//    whole step, with 6 and 4·T·P_mm for the backward weight matmuls, plus the
//    optimizer (see docs/report.md).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "analysis/devices.h"
#include "ir/graph.h"

namespace napkin::analysis {

// Which matmul a contraction is (Terms above); None for every other op.
enum class MatmulRole : uint8_t { None, Weight, Activation };
MatmulRole matmul_role(const ir::Graph& g, const ir::Node& n);

struct OpRow {
  ir::NodeId node = ir::kNoNode;
  ir::Phase phase = ir::Phase::Forward;
  ir::OpCost cost;
  MatmulRole matmul = MatmulRole::None;
  // How the report names its work: "param-matmul", "activation-matmul" (by
  // `matmul`), else its op class's name ("elementwise", "view", ...).
  std::string category;
  bool copies = false;   // a Copy the einops lowering needed (a rearrange that is not a view)
  ir::DType compute_dtype = ir::DType::F32;  // the dtype whose device peak bounds the op
  bool no_peak = false;  // the device has no peak for compute_dtype: no time is guessed
  // Filled when a device is given: roofline time max(flops/peak, bytes/bandwidth).
  double seconds = 0;
  bool compute_bound = false;
};

// The work of one phase (or of the whole step).
struct PhaseCost {
  double flops = 0, bytes_read = 0, bytes_written = 0;
  double param_matmul_flops = 0;
  double activation_matmul_flops = 0;
  double other_flops = 0;
  // Recomputed FLOPs (fused attention's backward), not in `flops`: the
  // kernels run them, MFU and the 6·N·D comparisons do not count them.
  double recompute_flops = 0;
  double seconds = 0;  // sum of per-op roofline times (ops without a peak excluded)
  int ops = 0;
  void add(const OpRow& row);
};

struct StepCost {
  std::vector<OpRow> rows;  // schedule order
  PhaseCost phases[ir::kNumPhases];  // indexed by ir::Phase
  PhaseCost total;          // the whole step
  const PhaseCost& phase(ir::Phase p) const { return phases[static_cast<int>(p)]; }
  bool has_backward() const { return phase(ir::Phase::Backward).ops > 0; }

  int64_t params = 0;
  std::map<ir::DType, int64_t> param_bytes;  // per dtype
  int64_t params_in_matmuls = 0;             // P_mm
  std::vector<std::string> params_without_matmul;

  double tokens = 0;
  std::string tokens_source;  // how `tokens` was derived

  const Device* device = nullptr;
  int ops_without_peak = 0;
  // The dtype doing most of the contraction FLOPs: its matmul peak is the
  // denominator of MFU.
  ir::DType matmul_dtype = ir::DType::F32;
};

// `device` may be null (no roofline columns). Works on forward-only graphs
// (backward and optimizer phases are then empty) and on training graphs.
StepCost analyze_step(const ir::Graph& g, const Device* device);

}  // namespace napkin::analysis
