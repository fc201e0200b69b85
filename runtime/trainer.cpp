#include "runtime/trainer.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <cstdio>
#include <fstream>
#include <optional>

#include "runtime/checkpoint.h"
#include "runtime/communicator.h"
#include "runtime/gradient_stage.h"
#include "runtime/optimizer_shards.h"
#include "runtime/parameter_collectives.h"
#include "runtime/rank_agreement.h"
#include "runtime/rank_memory.h"
#include "runtime/checkpoint_dir.h"
#include "runtime/dataset.h"
#include "runtime/error.h"
#include "runtime/flag_checks.h"
#include "runtime/init.h"
#include "runtime/metrics_file.h"
#include "runtime/rng_tensor.h"
#include "runtime/sampler.h"
#include "runtime/sharded_checkpoint.h"
#include "runtime/stop_signals.h"
#include "runtime/tensor_element.h"
#include "runtime/thread_pool.h"
#include "runtime/time_report.h"

namespace napkin::runtime {

namespace {

std::atomic<bool> g_interrupted{false};
// Each SIGINT or SIGTERM once training began, on the signal thread
// (runtime/stop_signals.h). A rank of a job waiting in a collective when the
// launcher ends the job (another rank failed, or the user pressed ^C) cannot
// finish its step: it says where it was and ends now. Otherwise the step
// finishes and the ranks agree to stop after it (the flag travels with the
// step's loss); a second signal changes nothing, so the save is never cut
// short.
void on_interrupt(int sig) {
  g_interrupted = true;
  if (Communicator::in_collective()) {
    Communicator::write_stopped_by_signal(sig);
    std::_Exit(128 + sig);
  }
}

struct Options {
  int64_t steps = 0;
  uint64_t seed = 0;
  std::string data;                     // token file
  std::string tokenizer;                // --sample-every decodes by it (default: the model's train.data.tokenizer)
  std::vector<std::string> data_files;  // NAME=PATH.npy
  std::string order;
  std::string init, resume;
  std::string checkpoint_dir;
  std::string checkpoint_format;  // "sharded", "single", or "" for the job's default (docs/distributed.md)
  int64_t checkpoint_every = 0, keep = 2;
  int64_t eval_every = 0, eval_batches = 1;
  int64_t log_every = 1;
  std::string metrics;
  int threads = 0;
  int64_t accumulate = 0;  // 0: the model's train.accumulate
  double collective_timeout = 300;
  double bucket_mib = 0;  // 0: the program's bucket size
  int zero = -1;          // ZeRO stage 0-3; -1: 3 for a program that gathers its parameters, else 0
  int shard_group = 0;    // hybrid sharding: ranks per sharding group (0: all of them)
  int64_t memory_limit = 0;  // bytes a rank may hold (0: no limit); runtime/rank_memory.h predicts them
  bool debug_nan = false, quiet = false, print_program = false, profile = false;
  int64_t sample_every = 0, sample_tokens = 64;  // --sample-every: a sample from the model every K steps
};

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, ++u;
  return u == 0 ? fmt::format("{:.0f} B", b) : fmt::format("{:.1f} {}", b, units[u]);
}

std::string human_duration(double s) {
  if (!(s < 3.15e9)) return "> 100 years";
  const int64_t t = static_cast<int64_t>(s);
  if (s < 60) return fmt::format("{:.0f}s", s);
  if (s < 3600) return fmt::format("{}m{:02d}s", t / 60, t % 60);
  if (s < 86400) return fmt::format("{}h{:02d}m", t / 3600, (t / 60) % 60);
  return fmt::format("{}d{:02d}h", t / 86400, (t / 3600) % 24);
}

std::vector<TensorRef> tensor_refs(const Program& p, Engine& engine, std::initializer_list<TensorRole> roles) {
  std::vector<TensorRef> refs;
  for (TensorRole role : roles)
    for (const TensorSpec* t : p.with_role(role)) refs.push_back({t->name, std::string(dtype_name(t->dtype)), t->shape, engine.host(*t)});
  return refs;
}

// On a pool of `threads` made for it (a CUDA trainer's engine has none; the
// CPU engine's is the same size and idle now).
void init_params(const Program& p, Engine& engine, uint64_t seed, int threads) {
  ThreadPool pool(threads);
  for (const TensorSpec* t : p.with_role(TensorRole::Param)) {
    std::vector<double> v = init_values(t->init, t->name, t->numel(), seed, &pool);
    auto* host = engine.host(*t);
    pool.parallel_for(t->numel(), [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) write_element(host, t->dtype, i, v[static_cast<size_t>(i)]);
    });
  }
}

std::unique_ptr<Dataset> open_data(const Program& p, const Options& o, Engine& engine, int64_t micro_batches_per_step) {
  DataSpec spec;
  spec.micro_batches_per_step = micro_batches_per_step;
  const DataDefaults& d = p.train.data;
  const std::optional<DataFormat> model_format =
      d.format.empty() ? std::nullopt : std::optional(parse_data_format(d.format));
  std::optional<DataFormat> format = model_format;
  spec.path = d.path;
  spec.files = d.files;
  spec.seed = o.seed;
  if (!o.data.empty()) {
    format = DataFormat::Tokens;
    spec.path = o.data;
  }
  for (const std::string& f : o.data_files) {
    auto eq = f.find('=');
    if (eq == std::string::npos) throw Error("--data-file wants NAME=PATH.npy, got '" + printable(f) + "'");
    if (format != DataFormat::Npy) spec.files.clear();  // the model's files were for another format
    format = DataFormat::Npy;
    spec.files[f.substr(0, eq)] = f.substr(eq + 1);
  }
  if (!format)
    throw Error("the model names no training data (train.data in its YAML); pass --data FILE or --data-file NAME=FILE.npy");
  spec.format = *format;
  // The model's train.data split is for its token file: a token file given
  // with --data keeps it, .npy files given with --data-file do not
  // (docs/runtime.md).
  spec.split = format == DataFormat::Tokens && model_format == DataFormat::Tokens ? d.split : 1.0;
  if (spec.format == DataFormat::Tokens) spec.token_dtype = parse_token_dtype(spec.path, d.dtype);
  spec.order = parse_data_order(spec.format == DataFormat::Tokens ? spec.path : "npy data", o.order.empty() ? d.order : o.order);
  std::vector<InputSlot> slots;
  for (const TensorSpec* t : p.with_role(TensorRole::Input)) {
    slots.push_back({t->name, t->dtype, t->shape, engine.host(*t)});
    // A token file feeds the tokens and the targets: its ids must fit both.
    if (t->index_bound > 0 && (spec.vocab_bound == 0 || t->index_bound < spec.vocab_bound))
      spec.vocab_bound = t->index_bound;
  }
  return Dataset::open(spec, std::move(slots));
}

// After each kernel: the first one whose floating output holds a NaN is the op
// that produced it.
void watch_for_nan(Engine& engine, const int64_t& step) {
  engine.inspect_each_kernel([&engine, &step](int i, const char* out) {
    const KernelSpec& k = engine.program().kernels[i];
    if (k.out_dtype != DType::F32 && k.out_dtype != DType::F64 && k.out_dtype != DType::BF16 && k.out_dtype != DType::F16)
      return;
    for (int64_t e = 0; e < k.out_numel; ++e) {
      double v = read_element(out, k.out_dtype, e);
      if (std::isnan(v))
        throw Error(fmt::format("step {}: {} ({} phase{}{}) produced the first NaN, at element {}", step, k.name, phase_name(k.phase),
                                k.where.empty() ? "" : ", ", k.where, e));
    }
  });
}

// Rank 0's `text` to every rank.
void broadcast_text(Communicator& comm, std::string& text) {
  int64_t length = static_cast<int64_t>(text.size());
  comm.broadcast(&length, sizeof length);
  text.resize(static_cast<size_t>(length));
  comm.broadcast(text.data(), length);
}

// --resume ARG: ARG is a checkpoint (a file or a sharded checkpoint's
// directory) or a directory of them (its newest).
// When the newest file of a directory cannot be used, the message lists the
// older ones that can and how to resume from one.
CheckpointHeader resume_from(const std::string& arg, const std::vector<TensorRef>& into,
                             const std::vector<std::string>& not_loaded, const std::string& hash, const StepBuild& built) {
  // The step's hash covers what --dims and --memory-budget (the activations
  // it recomputes) make of the model, so either can differ from the run's.
  const std::string hint = "this trainer is the model at the --dims and --memory-budget `napkin train` was given: "
                           "resume under the ones the checkpoint's run was trained with (a run trained under "
                           "--memory-budget resumes under the same budget)";
  std::error_code ec;
  if (!std::filesystem::exists(arg, ec)) throw Error(arg + ": --resume: no such checkpoint file or directory");
  if (!std::filesystem::is_directory(arg, ec) || is_sharded_checkpoint(arg))
    return read_checkpoint(arg, into, hash, hint, &built, not_loaded);
  auto all = list_checkpoints(arg);
  if (all.empty())
    throw Error(arg + ": --resume: no checkpoints in this directory (files named step-N.safetensors, directories "
                      "step-N.sharded)");
  try {
    return read_checkpoint(all.front().second, into, hash, hint, &built, not_loaded);
  } catch (const Error& e) {
    const std::vector<std::string> good = older_usable_checkpoints(all, hash);
    std::string message = std::string(e.what()) + "\n  the newest checkpoint in " + arg + " cannot be used; ";
    if (good.empty()) throw Error(message + "no older one there loads either");
    message += "older ones that load:";
    for (const std::string& g : good) message += "\n    " + g;
    message += "\n  to resume from the newest good one, move the damaged file away and run with --resume " + good.front();
    throw Error(message);
  }
}

