#include "analysis/cost.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>

namespace napkin::analysis {

namespace {

// The parameter a contraction operand reads, or kNoValue: the parameter itself,
// a view of it, or a copy in another dtype the precision policy made
// (passes/mixed_precision.h: a cast; under fp8 a quantize-dequantize chain of
// casts and products or quotients with a scalar scale).
ir::ValueId param_read(const ir::Graph& g, ir::ValueId v) {
  for (;;) {
    ir::ValueId storage = g.value(v).storage;
    if (g.value(storage).kind == ir::ValueKind::Param) return storage;
    ir::NodeId p = g.value(storage).producer;
    if (p == ir::kNoNode) return ir::kNoValue;
    const ir::Node& n = g.node(p);
    if (n.op == ir::Op::Cast) {
      v = n.in(0);
    } else if ((n.op == ir::Op::Mul || n.op == ir::Op::Div) && g.value(n.in(1)).type.rank() == 0) {
      v = n.in(0);
    } else {
      return ir::kNoValue;
    }
  }
}

bool reads_param(const ir::Graph& g, ir::ValueId v) { return param_read(g, v) != ir::kNoValue; }

bool is_contraction(const ir::Node& n) { return ir::op_info(n.op).op_class == ir::OpClass::Contraction; }

bool reads_any_param(const ir::Graph& g, const ir::Node& n) {
  return std::any_of(n.inputs.begin(), n.inputs.end(), [&](ir::ValueId v) { return reads_param(g, v); });
}

// Tokens per step: the config's tokens_per_step, else the ids of the first
// integer input (token ids), else the leading axis of the first input (examples).
void derive_tokens(const ir::Graph& g, StepCost& c) {
  if (g.config.train.tokens_per_step > 0) {
    c.tokens = static_cast<double>(g.config.train.tokens_per_step);
    c.tokens_source = "train.tokens_per_step";
    return;
  }
  for (ir::ValueId v : g.inputs)
    if (ir::is_integer(g.value(v).type.dtype)) {
      c.tokens = static_cast<double>(g.value(v).type.numel());
      c.tokens_source = fmt::format("elements of integer input '{}' {}", g.value(v).name, ir::to_string(g.value(v).type));
      return;
    }
  if (!g.inputs.empty() && g.value(g.inputs[0]).type.rank() > 0) {
    const ir::Value& v = g.value(g.inputs[0]);
    c.tokens = static_cast<double>(v.type.dims[0].size);
    c.tokens_source = fmt::format("leading axis of input '{}' {}", v.name, ir::to_string(v.type));
    return;
  }
  c.tokens = 1;
  c.tokens_source = g.inputs.empty() ? "no inputs: one example" : "the first input is a scalar: one example";
}

// The dtype an op computes in, for choosing the device peak.
ir::DType compute_dtype(const ir::Graph& g, const ir::Node& n) {
  for (ir::ValueId v : n.inputs)
    if (ir::is_floating(g.value(v).type.dtype)) return g.value(v).type.dtype;
  ir::DType out = g.value(n.out()).type.dtype;
  return ir::is_floating(out) ? out : ir::DType::F32;
}

}  // namespace

// A backward contraction is a weight matmul iff the forward one it came from
// is: dW = xᵀ·dy reads no parameter but is the weight matmul's backward.
MatmulRole matmul_role(const ir::Graph& g, const ir::Node& n) {
  if (!is_contraction(n)) return MatmulRole::None;
  const ir::Node* forward = &n;
  if (n.phase != ir::Phase::Forward && n.origin != ir::kNoNode && is_contraction(g.node(n.origin))) forward = &g.node(n.origin);
  return reads_any_param(g, *forward) ? MatmulRole::Weight : MatmulRole::Activation;
}

void PhaseCost::add(const OpRow& row) {
  flops += row.cost.flops;
  bytes_read += row.cost.bytes_read;
  bytes_written += row.cost.bytes_written;
  recompute_flops += row.cost.recompute_flops;
  if (row.matmul == MatmulRole::Weight) param_matmul_flops += row.cost.flops;
  else if (row.matmul == MatmulRole::Activation) activation_matmul_flops += row.cost.flops;
  else {
    // Fused attention's q·kᵀ and p·v are the activation matmuls it replaced,
    // the fused classifier's x·wᵀ and its gradients the weight matmuls; their
    // softmax is other work.
    activation_matmul_flops += row.cost.activation_matmul_flops;
    param_matmul_flops += row.cost.param_matmul_flops;
    other_flops += row.cost.flops - row.cost.activation_matmul_flops - row.cost.param_matmul_flops;
  }
  seconds += row.seconds;
  ++ops;
}

StepCost analyze_step(const ir::Graph& g, const Device* device) {
  StepCost c;
  c.device = device;
  std::set<ir::ValueId> matmul_params;
  std::map<ir::DType, double> contraction_flops;
  for (ir::NodeId id : g.schedule()) {
    const ir::Node& n = g.node(id);
    const ir::OpInfo& info = ir::op_info(n.op);
    OpRow row;
    row.node = id;
    row.phase = n.phase;
    row.cost = info.cost(g, n);
    row.matmul = matmul_role(g, n);
    row.category = row.matmul == MatmulRole::Weight       ? "param-matmul"
                   : row.matmul == MatmulRole::Activation ? "activation-matmul"
                                                          : std::string(ir::op_class_name(info.op_class));
    row.copies = n.op == ir::Op::Copy && n.phase == ir::Phase::Forward;
    row.compute_dtype = compute_dtype(g, n);
    const bool classifier = info.op_class == ir::OpClass::Classifier;
    if (is_contraction(n) || classifier) {
      contraction_flops[row.compute_dtype] += classifier ? row.cost.param_matmul_flops : row.cost.flops;
      if (n.phase == ir::Phase::Forward)
        for (ir::ValueId v : n.inputs)
          if (reads_param(g, v)) matmul_params.insert(param_read(g, v));
    }
    const bool matmul_like = is_contraction(n) || info.op_class == ir::OpClass::Attention || classifier;
    if (device) {
      double peak = matmul_like ? matmul_peak(*device, row.compute_dtype) : vector_peak(*device, row.compute_dtype);
      if (peak <= 0 && row.cost.flops > 0) {
        // An unsupported dtype is not a zero-time op: say so instead of guessing.
        row.no_peak = true;
        ++c.ops_without_peak;
      } else {
        double work = row.cost.flops + row.cost.recompute_flops;
        double compute = work > 0 ? work / peak : 0;
        double memory = (row.cost.bytes_read + row.cost.bytes_written) / device->bandwidth_bytes_per_s;
        row.seconds = std::max(compute, memory);
        row.compute_bound = compute > memory;
      }
    }
    c.phases[static_cast<int>(n.phase)].add(row);
    c.total.add(row);
    c.rows.push_back(row);
  }
  double most = -1;
  for (const auto& [dtype, flops] : contraction_flops)
    if (flops > most) {
      most = flops;
      c.matmul_dtype = dtype;
    }
  for (const ir::Param& p : g.params) {
    const ir::Value& v = g.value(p.value);
    c.params += v.type.numel();
    c.param_bytes[v.type.dtype] += v.type.bytes();
    if (matmul_params.count(p.value)) c.params_in_matmuls += v.type.numel();
    else c.params_without_matmul.push_back(v.name);
  }
  derive_tokens(g, c);
  return c;
}

}  // namespace napkin::analysis
