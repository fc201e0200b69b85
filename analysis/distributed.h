// The distributed step, statically: what data parallelism over N ranks costs
// a training step before any rank starts (`napkin report --ranks N
// --interconnect NAME`, docs/report.md "Distributed step"). Each rank runs
// the model's step on its own micro-batch (the model's `batch` dim), so the
// global batch is N times the model's, and the ranks exchange gradients
// (and, sharded, parameters) with ring collectives over one interconnect.
//
// Terms and conventions:
//  - interconnect: one link per rank, `bytes_per_s` in each direction, and
//    `latency_s` per ring step (a modelling figure of NCCL's order for small
//    messages; the table says so).
//  - ring collectives over N ranks, per rank (the bytes each rank sends;
//    receives are the same): all-reduce of B bytes 2(N-1)/N B in 2(N-1)
//    steps; reduce-scatter and all-gather (N-1)/N B in N-1 steps each. Time:
//    bytes / bytes_per_s + steps x latency_s.
//  - two levels (Topology::two_level: nodes of L ranks on one link, joined
//    by another, as NCCL runs a multi-node job): a collective reduce-scatters
//    inside each node, runs across the M = N / L nodes on each rank's 1/L
//    share, and all-gathers inside the node; an all-reduce of B sends
//    2(L-1)/L B inside the node and 2(M-1)/M B/L across.
//  - ZeRO stages (DeepSpeed's names): 0 plain data parallel (all-reduce the
//    gradients); 1 optimizer state sharded (reduce-scatter the gradients,
//    each rank updates its shard, all-gather the parameters); 2 gradients
//    sharded too (the same traffic); 3 parameters sharded too (all-gather
//    them before the forward and again before the backward).
//  - overlap: a gradient's collective starts once its gradient is written
//    (the time model's cumulative kernel time), in buckets of at least
//    kBucketBytes in the order the backward writes them (PyTorch DDP's
//    25 MiB), one bucket at a time on the link; what finishes after the
//    backward is exposed. The parameter all-gather of stages 1 and 2 runs
//    after the optimizer (exposed); stage 3's gathers hide behind the phase
//    they feed as far as its compute time allows.
//  - per-rank memory: the single-rank step's buffers and live ranges
//    (analysis/memory.h), each parameter and optimizer-state buffer divided
//    by N where the stage shards it (the state from stage 1, the parameters
//    at 3); the gradients whole at every stage, as napkin's step writes them
//    on every rank (docs/distributed.md "Memory per rank"); the peak of that
//    sweep. Not counted: the collectives' staging buffers (a bucket; a
//    gathered parameter under stage 3 unless the step is built with --zero
//    3), the trainer's host gradient sums, the process.
//  - the step at N ranks: the single-rank prediction (analysis/step_time.h)
//    with the optimizer's kernels divided by N where it runs on a shard, plus
//    the exposed communication. MFU: the rank's counted FLOPs over that time.
//  - expert parallelism (a model with moe() layers, analysis/moe.h): each
//    rank holds E/N of every layer's experts (E % N == 0) and runs the
//    model's step on its own micro-batch; the rest of the model is plain
//    data parallel. Per moe() layer and micro-batch, four all-to-alls: the
//    forward's dispatch (the rank's [E, C, d] buffer to the experts' ranks)
//    and combine (the experts' outputs back), and in the backward the same
//    two of their gradients. Each sends (N-1)/N of the rank's E·C·d buffer,
//    at the dispatch buffer's dtype, in N-1 pairwise exchanges: bytes /
//    bytes_per_s + (N-1) x latency_s (on two levels: (L-1)/N of the buffer
//    inside the node in L-1 exchanges, then (N-L)/N across in M-1, each
//    rank's node-mates' shares together). The all-to-alls are exposed: the
//    experts wait for their tokens, the combine's readers for their rows.
//    The gradients of the other parameters are all-reduced as plain data
//    parallel does (in buckets behind the backward); an expert's gradient is
//    whole on its rank (its experts saw every rank's tokens): no collective.
//    Per-rank memory: the expert parameters, their gradients and optimizer
//    state divided by N, the rest whole, swept again for the peak; the
//    optimizer's kernels scaled by the share of parameter elements a rank
//    updates (the others' and 1/N of the experts').
#pragma once

#include <array>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "analysis/cost.h"
#include "analysis/memory.h"
#include "analysis/step_time.h"
#include "ir/graph.h"