// The micro-batches of one step, and the checkpoint field that records them:
// a run resumed with another split of the same global batch continues it.
constexpr const char* kMicroBatchesKey = "micro_batches_per_step";

void check_same_global_batch(const CheckpointHeader& h, int64_t micro_batches, int ranks, int64_t accumulate) {
  auto it = h.metadata.find(kMicroBatchesKey);
  if (it == h.metadata.end()) return;  // written before napkin recorded it: one micro-batch per step
  int64_t then = 0;
  auto [end, ec] = std::from_chars(it->second.data(), it->second.data() + it->second.size(), then);
  if (ec != std::errc() || end != it->second.data() + it->second.size() || then < 1)
    throw Error(fmt::format("{}: {} '{}' is not a whole number", h.path, kMicroBatchesKey, printable(it->second)));
  if (then == micro_batches) return;
  std::string hint = then % ranks == 0
                         ? fmt::format("pass --accumulate {} to continue it on {} rank{}", then / ranks, ranks,
                                       ranks == 1 ? "" : "s")
                         : fmt::format("run it on a number of ranks that divides {}", then);
  throw Error(fmt::format("{} was written by a run of {} micro-batches per step (ranks × --accumulate); this run has "
                          "{} ({} rank{} × {}), a different global batch: {}",
                          h.path, then, micro_batches, ranks, ranks == 1 ? "" : "s", accumulate, hint));
}

// One rank's training run, in the order run() takes it: setup() brings up
// the engine, the weights (napkin's init, --init or --resume), the data, the
// ranks' agreement and the checkpoint directory; banner() says what will
// run; loop() trains the steps (each: train_step, then progress, eval,
// sample, checkpoint); finish() saves the last step and says how it went.
// The members are the state more than one of them reads.
class TrainingRun {
 public:
  // The engine keeps a reference to the program: made here, from the member.
  TrainingRun(const Options& o, Program program, const EngineFactory& make_engine, Communicator& comm)
      : o(o), comm(comm), program(std::move(program)), engine_owner(make_engine(this->program, o.threads)) {}

  // A run that ends before its first step: its exit status.
  std::optional<int> setup(const SamplerProgram& sampler_program);
  void banner();
  std::optional<int> loop();
  int finish();

 private:
  void start_engine(const SamplerProgram& sampler_program);
  void load_weights();
  void agree_with_other_ranks();
  // Each rank's predicted memory (runtime/rank_memory.h), from every rank's
  // process measured at start-up; --memory-limit refuses the job here.
  void predict_memory();
  std::string memory_prediction_text(const RankMemory& m) const;
  // Every rank calls it (ZeRO-1 gathers the optimizer state to rank 0 first);
  // rank 0 writes.
  std::string save(int64_t step);
  // A data file that fails mid-run (truncated, a bad token) leaves the state
  // of the last finished step intact: save it, so no work is lost.
  [[noreturn]] void stop_on_data_error(const Error& e, int64_t finished);
  // One step's forward, backward and update: its loss as the ranks agree on
  // it, and whether any rank was interrupted during it.
  std::pair<double, bool> train_step(int64_t step);
  void report_progress(int64_t step, double loss);
  // The last step's metrics as the progress line ends ("  moe dropped 12"),
  // and added to a metrics record: metric.<group>.<key> as "<group>": {"<key>": value}.
  std::string metrics_text() const;
  MetricsRecord with_step_metrics(MetricsRecord record) const;
  void evaluate(int64_t step);

  const Options& o;
  Communicator& comm;
  const Program program;
  const int ranks = comm.size();
  const bool rank0 = comm.rank() == 0;
  const bool quiet = o.quiet || !rank0;  // the other ranks print errors only
  const int64_t accumulate = o.accumulate > 0 ? o.accumulate : std::max<int64_t>(1, program.train.accumulate);
  const int64_t micro_batches = accumulate * ranks;  // of the global batch
  // The ZeRO stage: --zero, else 3 for a step built to gather its parameters (napkin build --zero 3).
  const int stage = o.zero >= 0 ? o.zero : gathers_parameters(program) ? 3 : 0;
  // Each rank writes its own tensors (sharded_checkpoint.h), or rank 0 the whole.
  const bool sharded_checkpoints = o.checkpoint_format.empty() ? ranks > 1 && stage >= 1 : o.checkpoint_format == "sharded";
  // What one rank's step is: `accumulate` forward+backward passes, one update.
  const Program p = per_step_view(program, accumulate);
  std::unique_ptr<Engine> engine_owner;
  Engine& ex = *engine_owner;
  // ZeRO-1 to 3: this rank updates its own parameters only (one rank: all of them).
  std::unique_ptr<OptimizerShards> shards;
  // Or the engine runs them on the device: what it uses ("NCCL 2.28.0"), "" when not.
  std::string device_collectives;
  // Hybrid sharding (--shard-group L): the ranks shard within groups of L
  // consecutive ranks (`group`: this rank's) and replicate across them
  // (`replicas`: the ranks of the other groups at this rank's place in its
  // own). Without it the group is the job and there are no replicas.
  const int group_size = o.shard_group > 0 ? o.shard_group : ranks;
  std::unique_ptr<Communicator> group, replicas;
  Communicator& shard_comm() { return group ? *group : comm; }
  // ZeRO-2 and 3: what the step's collective kernels do over the ranks. After `group`, which its thread calls:
  // destroyed before it.
  std::unique_ptr<ParameterCollectives> collectives;
  int64_t start_step = 0;
  uint64_t seed = o.seed;
  Lineage lineage{p.hash};
  std::unique_ptr<TrainingSamples> samples;
  std::optional<CheckpointHeader> resumed;
  std::unique_ptr<Dataset> data;
  std::optional<GradientStage> gradients;
  int64_t process_bytes = 0;            // this rank's resident memory before its arena is touched
  std::vector<RankMemory> predicted;    // per rank (the CPU trainer's)
  std::unique_ptr<CheckpointDir> ckpt;
  const double peak = p.peak_flops;
  MetricsFile metrics{std::string()};  // opened by loop(): a run that cannot start leaves no file
  int64_t current = 0;                 // the step --debug-nan names
  int64_t last_saved = 0;
  std::chrono::steady_clock::time_point run_start;
  StepTimes step_times;
  bool warned_peak = false;
  double window_seconds = 0;
  int64_t window_steps = 0;
  // The step's metrics (runtime/program.h step_metrics): the last step's
  // values, summed over its micro-batches and the ranks.
  const std::vector<const TensorSpec*> metric_tensors = step_metrics(program);
  std::vector<std::vector<double>> metric_values = [this] {
    std::vector<std::vector<double>> v;
    for (const TensorSpec* t : metric_tensors) v.emplace_back(static_cast<size_t>(t->numel()), 0.0);
    return v;
  }();
};

std::optional<int> TrainingRun::setup(const SamplerProgram& sampler_program) {
  process_bytes = resident_bytes();  // the arena is mapped, not yet touched
  start_engine(sampler_program);
  load_weights();
  Options opts = o;
  opts.seed = seed;
  data = open_data(p, opts, ex, micro_batches);
  agree_with_other_ranks();
  predict_memory();

  if (resumed) {
    check_same_global_batch(*resumed, micro_batches, ranks, accumulate);
    if (start_step > o.steps)
      throw Error(fmt::format("{} is at step {}, past --steps {}: pass --steps N with N > {} to train further",
                              resumed->path, start_step, o.steps, start_step));
    if (!quiet) fmt::print("resumed from {} at step {}\n", resumed->path, start_step);
    if (start_step == o.steps) {
      if (rank0)
        fmt::print("already at step {} of {}: nothing to train (pass a larger --steps to go on)\n", start_step, o.steps);
      return 0;
    }
  }
  if (stage >= 2) gradients.emplace(ex, shard_comm(), accumulate, shards.get(), stage == 3, replicas.get());
  else gradients.emplace(ex, comm, accumulate);
  // A fresh run (or one resumed from a version-1 checkpoint, which has no id)
  // starts a lineage of its own; rank 0's id is the job's.
  if (lineage.run.empty()) {
    lineage.run = new_run_id();
    comm.broadcast(lineage.run.data(), static_cast<int64_t>(lineage.run.size()));
  }

  // After the data: a run that cannot start leaves no directory behind. Rank
  // 0 alone writes checkpoints (every rank holds the same state).
  if (!o.checkpoint_dir.empty() && rank0) {
    ckpt = std::make_unique<CheckpointDir>(o.checkpoint_dir, lineage);
    if (ckpt->temporaries_removed() > 0 && !quiet)
      fmt::print("removed {} temporary file{} that interrupted saves left in {}\n", ckpt->temporaries_removed(),
                 ckpt->temporaries_removed() == 1 ? "" : "s", o.checkpoint_dir);
  }
  return std::nullopt;
}

