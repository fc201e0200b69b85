// A generated trainer's program: what its object file carries besides the
// kernels' code (codegen/program_json.cpp builds it; docs/runtime.md lists
// the fields). Written and parsed in one place (program.cpp: the JSON of
// each struct, both ways), parsed once at startup; fixed for the run.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/init.h"
#include "runtime/kernel_spec.h"
#include "runtime/lr_schedule.h"

namespace napkin::runtime {

struct TensorSpec {
  std::string name;
  TensorRole role = TensorRole::Param;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  int64_t offset = 0, bytes = 0;
  ParamInit init;  // params
  std::string param;  // state: the parameter it belongs to ("" when shared)
  // An input whose values are ids (tokens, targets): they must be below it
  // (an embedding's rows, a cross-entropy's classes); 0: not ids.
  int64_t index_bound = 0;
  int64_t numel() const;
  bool operator==(const TensorSpec&) const = default;
};

// The time model's prediction for one step (analysis/step_time.h), made by
// napkin when it built the trainer, for the program's device.
struct PredictedStep {
  bool known = false;  // false: the device is not in napkin's table
  double step_seconds = 0, launch_seconds = 0, mfu = 0;
  int kernels_without_peak = 0;
  std::map<std::string, double> class_seconds;  // by the time model's kernel class
  bool operator==(const PredictedStep&) const = default;
};

// A parameter's gradient between the backward and the optimizer
// (codegen/plan.h PlannedGradient): dense bytes [offset, offset + bytes).
struct GradientSpec {
  std::string param;
  DType dtype = DType::F32;
  int64_t offset = 0, bytes = 0;
  int ready_after = 0;  // the last kernel writing it
  int64_t numel() const;
  bool operator==(const GradientSpec&) const = default;
};

struct UpdateSpec {
  std::string target;
  int64_t from = 0, to = 0, bytes = 0;
  std::string param;  // the parameter whose update it is ("" for shared state)
  bool operator==(const UpdateSpec&) const = default;
};

struct DataDefaults {
  std::string format;  // "" when the model names no data
  std::string path, dtype = "u16", order = "random";
  std::map<std::string, std::string> files;
  double split = 0.9;
  std::string tokenizer;  // the tokenizer.json the token file was encoded with ("": none)
  bool operator==(const DataDefaults&) const = default;
};

struct TrainDefaults {
  int64_t steps = 0;
  uint64_t seed = 0;
  int64_t accumulate = 1;
  DataDefaults data;
  int64_t eval_every = 0, eval_batches = 1;
  int64_t checkpoint_every = 0, checkpoint_keep = 2;
  std::string checkpoint_dir;
  int64_t log_every = 1;
  std::string metrics;
  std::string optimizer, precision;
  double lr = 0;
  LrSchedule schedule;  // a program without one (written by hand): constant lr
  // How napkin built the step (ir/training_config.h): the --dims ("" for the
  // model file's own) and the --memory-budget in bytes (0: none).
  std::string dims;
  int64_t memory_budget = 0;
  bool operator==(const TrainDefaults&) const = default;
};

// What a CUDA program adds (backend "cuda"): the architecture its cubin was
// compiled for, the scratch buffer its launches share, and whether fp32
// matmuls may use TF32 tensor cores.
struct CudaSpec {
  std::string arch;  // "sm_90"
  int64_t scratch_bytes = 0;
  bool tf32 = false;
  bool operator==(const CudaSpec&) const = default;
};

struct Program {
  std::string model, hash, backend, device;
  int64_t arena_bytes = 0, liveness_peak = 0;
  // One forward + backward + update of one micro-batch; the forward and
  // the optimizer phase alone (a step of K micro-batches counts
  // K·(flops_per_step − flops_optimizer) + flops_optimizer).
  double flops_per_step = 0, flops_forward = 0, flops_optimizer = 0, peak_flops = 0;
  // Where peak_flops comes from (a datasheet, or `napkin devices --measure`
  // on a named host and date), and the local device file it was read from.
  std::string peak_source, device_file;
  PredictedStep predicted;
  int64_t tokens_per_step = 0;
  std::vector<TensorSpec> tensors;
  std::vector<KernelSpec> kernels;
  // kernels [0, num_setup_kernels): an inference program's setup (what its
  // parameters and constants alone give, run once after they load); then
  // [num_setup_kernels, num_forward_kernels): the forward (a prefill).
  int num_setup_kernels = 0;
  int num_forward_kernels = 0;
  int num_gradient_kernels = 0;  // kernels [0, n): forward and backward; the rest: the optimizer
  std::vector<GradientSpec> gradients;
  // Gradients are all-reduced in buckets of at least this many bytes, each
  // as soon as the backward has written it (analysis/distributed.h's
  // kBucketBytes, which the report's prediction assumes; --bucket-mib).
  double bucket_bytes = 25.0 * 1024 * 1024;
  std::vector<UpdateSpec> updates;
  TrainDefaults train;
  CudaSpec cuda;  // backend "cuda" only

  const TensorSpec* find(const std::string& name) const;
  const TensorSpec& loss() const;
  std::vector<const TensorSpec*> with_role(TensorRole role) const;
  bool operator==(const Program&) const = default;
};

// A training program's step metrics: Metric tensors named
// "metric.<group>.<key>" (a moe() layer's dropped pairs,
// metric.moe_dropped.layers.0, a scalar; its experts' assignments,
// metric.moe_load.layers.0, one number an expert) that the trainer sums
// over a step's micro-batches and ranks and logs beside the loss
// (docs/runtime.md).
inline constexpr std::string_view kMetricTensorPrefix = "metric.";
std::vector<const TensorSpec*> step_metrics(const Program& program);

// What a trainer says when kernel `kernel` met an embedding or class id (or
// a moe_slots kernel an expert index) outside [0, bound): the kernel's name
// and YAML line, the id, and what to check. Both the CPU runtime and the
// CUDA one report it so.
std::string bad_index_message(const Program& program, int64_t kernel, int64_t id, int64_t bound);

// The program as JSON text (what a trainer carries, `napkin build
// --emit-program` prints), and back: throws Error on malformed JSON or a
// missing field (a corrupt binary).
std::string program_json(const Program& program);
Program parse_program(const char* json, size_t size);
// The "train" object alone (a cache of built trainers keys on it).
std::string train_defaults_json(const TrainDefaults& train);

}  // namespace napkin::runtime
