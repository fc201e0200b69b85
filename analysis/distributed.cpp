#include "analysis/distributed.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <set>

#include <fmt/format.h>

#include "analysis/moe.h"
#include "ir/fusion_group.h"

namespace napkin::analysis {

namespace {

std::string lower(std::string_view s) {
  std::string r(s);
  for (char& c : r) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return r;
}

// The latency figure: not measured here; the order of NCCL's small-message
// latency per ring step on such links, for the model's fixed cost per step.
constexpr const char* kLatencyNote = "; latency per ring step: a modelling figure of NCCL's order, not a measurement";

// One rank's memory with the buffers `sharded` says divided by `ranks`.
RankMemory sharded_memory(const MemoryReport& memory, int ranks, const std::function<bool(const MemoryBuffer&)>& sharded) {
  RankMemory m;
  const double shard = 1.0 / ranks;
  const size_t positions = std::max<size_t>(memory.live_bytes.size(), 1);
  std::vector<double> delta(positions + 1, 0.0);
  for (const MemoryBuffer& b : memory.buffers) {
    const double bytes = static_cast<double>(b.bytes) * (sharded(b) ? shard : 1.0);
    if (b.category == MemoryCategory::Parameters) m.params += bytes;
    if (b.category == MemoryCategory::Gradients) m.grads += bytes;
    if (b.category == MemoryCategory::OptimizerState) m.optimizer_state += bytes;
    if (b.first > b.last) continue;  // as analyze_memory sweeps them
    delta[static_cast<size_t>(b.first)] += bytes;
    delta[std::min(static_cast<size_t>(b.last) + 1, positions)] -= bytes;
  }
  double live = 0;
  for (size_t p = 0; p < positions; ++p) m.peak = std::max(m.peak, live += delta[p]);
  return m;
}

}  // namespace

const std::vector<Interconnect>& builtin_interconnects() {
  static const std::vector<Interconnect> table = {
      {"nvlink4", "NVLink 4 (H100 SXM5, 18 links, within a node)", 450e9, 3e-6,
       std::string("NVIDIA H100 datasheet (SXM): NVLink 900 GB/s per GPU, both directions together: 450 GB/s each "
                   "way") + kLatencyNote},
      {"ib-ndr", "InfiniBand NDR, one 400 Gb/s port per GPU (across nodes)", 50e9, 5e-6,
       std::string("NVIDIA ConnectX-7 / Quantum-2 datasheets: 400 Gb/s per port, each way (one NIC per GPU, as in "
                   "DGX H100)") + kLatencyNote},
      {"pcie5", "PCIe 5.0 x16 (GPUs without NVLink)", 63e9, 4e-6,
       std::string("PCI-SIG PCIe 5.0: 32 GT/s x 16 lanes, 128b/130b encoding: 63 GB/s each way") + kLatencyNote},
      {"100gbe", "100 Gigabit Ethernet, one port per rank", 12.5e9, 30e-6,
       std::string("IEEE 802.3 100GBASE: 100 Gb/s each way = 12.5 GB/s") + kLatencyNote},
      // The CPU trainers' link on one host, measured here so that the
      // prediction can be checked against a run (docs/distributed.md).
      {"shm", "shared memory between the processes of one host (Open MPI's vader transport)", 7e9, 10e-6,
       "measured on vm (a 2-core VM), 2026-11-26, by bench/allreduce_mpi.cpp with Open MPI 4.1.4 on 2 ranks: a 16 MiB "
       "f32 MPI_Allreduce in 2.3-2.4 ms, 7.0-7.3 GB/s bus bandwidth (4 MiB: 7.8; 64 MiB, past the cache: 2.4); "
       "64 KiB in 20 us, about 10 us a ring step"},
  };
  return table;
}

const Interconnect* find_interconnect(std::string_view name) {
  const std::string key = lower(name);
  for (const Interconnect& i : builtin_interconnects())
    if (i.name == key) return &i;
  return nullptr;
}

std::string known_interconnect_names() {
  std::vector<std::string> names;
  for (const Interconnect& i : builtin_interconnects()) names.push_back(i.name);
  std::sort(names.begin(), names.end());
  std::string r;
  for (const std::string& n : names) r += (r.empty() ? "" : ", ") + n;
  return r;
}

const char* zero_stage_name(int stage) {
  static const char* names[] = {"data parallel", "ZeRO-1", "ZeRO-2", "ZeRO-3"};
  return names[stage];
}

// An all-reduce is a reduce-scatter then an all-gather of the same size: twice the halves' bytes, steps and time,
// on one level or two.
double reduce_scatter_bytes(double bytes, int ranks) { return ranks <= 1 ? 0 : double(ranks - 1) / ranks * bytes; }
double all_reduce_bytes(double bytes, int ranks) { return 2 * reduce_scatter_bytes(bytes, ranks); }
double reduce_scatter_seconds(double bytes, int ranks, const Interconnect& link) {
  return ranks <= 1 ? 0 : reduce_scatter_bytes(bytes, ranks) / link.bytes_per_s + double(ranks - 1) * link.latency_s;
}
double all_reduce_seconds(double bytes, int ranks, const Interconnect& link) {
  return 2 * reduce_scatter_seconds(bytes, ranks, link);
}

Collective reduce_scatter(double bytes, const Topology& t) {
  Collective c;
  if (!t.two_level()) {
    c.bytes = reduce_scatter_bytes(bytes, t.ranks);
    c.seconds = reduce_scatter_seconds(bytes, t.ranks, *t.link);
    return c;
  }
  // Inside the node, then across the nodes on this rank's 1/L share.
  const int l = t.ranks_per_node, m = t.nodes();
  c.across_bytes = reduce_scatter_bytes(bytes / l, m);
  c.bytes = reduce_scatter_bytes(bytes, l) + c.across_bytes;
  c.seconds = reduce_scatter_seconds(bytes, l, *t.link) + reduce_scatter_seconds(bytes / l, m, *t.across);
  return c;
}

Collective all_reduce(double bytes, const Topology& t) {
  Collective c = reduce_scatter(bytes, t);
  c.bytes *= 2, c.across_bytes *= 2, c.seconds *= 2;
  return c;
}

// A share of `bytes` to each other rank, one pairwise exchange a step; on two levels the node-mates' shares
// first, then the other nodes' (each node's at once).
Collective all_to_all(double bytes, const Topology& t) {
  Collective c;
  const int n = t.ranks;
  if (n <= 1) return c;
  const int l = t.two_level() ? t.ranks_per_node : n;
  const double inside = bytes * (l - 1) / n;
  c.seconds = l > 1 ? inside / t.link->bytes_per_s + (l - 1) * t.link->latency_s : 0;
  c.bytes = inside;
  if (t.two_level()) {
    c.across_bytes = bytes * (n - l) / n;
    c.bytes += c.across_bytes;
    c.seconds += c.across_bytes / t.across->bytes_per_s + (t.nodes() - 1) * t.across->latency_s;
  }
  return c;
}

DistributedStep predict_distributed(const ir::Graph& g, const StepTime& t, const MemoryReport& memory, double flops,
                                    double peak, const Topology& topology, int64_t micro_batches,
                                    double optimizer_flops) {
  DistributedStep d;
  d.micro_batches = micro_batches;
  const double earlier = static_cast<double>(micro_batches - 1);  // micro-batches before the last
  const int ranks = topology.ranks;
  d.topology = topology;
  d.ranks = ranks;
  d.link = topology.link;
  // One copy of each: the resident buffers (an update that could not be written in place has a buffer of its
  // own in its target's category, analysis/memory.h, which is not a second copy to communicate).
  for (const MemoryBuffer& b : memory.buffers) {
    const double bytes = static_cast<double>(b.bytes);
    if (b.category == MemoryCategory::Gradients) d.grad_bytes += bytes;
    if (b.update_of != ir::kNoValue) continue;
    if (b.category == MemoryCategory::Parameters) d.param_bytes += bytes;
    if (b.category == MemoryCategory::OptimizerState) d.state_bytes += bytes;
  }

  // Each kernel's end on the single-rank timeline, and the kernel of every node it runs.
  const std::vector<StepKernel> steps = step_kernels(g, ir::fusion_groups(g));  // t.kernels[i] is steps[i]'s
  std::map<ir::NodeId, size_t> kernel_of;
  std::vector<double> end(t.kernels.size());
  double clock = 0, forward = 0, backward = 0, optimizer = 0, backward_end = 0;
  for (size_t i = 0; i < t.kernels.size(); ++i) {
    const KernelTime& k = t.kernels[i];
    clock += k.seconds;
    end[i] = clock;
    (k.phase == ir::Phase::Forward ? forward : k.phase == ir::Phase::Backward ? backward : optimizer) += k.seconds;
    if (k.phase == ir::Phase::Backward) backward_end = clock;
    for (ir::NodeId id : steps[i].nodes) kernel_of[id] = i;
  }
  if (backward_end == 0) backward_end = forward;
  d.backward_seconds = backward;
  d.single_rank_seconds = t.seconds + earlier * (forward + backward);
  const double step_flops = flops + earlier * (flops - optimizer_flops);

  // The gradients `keep` takes, in the order the backward writes them, as buckets (time ready, bytes).
  auto buckets_of = [&](const std::function<bool(const MemoryBuffer&)>& keep) {
    std::vector<std::pair<double, double>> ready;  // (time, bytes)
    for (const MemoryBuffer& b : memory.buffers) {
      if (b.category != MemoryCategory::Gradients || !keep(b)) continue;
      auto k = b.producer == ir::kNoNode ? kernel_of.end() : kernel_of.find(b.producer);
      ready.emplace_back(k == kernel_of.end() ? backward_end : end[k->second], static_cast<double>(b.bytes));
    }
    std::stable_sort(ready.begin(), ready.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    std::vector<std::pair<double, double>> buckets;
    double filling = 0;
    for (const auto& [at, bytes] : ready) {
      filling += bytes;
      if (filling >= kBucketBytes) buckets.emplace_back(at, filling), filling = 0;
    }
    if (filling > 0) buckets.emplace_back(ready.back().first, filling);
    return buckets;
  };
  const std::vector<std::pair<double, double>> buckets = buckets_of([](const MemoryBuffer&) { return true; });
  d.buckets = static_cast<int>(buckets.size());

  // The link from `start`: each bucket's collective once its gradients are written, one at a time.
  auto stream = [&](const std::vector<std::pair<double, double>>& of, double start, bool whole, double* busy) {
    double f = start;
    for (const auto& [at, bytes] : of) {
      const double s = (whole ? all_reduce(bytes, topology) : reduce_scatter(bytes, topology)).seconds;
      f = std::max(f, at) + s;
      *busy += s;
    }
    return f;
  };

  const double backward_start = backward_end - backward;
  for (int stage = 0; stage < 4; ++stage) {
    ZeroStage& z = d.stages[stage];
    z.stage = stage;
    const double shard = 1.0 / ranks;
    const double opt = stage >= 1 ? optimizer * shard : optimizer;
    double busy = 0, exposed = 0;
    if (stage == 0) {
      const Collective grads = all_reduce(d.grad_bytes, topology);
      z.bytes_sent = grads.bytes, z.across_bytes = grads.across_bytes;
      exposed = std::max(0.0, stream(buckets, backward_start, true, &busy) - backward_end);
    } else {
      const Collective grads = reduce_scatter(d.grad_bytes, topology), params = reduce_scatter(d.param_bytes, topology);
      z.bytes_sent = grads.bytes + params.bytes, z.across_bytes = grads.across_bytes + params.across_bytes;
      const double gather = params.seconds;
      if (stage < 3) {
        exposed = std::max(0.0, stream(buckets, backward_start, false, &busy) - backward_end) + gather;  // gather: after the update
        busy += gather;
      } else {
        // Gathered before the forward and again before the backward of every micro-batch, hidden behind each
        // phase's compute where it fits; the gradients reduce-scattered once, in the last backward.
        z.bytes_sent += (2 * earlier + 1) * params.bytes, z.across_bytes += (2 * earlier + 1) * params.across_bytes;
        exposed = std::max(0.0, gather - forward);
        busy += 2 * gather;
        exposed += std::max(0.0, stream(buckets, backward_start + gather, false, &busy) - backward_end);
        exposed += earlier * (std::max(0.0, gather - forward) + std::max(0.0, gather - backward));
        busy += 2 * earlier * gather;
      }
    }
    z.comm_seconds = busy;
    z.exposed_seconds = std::min(exposed, busy);
    z.hidden_seconds = busy - z.exposed_seconds;
    if (z.hidden_seconds < 1e-9 * busy) z.hidden_seconds = 0;  // rounding of busy - exposed, not time
    z.step_seconds = d.single_rank_seconds - optimizer + opt + z.exposed_seconds;
    z.mfu = peak > 0 && z.step_seconds > 0 ? step_flops / (z.step_seconds * peak) : 0;

    const RankMemory m = rank_memory(memory, stage, ranks);
    z.params = m.params, z.grads = m.grads, z.optimizer_state = m.optimizer_state, z.peak = m.peak;
  }

  if (!g.moe_layers.empty()) {
    const MoeFigures moe = analyze_moe(g);
    ExpertParallel& e = d.expert_parallel.emplace();
    e.layers = static_cast<int>(moe.layers.size());
    for (const MoeLayerFigures& l : moe.layers) {
      if (l.experts % ranks != 0)
        e.why_not = fmt::format("{} experts do not divide over {} ranks", l.experts, ranks);
      else if (!l.dispatch_found)
        e.why_not = fmt::format("moe() layer {} has no [E, C, d] dispatch buffer in the step", l.scope);
      if (!e.why_not.empty()) break;
    }
    e.possible = e.why_not.empty();
    if (e.possible) {
      e.experts_per_rank = moe.layers[0].experts / ranks;
      // The expert parameters' buffers: theirs, their gradients' and their optimizer state's (and the updates of these).
      std::set<ir::ValueId> expert_buffers;
      double expert_elements = 0;
      for (ir::ValueId p : moe.expert_params) {
        expert_buffers.insert(p);
        expert_elements += static_cast<double>(g.value(p).type.numel());
        if (ir::ValueId grad = g.find_output("grad." + g.value(p).name); grad != ir::kNoValue)
          expert_buffers.insert(g.value(grad).storage);
      }
      for (const auto& [state, param] : g.state_param)
        if (std::find(moe.expert_params.begin(), moe.expert_params.end(), param) != moe.expert_params.end())
          expert_buffers.insert(state);
      auto expert = [&](const MemoryBuffer& b) { return expert_buffers.count(b.value) || expert_buffers.count(b.update_of); };

      ZeroStage& z = e.step;
      for (const MoeLayerFigures& l : moe.layers) {
        const Collective one = all_to_all(static_cast<double>(l.dispatch_bytes), topology);
        const double count = 4.0 * static_cast<double>(micro_batches);
        e.all_to_all_bytes += count * one.bytes;
        e.all_to_all_seconds += count * one.seconds;
        z.across_bytes += count * one.across_bytes;
        e.all_to_alls += 4 * micro_batches;
      }
      const std::vector<std::pair<double, double>> dense = buckets_of([&](const MemoryBuffer& b) { return !expert(b); });
      for (const auto& bucket : dense) e.dense_grad_bytes += bucket.second;
      const Collective grads = all_reduce(e.dense_grad_bytes, topology);
      double busy = 0;
      const double exposed = std::max(0.0, stream(dense, backward_start, true, &busy) - backward_end);
      z.bytes_sent = e.all_to_all_bytes + grads.bytes;
      z.across_bytes += grads.across_bytes;
      z.comm_seconds = e.all_to_all_seconds + busy;
      z.exposed_seconds = e.all_to_all_seconds + std::min(exposed, busy);
      z.hidden_seconds = z.comm_seconds - z.exposed_seconds;
      if (z.hidden_seconds < 1e-9 * z.comm_seconds) z.hidden_seconds = 0;
      const double params = static_cast<double>(g.param_count());
      const double updated = params > 0 ? (params - expert_elements + expert_elements / ranks) / params : 1;
      z.step_seconds = d.single_rank_seconds - optimizer + optimizer * updated + z.exposed_seconds;
      z.mfu = peak > 0 && z.step_seconds > 0 ? step_flops / (z.step_seconds * peak) : 0;
      const RankMemory m = sharded_memory(memory, ranks, expert);
      z.params = m.params, z.grads = m.grads, z.optimizer_state = m.optimizer_state, z.peak = m.peak;
    }
  }
  return d;
}


RankMemory rank_memory(const MemoryReport& memory, int stage, int ranks) {
  // Gradients are never divided: napkin's step writes each whole on every rank (docs/distributed.md, "Memory
  // per rank"), at every stage.
  return sharded_memory(memory, ranks, [stage](const MemoryBuffer& b) {
    return (b.category == MemoryCategory::OptimizerState && stage >= 1) ||
           (b.category == MemoryCategory::Parameters && stage >= 3);
  });
}

namespace {

// The --memory-budget that brings a rank's need under `limit` under `stage`, and that need; nullopt: none can.
std::optional<std::pair<int64_t, double>> fitting_budget(int stage, int ranks, double limit, double single_peak,
                                                         double need, const CompileAt& compile) {
  // Descent: the single-rank arena bound that leaves this rank's need at the limit, lowered by each try's excess.
  double budget = std::floor(limit + (single_peak - need));
  double met = 0, unmet = 0;  // the lowest budget met so far, the highest one recompute cannot meet
  for (int t = 0; t < kBudgetTries && budget >= 1; ++t) {
    const std::optional<CompiledMemory> c = compile(0, static_cast<int64_t>(budget));
    if (!c) {
      unmet = budget;
      break;
    }
    met = budget;
    const double rank_need = rank_memory(c->memory, stage, ranks).peak;
    if (rank_need <= limit) return std::pair{static_cast<int64_t>(budget), rank_need};
    budget = std::floor(budget - (rank_need - limit));
  }
  if (unmet == 0) return std::nullopt;  // the tries ran out
  // Below the smallest arena recompute reaches: bisect for it (a budget at or above the step's arena is met
  // without recompute) and try the rank's need there, where the greedy has recomputed the most.
  if (met == 0) met = std::max(2 * single_peak, unmet + 1);
  std::optional<CompiledMemory> smallest;
  for (int t = 0; t < kBisections && met - unmet > std::max(1.0, kBisectionPrecision * met); ++t) {
    const double mid = std::floor((met + unmet) / 2);
    if (std::optional<CompiledMemory> c = compile(0, static_cast<int64_t>(mid))) {
      const double rank_need = rank_memory(c->memory, stage, ranks).peak;
      if (rank_need <= limit) return std::pair{static_cast<int64_t>(mid), rank_need};
      met = mid;
    } else {
      unmet = mid;
    }
  }
  return std::nullopt;
}

}  // namespace

MemoryFit fit_memory(const MemoryReport& memory, double param_count, int ranks, double limit,
                     const CompileAt& compile) {
  MemoryFit f;
  f.limit = limit;
  f.ranks = ranks;
  // The model's own layers from the parameter counts at 1 and 2 layers, then the need one layer up.
  const std::optional<CompiledMemory> one = compile(1, 0), two = compile(2, 0);
  std::optional<CompiledMemory> next;
  if (one && two && two->param_count > one->param_count) {
    f.params_per_layer = two->param_count - one->param_count;
    f.layers = 1 + std::llround((param_count - one->param_count) / f.params_per_layer);
    next = compile(f.layers + 1, 0);
  }
  f.scales = next.has_value();
  const double single_peak = rank_memory(memory, 0, 1).peak;
  for (int stage = 0; stage < 4; ++stage) {
    StageFit& s = f.stages[stage];
    s.stage = stage;
    s.need = rank_memory(memory, stage, ranks).peak;
    s.fits = s.need <= limit;
    if (!s.fits)
      if (std::optional<std::pair<int64_t, double>> b = fitting_budget(stage, ranks, limit, single_peak, s.need, compile))
        s.budget = b->first, s.budget_need = b->second;
    if (f.scales) {
      s.per_layer = rank_memory(next->memory, stage, ranks).peak - s.need;
      if (s.per_layer > 0) {
        s.largest_layers = std::max<int64_t>(0, f.layers + static_cast<int64_t>(std::floor((limit - s.need) / s.per_layer)));
        s.largest_params = s.largest_layers > 0
                               ? param_count + static_cast<double>(s.largest_layers - f.layers) * f.params_per_layer
                               : 0;
      }
    }
  }
  return f;
}

std::array<StateShare, 4> state_shares(double params_bytes, double grads_bytes, double state_bytes, int ranks,
                                       double limit) {
  std::array<StateShare, 4> shares{};
  const double n = ranks;
  const double per_rank[4] = {params_bytes + grads_bytes + state_bytes, params_bytes + grads_bytes + state_bytes / n,
                              params_bytes + (grads_bytes + state_bytes) / n,
                              (params_bytes + grads_bytes + state_bytes) / n};
  for (int stage = 0; stage < 4; ++stage)
    shares[stage] = {per_rank[stage], per_rank[stage] > 0 ? limit / per_rank[stage] : 0};
  return shares;
}

DataParallelEstimate estimate_data_parallel(double params, double batch_tokens, int gpus, double peak, double mfu,
                                            double grad_bytes_per_param, const Interconnect& link) {
  DataParallelEstimate e;
  if (gpus < 1 || peak <= 0 || mfu <= 0) return e;
  e.compute_seconds = 6 * params * batch_tokens / (gpus * peak * mfu);
  e.backward_seconds = e.compute_seconds * 4 / 6;
  const double grads = params * grad_bytes_per_param;
  e.bytes_sent = all_reduce_bytes(grads, gpus);
  e.comm_seconds = all_reduce_seconds(grads, gpus, link);
  e.hidden_seconds = std::min(e.comm_seconds, e.backward_seconds);
  e.exposed_seconds = e.comm_seconds - e.hidden_seconds;
  e.step_seconds = e.compute_seconds + e.exposed_seconds;
  e.mfu = e.step_seconds > 0 ? mfu * e.compute_seconds / e.step_seconds : 0;
  return e;
}

}  // namespace napkin::analysis