void TrainingRun::start_engine(const SamplerProgram& sampler_program) {
  ex.set_profiling(o.profile);
  if (stage == 3 && !gathers_parameters(program))
    throw Error("--zero 3 needs a trainer whose step gathers its parameters where it uses them: build it with `napkin "
                "build MODEL --zero 3` (or `napkin train --zero 3 MODEL`)");
  if (stage == 3 && ranks > 1 && o.sample_every > 0)
    throw Error("--sample-every under --zero 3: rank 0 holds only its own parameters; sample a checkpoint with `napkin "
                "sample` instead");
  if (o.shard_group > 0 && (ranks % o.shard_group != 0 || stage == 0))
    throw Error(ranks % o.shard_group != 0
                    ? fmt::format("--shard-group {}: the {} ranks do not split into groups of {}", o.shard_group, ranks,
                                  o.shard_group)
                    : fmt::format("--shard-group {}: plain data parallel shards nothing: give --zero 1, 2 or 3",
                                  o.shard_group));
  if (stage >= 1 && group_size < ranks) {
    group = comm.split(comm.rank() / group_size, comm.rank() % group_size);
    replicas = comm.split(comm.rank() % group_size, comm.rank() / group_size);
  }
  if (stage >= 1 && ranks > 1) {
    shards = std::make_unique<OptimizerShards>(program, group_size, shard_comm().rank());
    ex.skip(shards->skip_kernel(), shards->skip_update(), shards->run_member());
    ex.release(shards->others_state());  // before anything touches it
    // ZeRO-3: the others' parameters too, so that a GPU never maps them (the CPU's init writes them, and they
    // are released again once the weights are in: load_weights).
    if (stage == 3) ex.release(shards->others_params());
  }
  // ZeRO-2 and 3: each rank's clipping norm and overflow probe cover its own gradients, which the program's
  // all_reduce_sum kernels add up (passes/optimizer.cpp, passes/loss_scaling.h); ZeRO-3's step gathers each
  // parameter from its owner and reduces its gradient there (passes/shard_parameters.h).
  // On a GPU through NCCL where every rank can (not under hybrid sharding: NCCL's communicator is the job's),
  // else on the host (MPI).
  std::string why_not_device;
  if (stage >= 2 && ranks > 1 && !group)
    device_collectives = ex.run_collectives_on_device(
        comm, [owners = shards.get()](const std::string& param) { return owners->owner(param); }, stage, why_not_device);
  // A GPU's ZeRO-3 step gathers into, and reads from, device memory the host path would copy through unmapped
  // granules (the others' parameters): NCCL or nothing.
  if (stage == 3 && ranks > 1 && p.backend != "cpu" && device_collectives.empty())
    throw Error(fmt::format("--zero 3 on GPUs runs the step's gathers and reduces through NCCL, and {}; --zero 2 "
                            "shards the gradients and optimizer state without it",
                            group ? "--shard-group splits the job into groups while NCCL's communicator is the whole "
                                    "job's"
                                  : "NCCL cannot be used here: " + why_not_device));
  if (stage >= 2 && ranks > 1 && device_collectives.empty()) {
    collectives = std::make_unique<ParameterCollectives>(*shards, shard_comm(), stage);
    ex.set_collectives([this](const CollectiveSpec& spec, const char* x, char* y) { (*collectives)(spec, x, y); });
    // The gathers the step issues ahead of their use run while it computes, on a thread of their own.
    // (Not under --debug-nan, whose check of each kernel's output would read a gather's while it arrives.)
    if (stage == 3 && !o.debug_nan && shard_comm().serialized_threads() &&
        ex.set_collective_waits([this](int kernel) { collectives->wait_before(kernel); }))
      collectives->start_thread();
  }

  // --sample-every: the model's sampler program (rank 0 prints the samples).
  if (o.sample_every > 0 && rank0) {
    if (!sampler_program.json)
      throw Error("--sample-every: this trainer carries no sampler program (a CUDA trainer, or a model napkin sample "
                  "cannot derive a decoder from: `napkin sample MODEL.yaml` says why)");
    samples = std::make_unique<TrainingSamples>(sampler_program.json, sampler_program.size, sampler_program.make_engine,
                                                o.threads, o.tokenizer.empty() ? program.train.data.tokenizer : o.tokenizer);
  }
}

void TrainingRun::load_weights() {
  init_params(p, ex, seed, o.threads);
  if (!o.init.empty()) {
    std::vector<std::string> state_names;
    for (const TensorSpec* t : p.with_role(TensorRole::State)) state_names.push_back(t->name);
    std::vector<std::string> ignored = read_weights(o.init, tensor_refs(p, ex, {TensorRole::Param}), state_names);
    if (!ignored.empty() && !quiet)
      fmt::print("--init {}: loaded the weights; ignored the optimizer state it holds ({} tensors): --init starts a new "
                 "run from these weights, --resume would continue the run that wrote them\n",
                 o.init, ignored.size());
  }
  ex.upload(TensorRole::Param);
  // Every rank reads the same checkpoint, the one rank 0 chose from a
  // directory (another rank's view of it may differ: a file system's cache,
  // a checkpoint being written): the ranks start from the same state. A rank
  // given no --resume learns rank 0's choice too, and the ranks' agreement
  // below stops the job.
  std::string resume = o.resume;
  if (ranks > 1) {
    std::error_code ec;
    if (rank0 && std::filesystem::is_directory(resume, ec) && !is_sharded_checkpoint(resume))
      if (auto all = list_checkpoints(resume); !all.empty()) resume = all.front().second;
    broadcast_text(comm, resume);
  }
  if (!resume.empty()) {
    // A ZeRO rank loads its own share of the optimizer state, never touching the others' (released pages).
    std::vector<TensorRef> into = tensor_refs(p, ex, {TensorRole::Param, TensorRole::State});
    std::vector<std::string> not_loaded;
    if (shards)
      for (const TensorSpec* t : shards->others_state()) not_loaded.push_back(t->name);
    if (shards && stage == 3)  // and of the parameters
      for (const TensorSpec* t : shards->others_params()) not_loaded.push_back(t->name);
    std::erase_if(into, [&](const TensorRef& r) { return std::find(not_loaded.begin(), not_loaded.end(), r.name) != not_loaded.end(); });
    resumed = resume_from(resume, into, not_loaded, p.hash, {p.train.dims, p.train.memory_budget});
    start_step = resumed->step;
    if (resumed->seed) seed = *resumed->seed;
    lineage.run = resumed->run;
    lineage.resumed_step = resumed->step;
    lineage.adopts_version1 = resumed->format == 1;
    ex.upload(TensorRole::Param);
    ex.upload(TensorRole::State);
  }
  // ZeRO-3: this rank keeps its own parameters; the step gathers the others' where it uses them.
  if (shards && stage == 3) ex.release(shards->others_params());
}

// Before any collective whose count depends on them (docs/distributed.md).
void TrainingRun::agree_with_other_ranks() {
  std::string data_identity;
  for (const std::string& file : data->files())
    data_identity += (data_identity.empty() ? "" : "; ") + file_identity(file);
  check_ranks_agree(
      comm, {{"the model (its hash: the training step and its schedule)", p.hash},
             {"--seed", std::to_string(seed)},
             {"--steps", std::to_string(o.steps)},
             {"--accumulate", std::to_string(accumulate)},
             {"--zero", std::to_string(stage)},
             {"--shard-group", std::to_string(group_size)},
             {"--resume", o.resume.empty() ? std::string("not given")
                          : resumed  ? fmt::format("step {}", resumed->step)
                                     : std::string("given")},
             {"the data", data_identity},
             {"--order", o.order.empty() ? p.train.data.order : o.order},
             // A sharded checkpoint by its index, which holds every file's size and CRC.
             {"--init", o.init.empty() ? std::string("none")
                                       : file_identity(is_sharded_checkpoint(o.init) ? o.init + "/index.json" : o.init)},
             {"--eval-every", std::to_string(o.eval_every)},
             {"--eval-batches", std::to_string(o.eval_batches)},
             {"--checkpoint-every", o.checkpoint_dir.empty() ? std::string("no checkpoints") : std::to_string(o.checkpoint_every)},
             {"--checkpoint-format", sharded_checkpoints ? "sharded" : "single"},
             {"--bucket-mib", fmt::format("{:g}", program.bucket_bytes / (1024.0 * 1024.0))},
             {"--memory-limit", o.memory_limit > 0 ? std::to_string(o.memory_limit) : std::string("none")}});
}

