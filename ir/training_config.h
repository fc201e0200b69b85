// What the model file says about training, beyond the forward graph: loss,
// optimizer, precision policy and the trainer's settings. The frontend fills
// it in and validates it; the optimizer, mixed-precision and runtime stages
// give it meaning.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ir/diagnostics.h"
#include "ir/dtype.h"

namespace napkin::ir {

enum class OptimizerKind : uint8_t { SGD, Momentum, AdaGrad, RMSProp, Adam, AdamW };
enum class PrecisionPolicy : uint8_t { FP32, BF16Mixed, FP16Mixed, FP8Mixed };

inline constexpr OptimizerKind kAllOptimizers[] = {OptimizerKind::SGD,     OptimizerKind::Momentum,
                                                   OptimizerKind::AdaGrad, OptimizerKind::RMSProp,
                                                   OptimizerKind::Adam,    OptimizerKind::AdamW};
inline constexpr PrecisionPolicy kAllPrecisions[] = {PrecisionPolicy::FP32, PrecisionPolicy::BF16Mixed,
                                                     PrecisionPolicy::FP16Mixed, PrecisionPolicy::FP8Mixed};

// The names used in model files and reports: "sgd" ... "adamw"; "fp32", "bf16-mixed", ...
std::string_view optimizer_name(OptimizerKind k);
std::string_view precision_name(PrecisionPolicy p);
// The inverse of the above; std::nullopt for an unknown name. Exact unless
// ignore_case (model files are exact; the estimate CLI accepts "AdamW").
std::optional<OptimizerKind> parse_optimizer(std::string_view name, bool ignore_case = false);
std::optional<PrecisionPolicy> parse_precision(std::string_view name, bool ignore_case = false);

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::AdamW;
  double lr = 1e-3;
  double momentum = 0;       // momentum (sgd with momentum), rmsprop
  bool nesterov = false;
  double beta1 = 0.9, beta2 = 0.999;
  double eps = 1e-8;
  double alpha = 0.99;       // rmsprop decay of the squared-gradient average
  double weight_decay = 0;
  double grad_clip = 0;      // global-norm clip; 0: off
  std::string schedule = "constant";  // "constant" | "cosine"
  int64_t warmup_steps = 0;
  double min_lr = 0;         // cosine floor
  std::vector<std::string> no_decay;  // glob patterns of parameter names
};

struct LossScaleConfig {
  double init_scale = 65536;
  int64_t growth_interval = 2000;
  double growth_factor = 2;
  double backoff_factor = 0.5;
};

// One entry of `precision: {fp32: [...]}`: a glob pattern selecting ops that
// stay in f32 under a mixed policy (passes/mixed_precision.h defines what a
// pattern selects), and where the model file wrote it, for the error when it
// selects nothing.
struct PrecisionOverride {
  std::string pattern;
  SourceLoc loc;
};

struct PrecisionConfig {
  PrecisionPolicy policy = PrecisionPolicy::FP32;
  LossScaleConfig loss_scale;  // used by fp16-mixed
  std::vector<PrecisionOverride> fp32;  // ops kept in f32 under a mixed policy
};

// The low-precision dtype a policy computes contractions in: bf16 for
// bf16-mixed and fp8-mixed (fp8 quantizes the bf16 operands), f16 for
// fp16-mixed, f32 for fp32.
DType low_precision_dtype(PrecisionPolicy p);

struct DataSource {
  std::string format;  // "tokens" (raw token file) | "npy" (one .npy per input)
  std::string path;    // tokens: the token file
  std::string token_dtype = "u16";  // tokens: "u16" | "u32" | "i32"
  std::map<std::string, std::string> files;  // npy: input name -> path
  std::string order = "random";  // "random" | "sequential"
  double split = 0.9;            // tokens: fraction of the file used for training
};

struct TrainConfig {
  int64_t steps = 100;
  uint64_t seed = 0;
  bool has_data = false;
  DataSource data;
  int64_t eval_every = 0;  // 0: no eval
  int64_t eval_batches = 1;
  int64_t checkpoint_every = 0;  // 0: no checkpoints
  std::string checkpoint_dir;     // "" until the frontend sets it: checkpoints/<model> by default
  int64_t checkpoint_keep = 2;
  int64_t log_every = 1;
  std::string metrics_path;  // JSONL; empty: none. A --dims variant's gets @dims before the extension
  int64_t tokens_per_step = 0;  // 0: derived from the inputs (see docs/report.md)
  // Micro-batches whose gradients one optimizer step averages (gradient
  // accumulation): the model's batch dim is one micro-batch, and a step is
  // accumulate forward+backward passes, then one update. The trainer's
  // --accumulate overrides it (docs/distributed.md).
  int64_t accumulate = 1;
  // How the step was built, for checkpoints to record and a resume under
  // other settings to name: the --dims it was lowered at ("d=64,layers=2";
  // "" for the file's own) and the --memory-budget its activations were
  // recomputed to fit (bytes; 0: none). Both change the step's hash.
  std::string dims;
  int64_t memory_budget = 0;
};

struct TrainingConfig {
  OptimizerConfig optimizer;
  PrecisionConfig precision;
  TrainConfig train;
};

}  // namespace napkin::ir