namespace napkin::analysis {

struct Interconnect {
  std::string name;         // lookup key: "nvlink4"
  std::string description;  // "NVLink 4 (H100 SXM5: 18 links)"
  double bytes_per_s = 0;   // per rank, each direction
  double latency_s = 0;     // per ring step
  std::string source;       // where the bandwidth comes from, and what the latency is
};

const std::vector<Interconnect>& builtin_interconnects();
const Interconnect* find_interconnect(std::string_view name);  // case-insensitive; nullptr when unknown
std::string known_interconnect_names();                        // "100gbe, ib-ndr, nvlink4, pcie5"

// Where the ranks sit: `ranks` on one `link`, or (with `across` and
// `ranks_per_node` dividing `ranks`) nodes of ranks_per_node on `link`,
// joined by `across`.
struct Topology {
  int ranks = 1;
  const Interconnect* link = nullptr;
  const Interconnect* across = nullptr;
  int ranks_per_node = 0;
  bool two_level() const { return across && ranks_per_node > 0 && ranks > ranks_per_node && ranks % ranks_per_node == 0; }
  int nodes() const { return two_level() ? ranks / ranks_per_node : 1; }
};

// One collective of one rank: the bytes it sends (those across nodes among
// them) and its time.
struct Collective {
  double bytes = 0, across_bytes = 0, seconds = 0;
};
Collective all_reduce(double bytes, const Topology& t);
Collective reduce_scatter(double bytes, const Topology& t);  // all-gather: the same

// Ring collectives over one link (see above): the bytes one rank sends, and the time.
double all_reduce_bytes(double bytes, int ranks);
double reduce_scatter_bytes(double bytes, int ranks);  // all-gather: the same
double all_reduce_seconds(double bytes, int ranks, const Interconnect& link);
double reduce_scatter_seconds(double bytes, int ranks, const Interconnect& link);  // all-gather: the same

inline constexpr double kBucketBytes = 25.0 * 1024 * 1024;

// "data parallel", "ZeRO-1", "ZeRO-2", "ZeRO-3".
const char* zero_stage_name(int stage);

struct ZeroStage {
  int stage = 0;                // 0 .. 3
  double bytes_sent = 0;        // per rank per step
  double across_bytes = 0;      // of them, between nodes (two levels)
  double comm_seconds = 0;      // every collective back to back
  double hidden_seconds = 0;    // behind the compute
  double exposed_seconds = 0;   // comm_seconds - hidden_seconds
  double step_seconds = 0;      // predicted at N ranks
  double mfu = 0;               // the rank's counted FLOPs / (step_seconds x matmul peak)
  // Per rank, bytes: each category's buffers summed, and the peak of the sweep.
  double params = 0, grads = 0, optimizer_state = 0;
  double peak = 0;
};

// Expert parallelism over the ranks (above); its figures in ZeroStage's
// terms (`stage` unused).
struct ExpertParallel {
  bool possible = false;
  std::string why_not;            // when not possible: "8 experts do not divide over 6 ranks"
  int64_t experts_per_rank = 0;   // of every layer (they divide alike)
  int layers = 0;                 // moe() layers
  int64_t all_to_alls = 0;        // per rank per step: 4 x layers x micro-batches
  double all_to_all_bytes = 0;    // per rank per step, all of them
  double all_to_all_seconds = 0;  // every one back to back (exposed)
  double dense_grad_bytes = 0;    // the non-expert gradients, all-reduced
  ZeroStage step;                 // bytes_sent: the all-to-alls and the all-reduce together
};

// One all-to-all of a rank's `bytes` buffer (above).
Collective all_to_all(double bytes, const Topology& t);

struct DistributedStep {
  Topology topology;
  int ranks = 1;
  const Interconnect* link = nullptr;
  double param_bytes = 0, grad_bytes = 0, state_bytes = 0;  // the whole model's, one copy
  int buckets = 0;                    // gradient buckets of the backward
  double backward_seconds = 0;        // the single-rank prediction's backward phase
  double single_rank_seconds = 0;     // its whole step (all its micro-batches)
  int64_t micro_batches = 1;          // per rank per step (gradient accumulation)
  std::array<ZeroStage, 4> stages{};  // by stage
  std::optional<ExpertParallel> expert_parallel;  // with moe() layers
};

// `t`: the single-rank prediction of g's step on the device (its kernels in
// schedule order), `flops`: the step's counted FLOPs, `peak`: the device's
// matmul peak the MFU is against. micro_batches K > 1 (gradient
// accumulation): each rank runs the forward and backward K times, then the
// optimizer once, and the collectives once a step, hidden at most behind
// the last micro-batch's backward; optimizer_flops: the optimizer phase's
// FLOPs, counted once.
DistributedStep predict_distributed(const ir::Graph& g, const StepTime& t, const MemoryReport& memory, double flops,
                                    double peak, const Topology& topology, int64_t micro_batches = 1,
                                    double optimizer_flops = 0);

// One rank's memory under a ZeRO stage: the single-rank step's buffers over
// their live ranges (analysis/memory.h), each parameter and optimizer-state
// buffer divided by `ranks` where the stage shards it (gradients never: see
// above); each category summed, and the peak of that sweep (ZeroStage's
// figures).
struct RankMemory {
  double params = 0, grads = 0, optimizer_state = 0, peak = 0;
};
RankMemory rank_memory(const MemoryReport& memory, int stage, int ranks);

// `--memory-per-rank LIMIT` (docs/distributed.md, "Memory per rank"): for
// each ZeRO stage, whether a rank's step fits, which `--memory-budget`
// (recompute) makes it fit, and the largest model of the same shape.
//  - a rank's need: RankMemory::peak, the liveness peak of its step with its
//    activations at the model's micro-batch (the planned arena adds at most
//    its alignment padding).
//  - the budget: --memory-budget is the recompute pass's bound on the
//    single-rank arena, so a stage that shards S bytes at the peak fits under
//    about LIMIT + S. The search starts there and lowers the budget by each
//    try's excess over LIMIT (at most kBudgetTries compiles). Past the
//    smallest arena recompute reaches (the pass refuses the budget), it
//    bisects for that smallest arena (to kBisectionPrecision of it,
//    kBisections compiles at most) and tries
//    the rank's need on the way. "None can": no budget on that path brings it
//    under (the single-rank arena's floor may be a phase whose buffers the
//    stage shards, so the rank's need there is what decides).
//  - same shape: the model's dims with only `layers` changed (width, heads,
//    vocabulary, sequence and micro-batch fixed). The model's own L comes
//    from the parameter counts at layers 1 and 2 (each block adds the same);
//    a rank's need one block up (L + 1) gives the bytes a block adds at this
//    size, and the largest model is the most layers whose need, extrapolated
//    linearly from L, fits (no recompute): L + floor((LIMIT - need) / per
//    block), its parameters L's plus a block's for each layer more.
inline constexpr int kBudgetTries = 6;
inline constexpr int kBisections = 24;
inline constexpr double kBisectionPrecision = 1e-3;

// The step compiled at `layers` (0: the model's own) under a recompute
// budget (0: none): its memory and parameter count; nullopt when the budget
// cannot be met or the model has no `layers` dim.
struct CompiledMemory {
  MemoryReport memory;
  double param_count = 0;
};
using CompileAt = std::function<std::optional<CompiledMemory>(int64_t layers, int64_t budget)>;

struct StageFit {
  int stage = 0;
  double need = 0;          // a rank's peak, bytes, no recompute
  bool fits = false;        // need <= limit
  int64_t budget = 0;       // when it does not fit: the --memory-budget that makes it fit (0: none can)
  double budget_need = 0;   // a rank's peak under that budget
  double per_layer = 0;     // a rank's need per block (L -> L + 1)
  int64_t largest_layers = 0;  // 0: not one block fits (or no `layers` dim)
  double largest_params = 0;
};

struct MemoryFit {
  double limit = 0;           // bytes per rank
  int ranks = 1;
  bool scales = false;        // the model has a `layers` dim: the largest-model figures are set
  int64_t layers = 0;         // the model's
  double params_per_layer = 0;
  std::array<StageFit, 4> stages{};
};

// `memory`, `param_count`: the step as compiled; `compile`: the same model at other layers and budgets.
MemoryFit fit_memory(const MemoryReport& memory, double param_count, int ranks, double limit, const CompileAt& compile);

// `napkin estimate --memory-per-rank`: the lecture's bytes per parameter
// (params + grads + optimizer state), a rank's share under each stage
// (stage 1 divides the optimizer state by the ranks, 2 the gradients too, 3
// everything), activations ignored; the largest parameter count that fits.
struct StateShare {
  double bytes_per_param = 0;  // on one rank
  double largest_params = 0;   // limit / bytes_per_param
};
std::array<StateShare, 4> state_shares(double params_bytes, double grads_bytes, double state_bytes, int ranks,
                                       double limit);

// `napkin estimate`'s data-parallel figures, with the same ring all-reduce
// and interconnect but no step to look into: `params` parameters, each
// step `batch_tokens` tokens over `gpus` devices at `mfu` of `peak`, the
// gradients all-reduced once a step (`grad_bytes_per_param` each), hidden
// at most behind the backward, which is 4 of the 6 FLOPs per parameter and
// token (the lecture's rule).
struct DataParallelEstimate {
  double compute_seconds = 0;  // 6 N T / (gpus peak mfu)
  double backward_seconds = 0;  // 4/6 of it
  double bytes_sent = 0;        // per GPU per step
  double comm_seconds = 0, hidden_seconds = 0, exposed_seconds = 0;
  double step_seconds = 0;      // compute + exposed
  double mfu = 0;               // mfu x compute / step
};
DataParallelEstimate estimate_data_parallel(double params, double batch_tokens, int gpus, double peak, double mfu,
                                            double grad_bytes_per_param, const Interconnect& link);

}  // namespace napkin::analysis