std::string TrainingRun::memory_prediction_text(const RankMemory& m) const {
  std::string s = fmt::format("{} arena", human_bytes(static_cast<double>(m.arena)));
  if (m.others_state > 0)
    s += fmt::format(" − {} of the others' optimizer state", human_bytes(static_cast<double>(m.others_state)));
  if (m.others_params > 0)
    s += fmt::format(" − {} of their parameters", human_bytes(static_cast<double>(m.others_params)));
  if (m.others_grads > 0)
    s += fmt::format(" − {} of their gradients", human_bytes(static_cast<double>(m.others_grads)));
  if (m.gradient_stage > 0)
    s += fmt::format(" + {} of gradient sums", human_bytes(static_cast<double>(m.gradient_stage)));
  if (m.collectives > 0)
    s += fmt::format(" + {} in MPI's collectives", human_bytes(static_cast<double>(m.collectives)));
  if (m.scratch > 0) s += fmt::format(" + {} of matmul scratch", human_bytes(static_cast<double>(m.scratch)));
  return s + fmt::format(" + {} of process", human_bytes(static_cast<double>(m.process)));
}

void TrainingRun::predict_memory() {
  if (p.backend != "cpu") {
    if (o.memory_limit > 0)
      throw EveryRankStops("--memory-limit is the CPU trainer's: a CUDA rank's arena is one device allocation of the "
                           "planned arena (`napkin report --memory-per-rank` predicts it)");
    return;
  }
  std::vector<int64_t> process(static_cast<size_t>(ranks), process_bytes);
  if (ranks > 1) comm.all_gather(&process_bytes, sizeof process_bytes, process.data());
  int64_t most_process = 0;
  for (int r = 0; r < ranks; ++r) {
    const int64_t bytes = process[static_cast<size_t>(r)] + kRuntimeGrowth;
    // Hybrid sharding: a rank shards with its group alone.
    predicted.push_back(predict_rank_memory(program, stage, group_size, r % group_size, accumulate, bytes));
    most_process = std::max(most_process, bytes);
  }
  if (o.memory_limit <= 0) return;
  const RankMemory* most = &predicted.front();
  for (const RankMemory& m : predicted)
    if (m.total() > most->total()) most = &m;
  if (most->total() <= o.memory_limit) return;
  // What would fit, by the same prediction: the other stages on these ranks, then more ranks for the most sharded.
  const bool can_gather = gathers_parameters(program);
  const int top = can_gather ? 3 : 2;
  std::vector<std::string> fits;
  if (ranks > 1)
    for (int s = stage + 1; s <= top; ++s)
      if (const RankMemory m = predict_job_memory(program, s, ranks, accumulate, most_process); m.total() <= o.memory_limit)
        fits.push_back(fmt::format("--zero {} on {} ranks needs {}", s, ranks, human_bytes(static_cast<double>(m.total()))));
  if (fits.empty())
    for (int n = std::max(2, 2 * ranks); n <= 1024; n *= 2)
      if (const RankMemory m = predict_job_memory(program, top, n, accumulate, most_process); m.total() <= o.memory_limit) {
        fits.push_back(fmt::format("--zero {} on {} ranks needs {}", top, n, human_bytes(static_cast<double>(m.total()))));
        break;
      }
  std::string hint;
  for (const std::string& f : fits) hint += (hint.empty() ? "" : "; ") + f;
  if (hint.empty()) hint = "no stage fits on up to 1024 ranks";
  if (!can_gather) hint += "; --zero 3 (the parameters sharded too) needs a trainer built with `napkin build --zero 3`";
  // Every rank computes the same figures from the same gathered sizes: they all stop.
  throw EveryRankStops(fmt::format(
      "this job needs {} a rank under --zero {} on {} rank{} (rank {}: {}), over --memory-limit {}; {} (nothing was "
      "trained)",
      human_bytes(static_cast<double>(most->total())), stage, ranks, ranks == 1 ? "" : "s", most->rank,
      memory_prediction_text(*most), human_bytes(static_cast<double>(o.memory_limit)), hint));
}

void TrainingRun::banner() {
  if (!quiet) {
    fmt::print("napkin trainer: {} ({}, {})\n", p.model, p.backend, ex.describe());
    fmt::print("  arena      {} ({} bytes, planned; liveness lower bound {} bytes)\n", human_bytes(p.arena_bytes),
               p.arena_bytes, p.liveness_peak);
    if (!predicted.empty()) {
      const RankMemory& m = predicted.front();
      fmt::print("  memory     per rank: predicted {}{} ({}; docs/distributed.md \"Memory per rank\")\n",
                 human_bytes(static_cast<double>(m.total())), ranks > 1 ? " on rank 0" : "", memory_prediction_text(m));
    }
    if (const std::optional<DeviceArenaMemory> device = ex.device_arena_memory()) {
      if (device->not_virtual.empty())
        fmt::print("  device     arena {} mapped of {} reserved, in {} granules{}\n", human_bytes(static_cast<double>(device->mapped)),
                   human_bytes(static_cast<double>(device->reserved)), human_bytes(static_cast<double>(device->granule)),
                   shards ? fmt::format(" (ZeRO-{}: the other ranks' optimizer state{} unmapped)", stage,
                                        stage == 3 ? " and parameters" : "")
                          : "");
      else
        fmt::print("  device     arena {} in one cuMemAlloc ({}{})\n", human_bytes(static_cast<double>(device->reserved)), device->not_virtual,
                   shards ? ": the other ranks' optimizer state stays mapped" : "");
    }
    if (gradients->reduced_in_step() && gradients->device_collectives().empty())
      fmt::print("  gradients  {} besides the arena: this rank's f32 sum of its own parameters' gradients (ZeRO-3)\n",
                 human_bytes(static_cast<double>(gradients->buffer_bytes())));
    else if (gradients->sharded())
      fmt::print("  gradients  {} besides the arena: this rank's f32 sum of its own parameters' gradients and one "
                 "bucket's staging (ZeRO-2)\n",
                 human_bytes(static_cast<double>(gradients->buffer_bytes())));
    else if (gradients->active() && gradients->device_collectives().empty())
      fmt::print("  gradients  {} summed over micro-batches and ranks besides the arena{}\n",
                 human_bytes(static_cast<double>(gradients->buffer_bytes())),
                 gradients->why_not_device().empty() ? "" : " (no device collectives: " + gradients->why_not_device() + ")");
    int64_t params = 0;
    for (const TensorSpec* t : p.with_role(TensorRole::Param)) params += t->numel();
    fmt::print("  params     {} ({}), optimizer {}, lr {}\n", with_commas(params), p.train.precision, p.train.optimizer, p.train.lr);
    fmt::print("  schedule   {}\n", p.train.schedule.describe());
    fmt::print("  data       {}\n", data->describe());
    if (micro_batches > 1)
      fmt::print("  batch      {} micro-batches of {} tokens per step ({} rank{} × {} accumulated): {} tokens\n",
                 micro_batches, with_commas(program.tokens_per_step), ranks, ranks == 1 ? "" : "s", accumulate,
                 with_commas(program.tokens_per_step * micro_batches));
    if (shards && stage == 3)
      fmt::print("  ZeRO-3     rank 0 holds {} of {} parameters ({} of {}), their gradients' sums and {} of {} of "
                 "optimizer state; the step gathers each parameter from its owner where it uses it and reduces its "
                 "gradient onto the owner\n",
                 shards->owned_params(), p.with_role(TensorRole::Param).size(),
                 human_bytes(static_cast<double>(shards->owned_param_bytes())),
                 human_bytes(static_cast<double>(shards->param_bytes())),
                 human_bytes(static_cast<double>(shards->owned_state_bytes())),
                 human_bytes(static_cast<double>(shards->state_bytes())));
    else if (shards)
      fmt::print("  ZeRO-{}     rank 0 updates {} of {} parameters, {} of {} of optimizer state (each rank its own "
                 "share; the others' parameters arrive by broadcast after each step)\n",
                 stage, shards->owned_params(), p.with_role(TensorRole::Param).size(), human_bytes(static_cast<double>(shards->owned_state_bytes())),
                 human_bytes(static_cast<double>(shards->state_bytes())));
    if (group)
      fmt::print("  sharding   hybrid: within {} groups of {} consecutive ranks, each group holding the whole model "
                 "between them; each owner's gradient sums added over the groups\n",
                 ranks / group_size, group_size);
    if (ranks > 1 && gradients->reduced_in_step())
      fmt::print("  ranks      {}; parameters gathered and gradients reduced by {} in the step, each where the step "
                 "uses or makes it\n",
                 comm.describe(), device_collectives.empty() ? "MPI" : device_collectives + " on the GPU");
    else if (ranks > 1 && gradients->sharded())
      fmt::print("  ranks      {}; gradients reduce-scattered by MPI on the host after each micro-batch's backward, "
                 "in {} bucket{} (not overlapped with it)\n",
                 comm.describe(), gradients->buckets(), gradients->buckets() == 1 ? "" : "s");
    else if (ranks > 1)
      fmt::print("  ranks      {}; gradients {} {}\n", comm.describe(), stage == 2 ? "reduced" : "all-reduced",
                 gradients->device_collectives().empty() ? "by MPI on the host after the backward (not overlapped with it)"
                                                        : "by " + gradients->device_collectives());
    // A device with no peak for the step's matmul dtype (the cpu has no f16
    // arithmetic) gives no MFU rather than a made-up one.
    std::string mfu_basis = peak > 0 ? fmt::format("MFU against {} peak {:.0f} GFLOP/s", p.device, peak / 1e9)
                                     : fmt::format("no MFU: the {} device has no peak for this precision", p.device);
    fmt::print("  step       {:.4g} GFLOP{} (static count), {} tokens{}; {}\n", p.flops_per_step / 1e9,
               ranks > 1 ? " per rank" : "", with_commas(p.tokens_per_step), ranks > 1 ? " per rank" : "", mfu_basis);
    fmt::print("{}", predicted_banner(p));
    if (ranks > 1)
      fmt::print("  (the prediction is one rank's compute; the all-reduce over {} ranks is not in it: `napkin report "
                 "--ranks {} --interconnect NAME` predicts it)\n",
                 ranks, ranks);
    if (ckpt) fmt::print("  checkpoints {} (run {}, keep {})\n", ckpt->path(), lineage.run, o.keep > 0 ? std::to_string(o.keep) : "all");
  }
  if (const std::string why = p.train.schedule.mismatch(o.steps); !why.empty() && rank0) {
    std::fflush(stdout);
    fmt::print(stderr, "warning: {}\n", why);
  }
  if (o.eval_every > 0 && !data->has_eval() && rank0) {
    std::fflush(stdout);
    fmt::print(stderr, "warning: --eval-every {} asks for a held-out loss, but there is no eval data: {}\n", o.eval_every,
               data->eval_problem());
  }
}

