#include "analysis/estimate.h"

#include <fmt/format.h>

#include "ir/training_config.h"

namespace napkin::analysis {

namespace {

// Optimizer state is fp32 in every precision policy (as in torch.optim and the
// lecture): 4 bytes per buffer per parameter.
double optimizer_state_bytes(ir::OptimizerKind k) {
  switch (k) {
    case ir::OptimizerKind::SGD: return 0;
    case ir::OptimizerKind::Momentum: return 4;  // velocity
    case ir::OptimizerKind::AdaGrad: return 4;   // running sum of squared gradients
    // Running mean of squared gradients (torch adds a 4-byte momentum buffer
    // only when momentum > 0).
    case ir::OptimizerKind::RMSProp: return 4;
    case ir::OptimizerKind::Adam: return 8;      // first and second moments
    case ir::OptimizerKind::AdamW: return 8;
  }
  return 0;
}

// Bytes of the parameters and gradients the step reads and writes.
//
// Mixed precision follows the lecture's bf16 convention: bf16 params and bf16
// grads, 2 + 2. The fp32 master copy that real mixed-precision training keeps for
// the update is NOT counted; the lecture's caveat notes that with it (+4) bf16
// saves no memory over fp32, only time. Hence adamw: fp32 4+4+8 = 16, bf16-mixed
// 2+2+8 = 12.
//
// fp8-mixed counts the same 2 + 2 as bf16-mixed. fp8 is a compute format here:
// matmul operands are cast to fp8 with per-tensor scales on the fly (as in
// NVIDIA Transformer Engine), so the fp8 copies are transient. The weights the
// optimizer updates stay in bf16 because an fp8 weight cannot absorb small updates
// (e4m3's eps is 0.125), and gradients stay bf16 because their range needs more
// than fp8 offers without per-tensor scaling of every gradient. fp8 saves compute
// and activation memory, not parameter memory.
struct ParamBytes {
  double params;
  double grads;
};
ParamBytes param_bytes(ir::PrecisionPolicy p) {
  switch (p) {
    case ir::PrecisionPolicy::FP32: return {4, 4};
    case ir::PrecisionPolicy::BF16Mixed: return {2, 2};
    case ir::PrecisionPolicy::FP16Mixed: return {2, 2};
    case ir::PrecisionPolicy::FP8Mixed: return {2, 2};
  }
  return {0, 0};
}

// "a, b, c" in enum order.
template <class Kind, size_t N>
std::string names_of(const Kind (&kinds)[N], std::string_view (*name_of)(Kind)) {
  std::string out;
  for (Kind k : kinds) {
    if (!out.empty()) out += ", ";
    out += name_of(k);
  }
  return out;
}

}  // namespace

double training_flops(double params, double tokens) { return 6 * params * tokens; }

Checked<TrainingTime> training_time(double params, double tokens, int gpus, double peak_flops,
                                    double mfu) {
  if (gpus < 1) return {std::nullopt, fmt::format("need at least one GPU (got {})", gpus)};
  if (peak_flops <= 0)
    return {std::nullopt, "the device has no peak for this dtype (unsupported)"};
  if (!(mfu > 0 && mfu <= 1))
    return {std::nullopt, fmt::format("MFU must be in (0, 1] (got {})", mfu)};
  TrainingTime t;
  t.flops = training_flops(params, tokens);
  t.seconds = t.flops / (gpus * peak_flops * mfu);
  t.days = t.seconds / kSecondsPerDay;
  return {t, ""};
}

Checked<BytesPerParam> bytes_per_param(std::string_view optimizer, std::string_view precision) {
  std::optional<ir::OptimizerKind> opt = ir::parse_optimizer(optimizer, /*ignore_case=*/true);
  if (!opt)
    return {std::nullopt, fmt::format("unknown optimizer '{}' (known: {})", optimizer,
                                      known_optimizer_names())};
  std::optional<ir::PrecisionPolicy> prec = ir::parse_precision(precision, /*ignore_case=*/true);
  if (!prec)
    return {std::nullopt, fmt::format("unknown precision '{}' (known: {})", precision,
                                      known_precision_names())};
  const ParamBytes bytes = param_bytes(*prec);
  BytesPerParam b;
  b.params = bytes.params;
  b.grads = bytes.grads;
  b.optimizer_state = optimizer_state_bytes(*opt);
  b.total = b.params + b.grads + b.optimizer_state;
  return {b, ""};
}

std::string known_optimizer_names() { return names_of(ir::kAllOptimizers, ir::optimizer_name); }
std::string known_precision_names() { return names_of(ir::kAllPrecisions, ir::precision_name); }

double max_trainable_params(int gpus, double memory_bytes, const BytesPerParam& bytes) {
  return gpus * memory_bytes / bytes.total;
}

}  // namespace napkin::analysis
