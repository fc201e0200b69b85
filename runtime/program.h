// A generated trainer's program: what its object file carries besides the
// kernels' code (codegen/program_json.cpp writes it; docs/runtime.md lists
// the fields). Parsed once at startup; everything here is fixed for the run.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "runtime/attention.h"
#include "runtime/cached_attention.h"
#include "runtime/classifier.h"
#include "runtime/gemm.h"
#include "runtime/init.h"
#include "runtime/lr_schedule.h"

namespace napkin::runtime {

struct TensorSpec {
  std::string name;
  std::string role;  // "param", "state", "input", "rng", "loss"
  std::string dtype;
  std::vector<int64_t> shape;
  int64_t offset = 0, bytes = 0;
  ParamInit init;  // params
  std::string param;  // state: the parameter it belongs to ("" when shared)
  // An input whose values are ids (tokens, targets): they must be below it
  // (an embedding's rows, a cross-entropy's classes); 0: not ids.
  int64_t index_bound = 0;
  int64_t numel() const;
};

// A GEMM epilogue (codegen/plan.h GemmEpilogueOperands): the product's f32
// sums are not stored at c; D = cast(act(sums + residual + bias)) is, at d
// (or D = cast(gelu'(aux) * sums), a gelu's gradient). The
// CPU runs the kernel's generated loop function on each panel of sums
// (runtime/executor.h); CUDA, cuBLASLt's bias epilogue and C operand.
struct GemmEpilogueSpec {
  bool on = false;
  int64_t d = 0, residual = -1, bias = -1;  // byte offsets; -1: none (the residual is [rows, n] as D, the bias [n] f32)
  std::string d_dtype;                       // "f32", "bf16" or "f16"
  // "none"; "gelu": D = gelu(...), aux (if >= 0) = its input stored in D's
  // dtype; "gelu_grad": D = gelu'(aux) * sums, aux read.
  std::string activation = "none";
  int64_t aux = -1;  // byte offset of the gelu's input ([rows, n] in D's dtype), -1: none
};

struct MatmulSpec {
  int64_t a = 0, b = 0, c = 0;  // byte offsets of the operands' first elements
  std::string a_dtype, b_dtype, c_dtype;  // "f32", "f64", "bf16", "f16" (runtime/gemm.h says which mix)
  MatmulDesc desc;
  GemmEpilogueSpec epilogue;
  // Byte offset of the f32 [n] sums of B over k, stored besides C (a weight
  // gradient's GEMM storing its layer's bias gradient: cuBLASLt's BGRADA on
  // CUDA, runtime/gemm.h sum_b_over_k on the CPU); -1: none. Not with an
  // epilogue or a batch; C is f32.
  int64_t bias_grad = -1;
};

// A fused attention kernel (runtime/attention.h): its descriptor and where
// each operand starts in the arena (do, dq, dk, dv: backward only).
struct AttentionSpec {
  bool backward = false;
  std::string dtype;
  AttentionDesc desc;
  int64_t q = 0, k = 0, v = 0, o = 0, lse = 0, d_o = 0, dq = 0, dk = 0, dv = 0;  // byte offsets
};

// An attention against a KV cache (runtime/cached_attention.h): its
// descriptor and where each operand starts in the arena.
struct CachedAttentionSpec {
  std::string dtype;
  CachedAttentionDesc desc;
  int64_t q = 0, k = 0, v = 0, k_cache = 0, v_cache = 0, o = 0, positions = 0;  // byte offsets
};

// A fused classifier kernel (runtime/classifier.h): its descriptor and where
// each operand starts in the arena (loss forward; dloss, dx, dw backward).
struct ClassifierSpec {
  bool backward = false;
  std::string dtype;
  ClassifierDesc desc;
  int64_t x = 0, w = 0, targets = 0, loss = 0, lse = 0, dloss = 0, dx = 0, dw = 0;  // byte offsets
  // Backend "cuda": the vocabulary in `chunks` chunks of `chunk` classes, and
  // the byte offsets in the scratch buffer of the chunk's logits and of dx's
  // f32 sums (-1: none; codegen/cuda/kernel_source.h, CudaClassifierLayout).
  struct Cuda {
    int64_t chunk = 0, chunks = 0, logits = 0, dx_acc = -1;
  } cuda;
};

// One launch of a CUDA kernel function (backend "cuda"; codegen/cuda/kernel_source.h).
struct CudaLaunchSpec {
  std::string function;
  int64_t grid = 1;
  int block = 1, shared_bytes = 0;
  std::vector<int64_t> offsets;  // the function's third parameter: operand byte offsets in the arena
};

struct KernelSpec {
  std::string name, where, phase;
  bool is_matmul = false;
  bool is_attention = false;
  bool is_classifier = false;
  bool is_cached_attention = false;
  int64_t extent = 1;
  bool parallel = false;
  bool combine = false;  // then called once more with [extent, extent + 1) (codegen/plan.h Launch)
  int64_t out_offset = 0, out_numel = 0;
  std::string out_dtype;
  MatmulSpec matmul;  // is_matmul
  AttentionSpec attention;  // is_attention
  ClassifierSpec classifier;  // is_classifier
  CachedAttentionSpec cached_attention;  // is_cached_attention
  std::vector<CudaLaunchSpec> cuda_launches;  // backend "cuda", loop kernels: in order
  // Optimizer phase: the parameters whose update the kernel computes; empty
  // with `shared` when every rank runs it (codegen/plan.h Kernel::serves).
  std::vector<std::string> serves;
  bool shared = true;
  // A CPU batch kernel in the optimizer phase: its members in order, each
  // with its work items (consecutive dim-0 indices) and what it serves.
  struct Member {
    int64_t work = 0;
    std::vector<std::string> serves;
    bool shared = true;
  };
  std::vector<Member> members;
  // The time model's view of the kernel (analysis/step_time.h), when the
  // device is known: its class ("matmul", "attention", ...), work, and
  // predicted seconds (-1: the device has no peak for its dtype).
  std::string kernel_class;
  double flops = 0, bytes = 0, predicted_seconds = -1;
};

// The time model's prediction for one step (analysis/step_time.h), made by
// napkin when it built the trainer, for the program's device.
struct PredictedStep {
  bool known = false;  // false: the device is not in napkin's table
  double step_seconds = 0, launch_seconds = 0, mfu = 0;
  int kernels_without_peak = 0;
};

// A parameter's gradient between the backward and the optimizer
// (codegen/plan.h PlannedGradient): dense bytes [offset, offset + bytes).
struct GradientSpec {
  std::string param, dtype;
  int64_t offset = 0, bytes = 0;
  int ready_after = 0;  // the last kernel writing it
  int64_t numel() const;
};

struct UpdateSpec {
  std::string target;
  int64_t from = 0, to = 0, bytes = 0;
  std::string param;  // the parameter whose update it is ("" for shared state)
};

struct DataDefaults {
  std::string format;  // "" when the model names no data
  std::string path, dtype = "u16", order = "random";
  std::map<std::string, std::string> files;
  double split = 0.9;
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
};

// What a CUDA program adds (backend "cuda"): the architecture its cubin was
// compiled for, the scratch buffer its launches share, and whether fp32
// matmuls may use TF32 tensor cores.
struct CudaSpec {
  std::string arch;  // "sm_90"
  int64_t scratch_bytes = 0;
  bool tf32 = false;
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
  std::vector<const TensorSpec*> with_role(const std::string& role) const;
};

// What a trainer says when kernel `kernel` met an embedding or class id
// outside [0, bound): the kernel's name and YAML line, the id, and what to
// check. Both the CPU runtime and the CUDA one report it so.
std::string bad_index_message(const Program& program, int64_t kernel, int64_t id, int64_t bound);

// Throws Error on malformed JSON or a missing field (a corrupt binary).
Program parse_program(const char* json, size_t size);

}  // namespace napkin::runtime