std::string TrainingRun::save(int64_t step) {
  if (o.checkpoint_dir.empty()) return "";
  std::map<std::string, std::string> metadata = build_metadata({p.train.dims, p.train.memory_budget});
  metadata.insert({{"model", p.model}, {"seed", std::to_string(seed)}, {kMicroBatchesKey, std::to_string(micro_batches)}});
  if (sharded_checkpoints) {
    // Each rank writes the tensors it owns into rank 0's temporary; once every file is on disk, rank 0
    // publishes the whole. A run without ZeRO holds everything everywhere and shares the writing out alike.
    ex.download(TensorRole::Param);
    ex.download(TensorRole::State);
    std::optional<OptimizerShards> replicated;
    if (!shards) replicated.emplace(program, ranks, comm.rank());
    const OptimizerShards& owners = shards ? *shards : *replicated;
    const std::vector<TensorRef> all = tensor_refs(p, ex, {TensorRole::Param, TensorRole::State});
    std::vector<int> owner;
    for (TensorRole role : {TensorRole::Param, TensorRole::State})
      for (const TensorSpec* t : p.with_role(role)) owner.push_back(owners.tensor_owner(*t));
    std::vector<TensorRef> mine;
    for (size_t i = 0; i < all.size(); ++i)
      if (owner[i] == comm.rank()) mine.push_back(all[i]);
    comm.set_activity(fmt::format("step {}, writing the sharded checkpoint", step));
    std::string temporary = rank0 ? ckpt->begin_sharded_save(step) : std::string();
    broadcast_text(comm, temporary);
    const ShardFile written = write_shard(temporary, comm.rank(), ranks, step, mine, p.hash, lineage.run, metadata);
    // Every file's size and CRC to rank 0, which then knows them all on disk.
    const int64_t measured[2] = {written.bytes, static_cast<int64_t>(written.crc)};
    std::vector<int64_t> files(2 * static_cast<size_t>(ranks));
    comm.all_gather(measured, sizeof measured, files.data());
    if (!rank0) return "";
    ShardedIndex index{step, ranks, p.hash, lineage.run, {}, {}};
    for (size_t i = 0; i < all.size(); ++i) index.weight_map.emplace_back(all[i].name, shard_filename(owner[i], ranks));
    for (int r = 0; r < ranks; ++r)
      index.files.push_back({shard_filename(r, ranks), files[2 * static_cast<size_t>(r)],
                             static_cast<uint32_t>(files[2 * static_cast<size_t>(r) + 1])});
    std::string path = ckpt->finish_sharded_save(temporary, index, o.keep);
    if (!quiet) fmt::print("  saved {}\n", path);
    return path;
  }
  // Into rank 0 from its group (hybrid sharding: every group holds the whole run; the first writes it).
  if (shards && (!group || comm.rank() < group_size)) {
    shards->gather_state(ex, shard_comm());
    if (stage == 3) shards->gather_params_to_root(ex, shard_comm());
  }
  if (!ckpt) return "";
  ex.download(TensorRole::Param);
  ex.download(TensorRole::State);
  std::string path = ckpt->save(step, tensor_refs(p, ex, {TensorRole::Param, TensorRole::State}), metadata, o.keep);
  if (shards) ex.release(shards->others_state());  // gathered for the file only
  if (shards && stage == 3) ex.release(shards->others_params());
  if (!quiet) fmt::print("  saved {}\n", path);
  return path;
}

void TrainingRun::stop_on_data_error(const Error& e, int64_t finished) {
  std::string note;
  if (!rank0) note = "rank 0 holds the checkpoints";
  else if (!ckpt) note = "no --checkpoint-dir: nothing saved";
  else if (shards || (sharded_checkpoints && ranks > 1))  // the other ranks' state, or files, are theirs, and they are not here
    note = fmt::format("the last checkpoint is step {}; fix the data, then --resume {}", last_saved, ckpt->path());
  else if (finished > last_saved) {
    try {
      note = fmt::format("saved step {} as {}; fix the data, then --resume {}", finished, save(finished), ckpt->path());
    } catch (const Error& save_error) {
      note = fmt::format("and saving step {} failed too: {}", finished, save_error.what());
    }
  }
  else note = fmt::format("the last checkpoint is step {}; fix the data, then --resume {}", last_saved, ckpt->path());
  throw Error(fmt::format("{}\n  stopped after step {}: {}", e.what(), finished, note));
}

std::optional<int> TrainingRun::loop() {
  metrics = MetricsFile(rank0 ? o.metrics : std::string());
  metrics.write(MetricsRecord().text("run", lineage.run).integer("start_step", start_step));
  current = start_step;
  if (o.debug_nan) watch_for_nan(ex, current);

  catch_stop_signals(on_interrupt);

  // --steps 0: nothing to train, but the initial weights (napkin's init, or
  // --init's) are worth having, e.g. to start another framework from them.
  if (o.steps == 0) {
    std::string path = save(0);  // every rank: ZeRO-1 gathers the (zero) state first
    if (rank0) fmt::print("--steps 0: saved the initial weights as {}\n", path);
    return 0;
  }

  last_saved = start_step;
  run_start = std::chrono::steady_clock::now();
  for (int64_t step = start_step + 1; step <= o.steps; ++step) {
    current = step;
    auto t0 = std::chrono::steady_clock::now();
    const auto [loss, interrupted] = train_step(step);
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    window_seconds += seconds;
    ++window_steps;
    step_times.add(seconds);

    if ((o.log_every > 0 && step % o.log_every == 0) || step == o.steps) report_progress(step, loss);
    if (o.eval_every > 0 && step % o.eval_every == 0 && data->has_eval()) evaluate(step);
    if (samples && step % o.sample_every == 0) {
      const std::string text = samples->sample(ex, o.sample_tokens, seed + static_cast<uint64_t>(step));
      fmt::print("step {:>6}/{}  sample:\n{}\n", step, o.steps, text);
      std::fflush(stdout);
    }
    if (o.checkpoint_every > 0 && step % o.checkpoint_every == 0) {
      save(step);
      last_saved = step;
    }
    if (interrupted) {
      if (last_saved != step) save(step);
      if (rank0)
        fmt::print(stderr, "interrupted after step {}{}\n", step, ckpt ? "; saved" : " (no --checkpoint-dir: nothing saved)");
      comm.barrier();  // the others wait for rank 0's checkpoint before the job ends
      return 130;
    }
  }
  return std::nullopt;
}

