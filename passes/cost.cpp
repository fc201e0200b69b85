#include "passes/cost.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>

namespace napkin::passes {

namespace {

bool reads_param(const ir::Graph& g, ir::ValueId v) {
  return g.value(g.value(v).storage).kind == ir::ValueKind::Param;
}

std::string category_of(const ir::Graph& g, const ir::Node& n) {
  const ir::OpInfo& info = ir::op_info(n.op);
  if (info.op_class == ir::OpClass::Contraction) {
    bool param = std::any_of(n.inputs.begin(), n.inputs.end(), [&](ir::ValueId v) { return reads_param(g, v); });
    return param ? "param-matmul" : "activation-matmul";
  }
  return std::string(ir::op_class_name(info.op_class));
}

// Tokens per step: the config's tokens_per_step, else the ids of the first
// integer input (token ids), else the leading axis of the first input (examples).
void derive_tokens(const ir::Graph& g, ForwardCost& c) {
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

ForwardCost analyze_forward(const ir::Graph& g, const Device* device) {
  ForwardCost c;
  c.device = device;
  std::set<ir::ValueId> matmul_params;
  for (ir::NodeId id : g.schedule()) {
    const ir::Node& n = g.node(id);
    const ir::OpInfo& info = ir::op_info(n.op);
    OpRow row;
    row.node = id;
    row.cost = info.cost(g, n);
    row.category = category_of(g, n);
    row.copies = n.op == ir::Op::Copy;
    if (info.op_class == ir::OpClass::Contraction)
      for (ir::ValueId v : n.inputs)
        if (reads_param(g, v)) matmul_params.insert(g.value(v).storage);
    c.flops += row.cost.flops;
    c.bytes_read += row.cost.bytes_read;
    c.bytes_written += row.cost.bytes_written;
    if (row.category == "param-matmul") c.param_matmul_flops += row.cost.flops;
    else if (row.category == "activation-matmul") c.activation_matmul_flops += row.cost.flops;
    else c.other_flops += row.cost.flops;
    if (device) {
      ir::DType dt = row.compute_dtype = compute_dtype(g, n);
      double peak = info.op_class == ir::OpClass::Contraction ? matmul_peak(*device, dt) : vector_peak(*device, dt);
      if (peak <= 0 && row.cost.flops > 0) {
        // An unsupported dtype is not a zero-time op: say so instead of guessing.
        row.no_peak = true;
        ++c.ops_without_peak;
      } else {
        double compute = row.cost.flops > 0 ? row.cost.flops / peak : 0;
        double memory = (row.cost.bytes_read + row.cost.bytes_written) / device->bandwidth_bytes_per_s;
        row.seconds = std::max(compute, memory);
        row.compute_bound = compute > memory;
        c.seconds += row.seconds;
      }
    }
    c.rows.push_back(row);
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

}  // namespace napkin::passes
