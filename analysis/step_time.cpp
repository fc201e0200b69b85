#include "analysis/step_time.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>

namespace napkin::analysis {

double group_bytes(const ir::Graph& g, const ir::FusionGroup& group) {
  double bytes = 0;
  for (ir::ValueId in : group.inputs) bytes += ir::distinct_bytes(g, in);
  for (ir::ValueId out : group.outputs) bytes += static_cast<double>(g.value(out).type.bytes());
  return bytes;
}

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

  const double loop_rate = device.loop_flops > 0 ? device.loop_flops : 0;
  const bool cache_modelled = device.cache_bytes > 0 && device.cache_bandwidth_bytes_per_s > 0;

  // The kernels and the buffers each reads and writes (by storage value).
  struct Access {
    std::vector<std::pair<ir::ValueId, double>> reads;  // storage, distinct bytes read
    std::vector<ir::ValueId> writes;
    double bytes_read = 0, bytes_written = 0;
    bool contraction = false;  // runs at the matmul peak
    bool gemm = false;         // ... with no exp's on the side (attention's and the classifier's have them)
  };
  std::vector<Access> accesses;
  for (const StepKernel& step : step_kernels(g, groups)) {
    const ir::Node& n = g.node(step.nodes.back());
    KernelTime k{.node = n.id, .group = step.group, .batch = step.batch, .phase = step.phase,
                 .kind = kernel_class(g, step), .lines = yaml_lines(g, step.nodes), .scope = n.scope};
    Access a;
    const bool attention = step.kind == KernelKind::Attention || step.kind == KernelKind::CachedAttention;
    const bool classifier = step.kind == KernelKind::Classifier;
    a.gemm = step.kind == KernelKind::Gemm || step.kind == KernelKind::ContractionLoops;
    a.contraction = a.gemm || attention || classifier;
    // Its product's node: a GEMM epilogue group's first member is its contraction.
    const ir::Node& head = g.node(step.nodes.front());
    k.compute_dtype = rows.at(a.contraction ? head.id : n.id)->compute_dtype;
    if (a.contraction) {
      // Fused attention's products are GEMM tiles whose narrowest dim is
      // head_dim; the classifier's, GEMMs over rows x chunk x d.
      k.narrowest = attention    ? ir::attention_dims(g, head).head_dim
                    : classifier ? ir::classifier_dims(g, head).d
                                 : ir::contraction_dims(g, head).narrowest();
      k.rate = matmul_peak(device, k.compute_dtype, allow_tf32) * gemm_efficiency(device, k.compute_dtype, k.narrowest);
    } else {
      k.rate = loop_rate > 0 ? loop_rate : vector_peak(device, k.compute_dtype);
    }
    auto add_reads = [&](const std::vector<ir::ValueId>& values) {
      for (ir::ValueId v : values) a.reads.emplace_back(g.value(v).storage, ir::distinct_bytes(g, v));
    };
    for (ir::NodeId id : step.nodes) {  // a batch's kernel does the work of every group in it
      k.flops += rows.at(id)->cost.flops + rows.at(id)->cost.recompute_flops;  // the kernel runs both
      k.transcendentals += ir::transcendentals(g, g.node(id));
    }
    if (step.group >= 0) {
      for (int member : step.batch >= 0 ? groups.batches[step.batch].groups : std::vector<int>{step.group}) {
        const ir::FusionGroup& fg = groups.groups[member];
        add_reads(fg.inputs);
        for (ir::ValueId v : fg.outputs) {
          a.writes.push_back(g.value(v).storage);
          a.bytes_written += static_cast<double>(g.value(v).type.bytes());
        }
      }
      for (const auto& [storage, bytes] : a.reads) a.bytes_read += bytes;
    } else {
      const OpRow& row = *rows.at(n.id);
      add_reads(n.inputs);
      for (ir::ValueId v : n.outputs) a.writes.push_back(g.value(v).storage);
      a.bytes_read = row.cost.bytes_read;
      a.bytes_written = row.cost.bytes_written;
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
      if (!a.gemm && device.transcendental_rate > 0) k.compute_seconds += k.transcendentals / device.transcendental_rate;
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