std::pair<double, bool> TrainingRun::train_step(int64_t step) {
  double loss_sum = 0;
  for (int64_t k = 0; k < accumulate; ++k) {
    // Micro-batch m of the step's global batch: rank r holds m = r·K .. r·K + K − 1.
    const int64_t m = comm.rank() * accumulate + k;
    try {
      data->fill_train(step - 1, m);
    } catch (const Error& e) {
      stop_on_data_error(e, step - 1);
    }
    set_rng(ex, seed, (step - 1) * micro_batches + m, /*training=*/true);
    ex.run_forward();
    loss_sum += ex.loss();
    for (size_t i = 0; i < metric_tensors.size(); ++i) {
      if (k == 0) std::fill(metric_values[i].begin(), metric_values[i].end(), 0.0);
      ex.download_tensor(*metric_tensors[i]);
      for (size_t e = 0; e < metric_values[i].size(); ++e)
        metric_values[i][e] += read_element(ex.host(*metric_tensors[i]), metric_tensors[i]->dtype, static_cast<int64_t>(e));
    }
    ex.run_backward();
    comm.set_activity(fmt::format("step {}, the gradient reduce-scatter", step));  // ZeRO-2's, per micro-batch
    gradients->add_micro_batch(k);
  }
  // The step's loss is the mean over every micro-batch of every rank; the
  // ranks agree on it, and on stopping after this step, before any update.
  std::vector<double> agreed{loss_sum, g_interrupted ? 1.0 : 0.0};
  for (const std::vector<double>& m : metric_values) agreed.insert(agreed.end(), m.begin(), m.end());
  comm.set_activity(fmt::format("step {}, summing the loss", step));
  comm.all_reduce_sum(agreed.data(), static_cast<int64_t>(agreed.size()));
  for (size_t i = 0, at = 2; i < metric_values.size(); at += metric_values[i].size(), ++i)
    std::copy_n(agreed.begin() + static_cast<std::ptrdiff_t>(at), metric_values[i].size(), metric_values[i].begin());
  const double loss = agreed[0] / static_cast<double>(micro_batches);
  const bool interrupted = agreed[1] > 0;
  if (!std::isfinite(loss)) {
    // A checkpoint to go back to: the one resumed from, or one this run saved.
    const bool saved = !o.resume.empty() || (ckpt && last_saved > start_step);
    throw Error(fmt::format("step {}: the loss is {}; stopped before the update ({}). "
                            "Run with --debug-nan to find the first op that produced a NaN",
                            step, loss,
                            saved  ? fmt::format("last checkpoint: step {}", last_saved)
                            : ckpt ? std::string("no checkpoint saved yet")
                                   : std::string("no --checkpoint-dir: nothing saved")));
  }
  comm.set_activity(fmt::format("step {}, the gradient all-reduce", step));
  gradients->finish();
  comm.set_activity(fmt::format("step {}, the optimizer", step));  // ZeRO-2 all-reduces the norm's parts in it
  ex.run_optimizer();
  if (shards && stage < 3) {  // ZeRO-3's next step gathers each parameter where it uses it
    comm.set_activity(fmt::format("step {}, gathering the parameters (ZeRO-{})", step, stage));
    // On the device where the engine joined the whole job's collectives (not a hybrid group's), else the host.
    const bool on_device =
        !group && ex.broadcast_params_on_device([owners = shards.get()](const std::string& param) { return owners->owner(param); });
    if (!on_device) shards->gather_params(ex, shard_comm());
  }
  comm.set_activity(fmt::format("after step {}", step));
  return {loss, interrupted};
}

void TrainingRun::report_progress(int64_t step, double loss) {
  double mean = window_seconds / static_cast<double>(window_steps);
  double flops = p.flops_per_step / mean;
  double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count();
  double eta = elapsed / static_cast<double>(step - start_step) * static_cast<double>(o.steps - step);
  double tokens_per_s = static_cast<double>(p.tokens_per_step * ranks) / mean;  // the whole job's
  Mfu mfu = mfu_of(flops, peak);
  if (mfu.exceeded && !warned_peak && rank0) {
    std::fflush(stdout);
    fmt::print(stderr, "{}", peak_exceeded_warning(p, flops));
    warned_peak = true;
  }
  if (!quiet)
    fmt::print("step {:>6}/{}  loss {:.4f}  {:7.2f} ms/step  {:>9.0f} tok/s  {:6.1f} GFLOP/s  MFU {}  ETA {}{}\n",
               step, o.steps, loss, mean * 1e3, tokens_per_s, flops / 1e9, mfu_text(mfu), human_duration(eta),
               metrics_text());
  std::fflush(stdout);
  metrics.write(with_step_metrics(MetricsRecord()
                    .integer("step", step)
                    .general("loss", loss, 9)
                    .fixed("step_ms", mean * 1e3, 4)
                    .fixed("tokens_per_s", tokens_per_s, 1)
                    .fixed("gflops", flops / 1e9, 3)
                    .fixed("mfu", mfu.known ? mfu.fraction : kUnknown, 4)
                    .fixed("predicted_step_ms", p.predicted.known ? p.predicted.step_seconds * 1e3 : kUnknown, 4)
                    .fixed("predicted_mfu", p.predicted.known && peak > 0 ? p.predicted.mfu : kUnknown, 4)));
  window_seconds = 0;
  window_steps = 0;
}

namespace {

// A metric as a record field: a number, or a list of numbers (one an expert).
void add_metric(MetricsRecord& record, const std::string& key, const std::vector<double>& values) {
  if (values.size() == 1)
    record.general(key, values[0], 9);
  else
    record.general_list(key, values, 9);
}

}  // namespace

std::string TrainingRun::metrics_text() const {
  double dropped = 0;
  bool moe = false;
  for (size_t i = 0; i < metric_tensors.size(); ++i)
    if (metric_tensors[i]->name.rfind("metric.moe_dropped.", 0) == 0) {
      moe = true;
      dropped += metric_values[i][0];
    }
  return moe ? fmt::format("  moe dropped {:.0f}", dropped) : std::string();
}

MetricsRecord TrainingRun::with_step_metrics(MetricsRecord record) const {
  std::vector<std::pair<std::string, MetricsRecord>> groups;  // in the program's order
  for (size_t i = 0; i < metric_tensors.size(); ++i) {
    const std::string name = metric_tensors[i]->name.substr(kMetricTensorPrefix.size());
    const size_t dot = name.find('.');
    if (dot == std::string::npos) {
      add_metric(record, name, metric_values[i]);
      continue;
    }
    const std::string group = name.substr(0, dot);
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == group; });
    if (it == groups.end()) it = groups.insert(groups.end(), {group, MetricsRecord()});
    add_metric(it->second, name.substr(dot + 1), metric_values[i]);
  }
  for (const auto& [group, inner] : groups) record.object(group, inner);
  return record;
}

void TrainingRun::evaluate(int64_t step) {
  // The eval batches are shared out: rank r takes batches r, r + N, ... A
  // ZeRO-3 forward gathers parameters, which every rank must reach: there
  // each rank runs as many forwards, the last ones of a short share on a
  // batch it does not count.
  double sum = 0;
  const int64_t rounds = stage == 3 ? (o.eval_batches + ranks - 1) / ranks : 0;
  if (collectives) collectives->set_counting(false);  // the step's collectives only
  for (int64_t b = comm.rank(), round = 0; b < o.eval_batches || round < rounds; b += ranks, ++round) {
    const bool counted = b < o.eval_batches;
    try {
      data->fill_eval(counted ? b : 0);
    } catch (const Error& e) {
      stop_on_data_error(e, step);
    }
    set_rng(ex, seed, step - 1, /*training=*/false);  // dropout off
    ex.run_forward();
    if (counted) sum += ex.loss();
  }
  if (collectives) collectives->set_counting(true);
  comm.set_activity(fmt::format("step {}, summing the eval loss", step));
  comm.all_reduce_sum(&sum, 1);
  double eval_loss = sum / static_cast<double>(o.eval_batches);
  if (!quiet) fmt::print("step {:>6}/{}  eval loss {:.4f} ({} batches)\n", step, o.steps, eval_loss, o.eval_batches);
  metrics.write(MetricsRecord().integer("step", step).general("eval_loss", eval_loss, 9));
}

