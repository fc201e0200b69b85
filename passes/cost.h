// The cost model behind `napkin report`: FLOPs and bytes per op (from the op
// table's cost rules), the parameter count and memory, the tokens a step
// processes, and the split of forward FLOPs against the 2·tokens·params rule.
//
// Terms:
//  - a parameter "does matmul work" if some contraction reads it (directly or
//    through a view); embedding tables, biases and norm gains do not.
//  - attention-like matmuls are contractions where no operand is a parameter.
//  - forward - 2·T·P = (param matmuls - 2·T·P_mm) + activation matmuls
//                      + non-matmul ops - 2·T·P_other   (exactly).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "passes/devices.h"

namespace napkin::passes {

struct OpRow {
  ir::NodeId node = ir::kNoNode;
  ir::OpCost cost;
  std::string category;  // "param-matmul", "activation-matmul", "elementwise", "view", ...
  bool copies = false;   // a Copy the einops lowering needed (a rearrange that is not a view)
  ir::DType compute_dtype = ir::DType::F32;  // the dtype whose device peak bounds the op
  bool no_peak = false;  // the device has no peak for compute_dtype: no time is guessed
  // Filled when a device is given: roofline time max(flops/peak, bytes/bandwidth).
  double seconds = 0;
  bool compute_bound = false;
};

struct ForwardCost {
  std::vector<OpRow> rows;  // schedule order
  double flops = 0, bytes_read = 0, bytes_written = 0;

  int64_t params = 0;
  std::map<ir::DType, int64_t> param_bytes;  // per dtype
  int64_t params_in_matmuls = 0;             // P_mm
  std::vector<std::string> params_without_matmul;

  double tokens = 0;
  std::string tokens_source;  // how `tokens` was derived

  double param_matmul_flops = 0;
  double activation_matmul_flops = 0;
  double other_flops = 0;

  const Device* device = nullptr;
  double seconds = 0;  // sum of per-op roofline times (ops without a peak excluded)
  int ops_without_peak = 0;
};

// `device` may be null (no roofline columns).
ForwardCost analyze_forward(const ir::Graph& g, const Device* device);

}  // namespace napkin::passes
