#include "passes/step_time.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>

namespace napkin::passes {

std::string_view kernel_class_name(KernelClass c) {
  switch (c) {
    case KernelClass::Matmul: return "matmul";
    case KernelClass::Attention: return "attention";
    case KernelClass::Elementwise: return "elementwise";
    case KernelClass::Normalization: return "normalization";
    case KernelClass::Loss: return "loss";
    case KernelClass::Optimizer: return "optimizer";
    case KernelClass::Copy: return "copy";
  }
  return "?";
}

double group_bytes(const ir::Graph& g, const ir::FusionGroup& group) {
  double bytes = 0;
  for (ir::ValueId in : group.inputs) bytes += ir::distinct_bytes(g, in);
  for (ir::ValueId out : group.outputs) bytes += static_cast<double>(g.value(out).type.bytes());
  return bytes;
}

namespace {

KernelClass class_of_node(const ir::Node& n, const OpRow& row) {
  if (n.phase == ir::Phase::Optimizer) return KernelClass::Optimizer;
  switch (ir::op_info(n.op).op_class) {
    case ir::OpClass::Contraction:
      return row.category == "param-matmul" ? KernelClass::Matmul : KernelClass::Attention;
    case ir::OpClass::Copy:
    case ir::OpClass::Gather: return KernelClass::Copy;
    case ir::OpClass::Loss: return KernelClass::Loss;
    case ir::OpClass::Normalization:
      if (n.op == ir::Op::Softmax || n.op == ir::Op::SoftmaxGrad) return KernelClass::Attention;
      if (n.op == ir::Op::CrossEntropyGrad) return KernelClass::Loss;
      return KernelClass::Normalization;
    case ir::OpClass::Source:
    case ir::OpClass::Elementwise:
    case ir::OpClass::Reduction:
    case ir::OpClass::View: return KernelClass::Elementwise;
  }
  return KernelClass::Elementwise;
}

// "models/gpt.yaml:39,40" from the nodes' source locations.
std::string lines_of(const ir::Graph& g, const std::vector<ir::NodeId>& nodes) {
  std::set<int> lines;
  const std::string* file = nullptr;
  for (ir::NodeId id : nodes) {
    const ir::Node& n = g.node(id);
    if (!n.loc.known()) continue;
    lines.insert(n.loc.line);
    file = n.loc.file.get();
  }
  if (!file) return "";
  return fmt::format("{}:{}", *file, fmt::join(lines, ","));
}

}  // namespace

StepTime predict_step_time(const ir::Graph& g, const StepCost& cost, const Device& device, bool allow_tf32) {
  StepTime t;
  t.device = &device;
  std::map<ir::NodeId, const OpRow*> rows;
  for (const OpRow& row : cost.rows) rows[row.node] = &row;
  const ir::FusionGroups groups = ir::fusion_groups(g);
  const std::vector<ir::NodeId>& schedule = g.schedule();

  auto bandwidth_for = [&](double bytes) {
    bool fits = device.cache_bytes > 0 && device.cache_bandwidth_bytes_per_s > 0 && bytes <= device.cache_bytes;
    return fits ? device.cache_bandwidth_bytes_per_s : device.bandwidth_bytes_per_s;
  };
  const double loop_rate = device.loop_flops > 0 ? device.loop_flops : 0;

  for (int p = 0; p < static_cast<int>(schedule.size()); ++p) {
    const ir::Node& n = g.node(schedule[p]);
    int gid = groups.group_at[p];
    if (gid < 0 && ir::op_info(n.op).op_class == ir::OpClass::View) continue;  // free: no kernel
    if (gid >= 0 && groups.groups[gid].nodes.back() != n.id) continue;          // a group is its last member
    KernelTime k;
    k.node = n.id;
    k.group = gid;
    k.phase = n.phase;
    const OpRow& row = *rows.at(n.id);
    k.compute_dtype = row.compute_dtype;
    k.scope = n.scope;
    bool contraction = false;
    if (gid >= 0) {
      const ir::FusionGroup& fg = groups.groups[gid];
      for (ir::NodeId id : fg.nodes) {
        k.flops += rows.at(id)->cost.flops;
        k.transcendentals += ir::transcendentals(g, g.node(id));
      }
      k.bytes = group_bytes(g, fg);
      k.kind = n.phase == ir::Phase::Optimizer ? KernelClass::Optimizer : KernelClass::Elementwise;
      k.lines = lines_of(g, fg.nodes);
    } else {
      k.flops = row.cost.flops;
      k.transcendentals = ir::transcendentals(g, n);
      k.bytes = row.cost.bytes_read + row.cost.bytes_written;
      k.kind = class_of_node(n, row);
      k.lines = lines_of(g, {n.id});
      contraction = ir::op_info(n.op).op_class == ir::OpClass::Contraction;
    }
    if (contraction) {
      k.narrowest = ir::contraction_dims(g, n).narrowest();
      k.rate = matmul_peak(device, k.compute_dtype, allow_tf32) * gemm_efficiency(device, k.compute_dtype, k.narrowest);
    } else {
      k.rate = loop_rate > 0 ? loop_rate : vector_peak(device, k.compute_dtype);
    }
    k.bandwidth = bandwidth_for(k.bytes);
    if (k.flops > 0 && k.rate <= 0) {
      // No peak for the dtype (an fp8 matmul on an A100): say so, guess nothing.
      k.no_peak = true;
      ++t.kernels_without_peak;
    } else {
      k.compute_seconds = k.flops > 0 ? k.flops / k.rate : 0;
      if (!contraction && device.transcendental_rate > 0) k.compute_seconds += k.transcendentals / device.transcendental_rate;
      k.memory_seconds = k.bytes / k.bandwidth;
      k.seconds = std::max(k.compute_seconds, k.memory_seconds) + device.launch_seconds;
      t.seconds += k.seconds;
      t.launch_seconds += device.launch_seconds;
      t.class_seconds[static_cast<int>(k.kind)] += k.seconds;
    }
    t.kernels.push_back(std::move(k));
  }
  double peak = matmul_peak(device, cost.matmul_dtype, allow_tf32);
  t.mfu = peak > 0 && t.seconds > 0 ? cost.total.flops / (t.seconds * peak) : 0;
  return t;
}

}  // namespace napkin::passes