int TrainingRun::finish() {
  if (last_saved != o.steps) save(o.steps);  // a no-op without a checkpoint dir
  if (!quiet) fmt::print("{}", end_of_run_summary(p, step_times));
  if (step_times.count() > 0) metrics.write(end_of_run_metrics(p, step_times));
  if (!quiet && !o.metrics.empty())
    fmt::print("metrics: {} (loss, tokens/s and MFU as charts: napkin plot {})\n", o.metrics, o.metrics);
  if (gradients->all_reduces() > 0) {
    // Ring all-reduce bus bandwidth (nccl-tests' convention): 2(N-1)/N of
    // the bytes cross each rank's link each way; `napkin report --ranks N
    // --interconnect NAME` predicts the same time from NAME's bandwidth.
    // A reduce-scatter moves half of that: (N-1)/N.
    const double seconds = gradients->all_reduce_seconds() / static_cast<double>(gradients->all_reduces());
    const double bytes = static_cast<double>(gradients->all_reduce_bytes());
    const double bus = seconds > 0 ? (gradients->sharded() ? 1.0 : 2.0) * (ranks - 1) / ranks * bytes / seconds : 0;
    if (!quiet && gradients->sharded())
      fmt::print("reduce-scatter: {} a step ({} micro-batch{} × {} bucket{}) in {:.3f} ms (mean of {}, the wait for "
                 "the slowest rank included): bus bandwidth {:.3g} GB/s\n",
                 human_bytes(bytes), accumulate, accumulate == 1 ? "" : "es", gradients->buckets(),
                 gradients->buckets() == 1 ? "" : "s", seconds * 1e3, gradients->all_reduces(), bus / 1e9);
    else if (!quiet && gradients->device_collectives().empty())
      fmt::print("all-reduce: {} a step in {:.3f} ms (mean of {}, the wait for the slowest rank included): bus "
                 "bandwidth {:.3g} GB/s\n",
                 human_bytes(bytes), seconds * 1e3, gradients->all_reduces(), bus / 1e9);
    else if (!quiet)  // overlapped: what the optimizer waited for after the backward, not the all-reduce's time
      fmt::print("{}: {} a step on the GPU; the optimizer waited {:.3f} ms a step for it after the backward "
                 "(mean of {})\n",
                 stage == 2 ? "reduce onto the owners" : "all-reduce", human_bytes(bytes), seconds * 1e3,
                 gradients->all_reduces());
    metrics.write(MetricsRecord()
                      .boolean("all_reduce", true)
                      .text("collective", gradients->sharded() ? "reduce_scatter" : "all_reduce")
                      .integer("ranks", ranks)
                      .integer("bytes", gradients->all_reduce_bytes())
                      .fixed("mean_ms", seconds * 1e3, 6)
                      .general("bus_gb_per_s", bus / 1e9, 6));
  }
  if (collectives && stage == 3 && step_times.count() > 0) {
    // ZeRO-3's collectives inside the step, per step and on this rank (rank 0), and what the rank waited for
    // them: all of their time where they block it, what the kernels before each use did not hide where the
    // gathers issued ahead run on their own thread.
    const double steps = static_cast<double>(o.steps - start_step);
    const ParameterCollectives::Totals& g = collectives->gathers();
    const ParameterCollectives::Totals& r = collectives->reduces();
    const double waited = collectives->waits().seconds;
    if (!quiet)
      fmt::print("zero-3: a step gathers {} in {} all-gathers ({:.3f} ms) and reduces {} in {} reduces ({:.3f} ms), "
                 "rank 0's; it waited {:.3f} ms for them ({})\n",
                 human_bytes(g.bytes / steps), static_cast<int64_t>(g.calls / steps), g.seconds / steps * 1e3,
                 human_bytes(r.bytes / steps), static_cast<int64_t>(r.calls / steps), r.seconds / steps * 1e3,
                 waited / steps * 1e3,
                 collectives->threaded() ? "the gathers issued ahead run on a thread of their own"
                                         : "all exposed: blocking MPI on the rank's thread");
    metrics.write(MetricsRecord()
                      .boolean("zero3_collectives", true)
                      .integer("ranks", ranks)
                      .boolean("prefetch_thread", collectives->threaded())
                      .fixed("wait_ms_per_step", waited / steps * 1e3, 6)
                      .general("gather_bytes_per_step", g.bytes / steps, 6)
                      .fixed("gather_ms_per_step", g.seconds / steps * 1e3, 6)
                      .general("reduce_bytes_per_step", r.bytes / steps, 6)
                      .fixed("reduce_ms_per_step", r.seconds / steps * 1e3, 6));
  }
  if (ranks > 1) {
    // Each rank's peak resident memory (what ZeRO-1 saves shows here), to rank 0.
    std::vector<double> peaks(static_cast<size_t>(ranks), 0.0);
    peaks[static_cast<size_t>(comm.rank())] = static_cast<double>(peak_resident_bytes());
    comm.all_reduce_sum(peaks.data(), ranks);
    std::string list;
    for (double b : peaks) list += (list.empty() ? "" : ", ") + human_bytes(b);
    std::string expected;
    for (const RankMemory& m : predicted)
      expected += (expected.empty() ? "" : ", ") + human_bytes(static_cast<double>(m.total()));
    if (!quiet)
      fmt::print("memory: peak resident per rank {}{}\n", list, expected.empty() ? "" : "; predicted " + expected);
    // The arena's part of it too: what `napkin report --ranks N` predicts per rank.
    std::vector<double> predicted_bytes, predicted_arena;
    for (const RankMemory& m : predicted) {
      predicted_bytes.push_back(static_cast<double>(m.total()));
      predicted_arena.push_back(static_cast<double>(m.arena - m.others_params - m.others_state - m.others_grads));
    }
    metrics.write(MetricsRecord()
                      .fixed_list("peak_resident_bytes", peaks, 0)
                      .fixed_list("predicted_resident_bytes", predicted_bytes, 0)
                      .fixed_list("predicted_arena_bytes", predicted_arena, 0)
                      .integer("zero", shards ? stage : 0));
  }
  if (const std::optional<DeviceArenaMemory> device = ex.device_arena_memory()) {
    // What each rank's GPU held of the arena at most (ZeRO-1: its own share of the optimizer state).
    std::vector<double> mapped(static_cast<size_t>(ranks), 0.0);
    mapped[static_cast<size_t>(comm.rank())] = static_cast<double>(device->peak_mapped);
    comm.all_reduce_sum(mapped.data(), ranks);
    std::string list;
    for (double b : mapped) list += (list.empty() ? "" : ", ") + human_bytes(b);
    if (!quiet)
      fmt::print("device arena: peak mapped {}{} of {} reserved\n", ranks > 1 ? "per rank " : "", list,
                 human_bytes(static_cast<double>(device->reserved)));
  }
  if (o.profile && rank0) {
    const int64_t profiled = (o.steps - start_step) * accumulate;
    fmt::print("{}", profile_report(program, ex.kernel_seconds(), profiled));
    metrics.write(profile_metrics(ex.kernel_seconds(), profiled));
  }
  comm.barrier();  // rank 0's last checkpoint is on disk before any rank reports success
  return 0;
}

int run(const Options& o, const Program& built, const EngineFactory& make_engine, const SamplerProgram& sampler_program,
        Communicator& comm) {
  Program program = built;
  if (o.bucket_mib > 0) program.bucket_bytes = o.bucket_mib * 1024 * 1024;
  TrainingRun training(o, std::move(program), make_engine, comm);
  if (std::optional<int> status = training.setup(sampler_program)) return *status;
  training.banner();
  if (std::optional<int> status = training.loop()) return *status;
  return training.finish();
}

// One rank's run: the communicator first (MPI must start before anything
// else can fail), then run(). A rank of a job that meets an error says so
// with its rank and ends the whole job: the others would wait for it forever.
int run_rank(const Options& o, const Program& p, const EngineFactory& make_engine, const SamplerProgram& sampler) {
  std::unique_ptr<Communicator> comm = open_communicator(o.collective_timeout);
  if (comm->size() == 1) return run(o, p, make_engine, sampler, *comm);
  try {
    return run(o, p, make_engine, sampler, *comm);
  } catch (const EveryRankStops& e) {
    // Every rank found the same differences (or the same --memory-limit
    // overrun): rank 0 says them, and they all end (MPI finalized) with
    // status 1, none waiting for another.
    std::fflush(stdout);
    if (comm->rank() == 0) write_stderr_line(fmt::format("error: {}", e.what()));
    return 1;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    bool user = dynamic_cast<const Error*>(&e) != nullptr;
    write_stderr_line(fmt::format("{}: rank {} of {}: {}{}", user ? "error" : "internal error", comm->rank(),
                                  comm->size(), e.what(),
                                  user ? "" : "\nthis is a bug in napkin's runtime, not in your model or data"));
    comm->abort(user ? 1 : 2);
  }
  return 1;  // not reached: abort ends the job
}

}  // namespace

