#include "analysis/step_time.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>

namespace napkin::analysis {

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
    case ir::OpClass::Attention: return KernelClass::Attention;
    case ir::OpClass::Classifier: return KernelClass::Matmul;
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

}  // namespace

// "models/gpt.yaml:39,40" from the nodes' source locations.
std::string yaml_lines(const ir::Graph& g, const std::vector<ir::NodeId>& nodes) {
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

StepTime predict_step_time(const ir::Graph& g, const StepCost& cost, const Device& device, bool allow_tf32) {
  StepTime t;
  t.device = &device;
  std::map<ir::NodeId, const OpRow*> rows;
  for (const OpRow& row : cost.rows) rows[row.node] = &row;
  const ir::FusionGroups groups = ir::fusion_groups(g);
  const std::vector<ir::NodeId>& schedule = g.schedule();

  const double loop_rate = device.loop_flops > 0 ? device.loop_flops : 0;
  const bool cache_modelled = device.cache_bytes > 0 && device.cache_bandwidth_bytes_per_s > 0;

  // The kernels and the buffers each reads and writes (by storage value).
  struct Access {
    std::vector<std::pair<ir::ValueId, double>> reads;  // storage, distinct bytes read
    std::vector<ir::ValueId> writes;
    double bytes_read = 0, bytes_written = 0;
    bool contraction = false;  // runs at the matmul peak
    bool attention = false;    // ... with exp's on the side
    bool classifier = false;   // ... likewise
    ir::NodeId head = ir::kNoNode;  // a GEMM epilogue group's contraction
  };
  std::vector<Access> accesses;
  for (int p = 0; p < static_cast<int>(schedule.size()); ++p) {
    const ir::Node& n = g.node(schedule[p]);
    int gid = groups.group_at[p];
    if (gid < 0 && ir::op_info(n.op).op_class == ir::OpClass::View) continue;  // free: no kernel
    if (gid >= 0 && groups.groups[gid].nodes.back() != n.id) continue;          // a group is its last member
    const int batch = gid >= 0 ? groups.batch_of[gid] : -1;
    if (batch >= 0 && groups.batches[batch].groups.back() != gid) continue;     // a batch is its last group
    KernelTime k;
    Access a;
    k.node = n.id;
    k.group = gid;
    k.batch = batch;
    k.phase = n.phase;
    const OpRow& row = *rows.at(n.id);
    k.compute_dtype = row.compute_dtype;
    k.scope = n.scope;
    auto add_reads = [&](const std::vector<ir::ValueId>& values) {
      for (ir::ValueId v : values) a.reads.emplace_back(g.value(v).storage, ir::distinct_bytes(g, v));
    };
    if (gid >= 0) {
      // A batch's kernel does the work of every group in it.
      const std::vector<int> members = batch >= 0 ? groups.batches[batch].groups : std::vector<int>{gid};
      std::vector<ir::NodeId> nodes;
      for (int member : members) {
        const ir::FusionGroup& fg = groups.groups[member];
        for (ir::NodeId id : fg.nodes) {
          k.flops += rows.at(id)->cost.flops;
          k.transcendentals += ir::transcendentals(g, g.node(id));
        }
        add_reads(fg.inputs);
        for (ir::ValueId v : fg.outputs) {
          a.writes.push_back(g.value(v).storage);
          a.bytes_written += static_cast<double>(g.value(v).type.bytes());
        }
        nodes.insert(nodes.end(), fg.nodes.begin(), fg.nodes.end());
      }
      for (const auto& [storage, bytes] : a.reads) a.bytes_read += bytes;
      k.kind = n.phase == ir::Phase::Optimizer ? KernelClass::Optimizer : KernelClass::Elementwise;
      k.lines = yaml_lines(g, nodes);
      if (const ir::NodeId head = groups.groups[gid].contraction; head != ir::kNoNode) {
        // A GEMM with its epilogue: at the matmul rate of the contraction's dtype.
        k.kind = KernelClass::Matmul;
        k.compute_dtype = rows.at(head)->compute_dtype;
        a.contraction = true;
        a.head = head;
      }
    } else {
      k.flops = row.cost.flops + row.cost.recompute_flops;  // the kernel runs both
      k.transcendentals = ir::transcendentals(g, n);
      add_reads(n.inputs);
      for (ir::ValueId v : n.outputs) a.writes.push_back(g.value(v).storage);
      a.bytes_read = row.cost.bytes_read;
      a.bytes_written = row.cost.bytes_written;
      k.kind = class_of_node(n, row);
      k.lines = yaml_lines(g, {n.id});
      a.attention = ir::op_info(n.op).op_class == ir::OpClass::Attention;
      a.classifier = ir::op_info(n.op).op_class == ir::OpClass::Classifier;
      a.contraction = ir::op_info(n.op).op_class == ir::OpClass::Contraction || a.attention || a.classifier;
    }
    k.bytes = a.bytes_read + a.bytes_written;
    t.kernels.push_back(std::move(k));
    accesses.push_back(std::move(a));
  }

  // Where each input comes from: the cache when fewer than cache_bytes were
  // moved since its buffer was last touched (an LRU reuse distance, counted
  // in bytes moved), else main memory. A buffer first touched in the step
  // was last touched by the step before (the schedule repeats); data inputs,
  // which the runtime fills before the step, at its start.
  std::map<ir::ValueId, double> last_touch;  // bytes moved when the buffer was last touched
  double moved = 0;
  auto touch_all = [&](const Access& a, double at) {
    for (const auto& [storage, bytes] : a.reads) last_touch[storage] = at;
    for (ir::ValueId storage : a.writes) last_touch[storage] = at;
  };
  for (size_t i = 0; i < accesses.size(); ++i) touch_all(accesses[i], moved += t.kernels[i].bytes);
  const double step_bytes = moved;
  const std::map<ir::ValueId, double> previous_step = std::move(last_touch);
  last_touch.clear();  // a moved-from map is valid but unspecified
  moved = 0;

  for (size_t i = 0; i < t.kernels.size(); ++i) {
    KernelTime& k = t.kernels[i];
    const Access& a = accesses[i];
    if (a.contraction) {
      // Fused attention's products are GEMM tiles whose narrowest dim is
      // head_dim; the classifier's, GEMMs over rows x chunk x d.
      k.narrowest = a.attention    ? ir::attention_dims(g, g.node(k.node)).head_dim
                    : a.classifier ? ir::classifier_dims(g, g.node(k.node)).d
                                   : ir::contraction_dims(g, g.node(a.head != ir::kNoNode ? a.head : k.node)).narrowest();
      k.rate = matmul_peak(device, k.compute_dtype, allow_tf32) * gemm_efficiency(device, k.compute_dtype, k.narrowest);
    } else {
      k.rate = loop_rate > 0 ? loop_rate : vector_peak(device, k.compute_dtype);
    }
    double memory = 0;
    if (cache_modelled) {
      double cached = 0, counted = 0;
      for (const auto& [storage, bytes] : a.reads) {
        double distance = moved;  // a data input: filled before the step
        if (auto it = last_touch.find(storage); it != last_touch.end()) distance = moved - it->second;
        else if (g.value(storage).kind == ir::ValueKind::Input) distance = moved;
        else if (auto prev = previous_step.find(storage); prev != previous_step.end())
          distance = moved + step_bytes - prev->second;
        counted += bytes;
        if (distance + bytes <= device.cache_bytes) cached += bytes;  // it and what moved since fit
      }
      double cached_share = counted > 0 ? cached / counted : 0;
      memory = a.bytes_read * (cached_share / device.cache_bandwidth_bytes_per_s +
                               (1 - cached_share) / device.bandwidth_bytes_per_s);
      memory += a.bytes_written / (k.bytes <= device.cache_bytes ? device.cache_bandwidth_bytes_per_s
                                                                  : device.bandwidth_bytes_per_s);
    } else {
      memory = k.bytes / device.bandwidth_bytes_per_s;
    }
    k.bandwidth = memory > 0 ? k.bytes / memory : device.bandwidth_bytes_per_s;
    touch_all(a, moved += k.bytes);
    if (k.flops > 0 && k.rate <= 0) {
      // No peak for the dtype (an fp8 matmul on an A100): say so, guess nothing.
      k.no_peak = true;
      ++t.kernels_without_peak;
    } else {
      k.compute_seconds = k.flops > 0 ? k.flops / k.rate : 0;
      if ((!a.contraction || a.attention || a.classifier) && device.transcendental_rate > 0) k.compute_seconds += k.transcendentals / device.transcendental_rate;
      k.memory_seconds = memory;
      k.seconds = std::max(k.compute_seconds, k.memory_seconds) + device.launch_seconds;
      const double peak_rate = a.contraction ? matmul_peak(device, k.compute_dtype, allow_tf32) : vector_peak(device, k.compute_dtype);
      k.roofline_seconds = std::max(peak_rate > 0 ? k.flops / peak_rate : 0.0, k.bytes / device.bandwidth_bytes_per_s);
      t.roofline_seconds += k.roofline_seconds;
      t.seconds += k.seconds;
      t.launch_seconds += device.launch_seconds;
      t.class_seconds[static_cast<int>(k.kind)] += k.seconds;
    }
  }
  double peak = matmul_peak(device, cost.matmul_dtype, allow_tf32);
  t.mfu = peak > 0 && t.seconds > 0 ? cost.total.flops / (t.seconds * peak) : 0;
  t.roofline_mfu = peak > 0 && t.roofline_seconds > 0 ? cost.total.flops / (t.roofline_seconds * peak) : 0;
  return t;
}

}  // namespace napkin::analysis