int trainer_main(int argc, char** argv, const char* program_json, size_t program_json_size,
                 const EngineFactory& make_engine, const SamplerProgram& sampler) {
  try {
    Program p = parse_program(program_json, program_json_size);
    // An inference program (napkin sample) is a sampler, not a trainer.
    // main() blocked SIGINT and SIGTERM: a sampler takes their default action
    // (no thread exists yet to inherit the mask), a trainer its signal thread.
    if (!p.with_role(TensorRole::Output).empty()) {
      unblock_stop_signals();
      return sampler_main(argc, argv, p, make_engine);
    }
    start_stop_signal_thread();
    Options o;
    const TrainDefaults& d = p.train;
    o.steps = d.steps;
    o.seed = d.seed;
    o.checkpoint_dir = d.checkpoint_every > 0 ? d.checkpoint_dir : "";
    o.checkpoint_every = d.checkpoint_every;
    o.keep = d.checkpoint_keep;
    o.eval_every = d.eval_every;
    o.eval_batches = d.eval_batches;
    o.log_every = d.log_every;
    o.metrics = d.metrics;

    CLI::App app{fmt::format("napkin trainer for {} (generated by napkin; the model's YAML sets the defaults)", p.model)};
    // Counts are checked as text, so an out-of-range or negative number is an
    // error naming the range, never saturated or wrapped.
    constexpr uint64_t kMaxSteps = 1'000'000'000'000;  // 10^12 steps: beyond any run
    constexpr uint64_t kMaxThreads = 1024;
    app.add_option("--steps", o.steps, "total steps to train (a resumed run continues up to it; 0: save the initial "
                                       "weights to --checkpoint-dir and exit)")
        ->check(whole_number_in(0, kMaxSteps))->capture_default_str();
    app.add_option("--seed", o.seed, "seed of init and data sampling")
        ->check(whole_number_in(0, UINT64_MAX))->capture_default_str();
    app.add_option("--data", o.data, "token file (u16/i32 as the model says) instead of the model's train.data");
    app.add_option("--data-file", o.data_files, "NAME=PATH.npy: an input's .npy file (repeat per input)");
    app.add_option("--order", o.order, "random | sequential batches")->check(CLI::IsMember({"random", "sequential"}));
    app.add_option("--init", o.init, "start from these weights (.safetensors with every parameter by name; a napkin "
                                     "checkpoint's optimizer state is ignored)");
    app.add_option("--resume", o.resume, "continue from the newest checkpoint in DIR (or this checkpoint file)");
    CLI::Option* dir_flag = app.add_option("--checkpoint-dir", o.checkpoint_dir, "where checkpoints go")->capture_default_str();
    CLI::Option* every_flag = app.add_option("--checkpoint-every", o.checkpoint_every,
                                             "save every K steps (0: only at the end, and only with an explicit "
                                             "--checkpoint-dir or --resume)")
        ->check(whole_number_in(0, kMaxSteps))->capture_default_str();
    app.add_option("--checkpoint-format", o.checkpoint_format,
                   "sharded: each rank writes the tensors it owns into DIR/step-N.sharded/ (one file per rank and "
                   "an index); single: rank 0 writes one file (a ZeRO job gathers the optimizer state to it first); "
                   "default: sharded for a job of several ranks with --zero 1 or more, single otherwise")
        ->check(CLI::IsMember({"sharded", "single"}));
    app.add_option("--keep", o.keep, "checkpoints of this run to keep (0: all)")
        ->check(whole_number_in(0, kMaxSteps))->capture_default_str();
    app.add_option("--eval-every", o.eval_every, "held-out loss every K steps (0: never)")
        ->check(whole_number_in(0, kMaxSteps))->capture_default_str();
    app.add_option("--eval-batches", o.eval_batches, "batches per evaluation")
        ->check(whole_number_in(1, kMaxSteps))->capture_default_str();
    app.add_option("--log-every", o.log_every, "progress line every K steps (0: only the last)")
        ->check(whole_number_in(0, kMaxSteps))->capture_default_str();
    app.add_option("--metrics", o.metrics, "append JSON lines of metrics to this file (never truncated; the default "
                                           "is the model's train.log.metrics, a --dims build's with @dims)")
        ->capture_default_str();
    app.add_option("--threads", o.threads, "threads (0, the default: the CPUs this process may use)")
        ->check(whole_number_in(0, kMaxThreads));
    app.add_option("--accumulate", o.accumulate,
                   "micro-batches per rank whose gradients one step averages (0, the default: the model's "
                   "train.accumulate, else 1); a step's global batch is ranks × this × the model's batch")
        ->check(whole_number_in(0, 1'000'000));
    app.add_option("--collective-timeout", o.collective_timeout,
                   "seconds a rank of a job waits in one collective for the others before it ends the job (0: "
                   "forever)")
        ->check(number_in(0, 1e7))->capture_default_str();
    app.add_option("--zero", o.zero,
                   "ZeRO stage of a multi-rank job: 1 shards the optimizer's work and state across the ranks (each "
                   "updates its own parameters); 2 also the gradients (reduce-scattered, each rank keeping the sum "
                   "of its own); 3 also the parameters (a trainer built with `napkin build --zero 3`, whose step "
                   "gathers each parameter where it uses it); 0: every rank updates everything. Default: 3 for a "
                   "trainer built for it, else 0")
        ->check(CLI::IsMember({0, 1, 2, 3}));
    app.add_option("--shard-group", o.shard_group,
                   "hybrid sharding under --zero 1, 2 or 3: shard within groups of this many consecutive ranks and "
                   "replicate across the groups (each group's owners sum their gradients over the groups); 0, the "
                   "default: the job is one group")
        ->check(whole_number_in(0, 1'000'000));
    app.add_option("--memory-limit", o.memory_limit,
                   "bytes one rank may hold (e.g. 2GiB or 1500MB): a CPU job whose predicted memory per rank (the "
                   "banner's) is over it stops before step 1, saying which --zero and rank count would fit")
        ->transform(CLI::AsSizeValue(true))
        ->check(whole_number_in(1, INT64_MAX));
    app.add_option("--bucket-mib", o.bucket_mib,
                   "a GPU job all-reduces its gradients in buckets of at least this many MiB, each as soon as the "
                   "backward has written it (default: the program's, 25)")
        ->check(number_in(1e-6, 1e6));
    app.add_option("--sample-every", o.sample_every,
                   "print a sample of the model every K steps (0: never; a language model's CPU trainer)")
        ->check(whole_number_in(0, kMaxSteps))->capture_default_str();
    app.add_option("--tokenizer", o.tokenizer,
                   "the tokenizer.json --sample-every's samples decode by (default: the model's train.data.tokenizer)");
    app.add_option("--sample-tokens", o.sample_tokens, "tokens in each --sample-every sample")
        ->check(whole_number_in(1, 100000))->capture_default_str();
    app.add_flag("--debug-nan", o.debug_nan, "check every op's output; name the first that produces a NaN");
    app.add_flag("--profile", o.profile, "time every kernel and print the slowest");
    app.add_flag("--quiet", o.quiet, "no progress lines");
    app.add_flag("--print-program", o.print_program, "print the program description (JSON) and exit");
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      // --help is a success; every mistake in the flags is a user error (1),
      // whatever code CLI11 gives its kind of error.
      return app.exit(e) == 0 ? 0 : 1;
    }
    if (o.print_program) {
      std::fwrite(program_json, 1, program_json_size, stdout);
      std::fputc('\n', stdout);
      return 0;
    }
    if (dir_flag->count() > 0 && o.checkpoint_dir.empty())
      throw Error("--checkpoint-dir is empty: name a directory (without --checkpoint-dir and --checkpoint-every no "
                  "checkpoints are written)");
    // --checkpoint-every 0 alone turns the model's own checkpoints off (a
    // benchmark, a quick try: nothing lands in the model's directory).
    if (every_flag->count() > 0 && o.checkpoint_every == 0 && dir_flag->count() == 0) o.checkpoint_dir.clear();
    // A resumed run saves where it came from unless told otherwise.
    if (!o.resume.empty() && dir_flag->count() == 0) {
      std::error_code ec;
      std::string resumed = o.resume;
      while (resumed.size() > 1 && resumed.back() == '/') resumed.pop_back();
      o.checkpoint_dir = std::filesystem::is_directory(resumed, ec) && !is_sharded_checkpoint(resumed)
                             ? resumed
                             : std::filesystem::path(resumed).parent_path().string();
      if (o.checkpoint_dir.empty()) o.checkpoint_dir = ".";
    }
    if (o.checkpoint_every > 0 && o.checkpoint_dir.empty()) o.checkpoint_dir = d.checkpoint_dir.empty() ? "checkpoints" : d.checkpoint_dir;
    if (o.steps == 0 && o.checkpoint_dir.empty())
      throw Error("--steps 0 trains nothing; to save the initial weights, add --checkpoint-dir DIR");
    return run_rank(o, p, make_engine, sampler);
  } catch (const Error& e) {
    std::fflush(stdout);
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    fmt::print(stderr, "internal error: {}\nthis is a bug in napkin's runtime, not in your model or data\n", e.what());
    return 2;
  }
}

}  // namespace napkin::runtime
