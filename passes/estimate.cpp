#include "passes/estimate.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

namespace napkin::passes {

namespace {

// Optimizer state is fp32 in every precision policy (as in torch.optim and the
// lecture): 4 bytes per buffer per parameter.
struct OptimizerState {
  std::string_view name;
  double bytes;
};
constexpr OptimizerState kOptimizers[] = {
    {"sgd", 0},
    {"momentum", 4},  // velocity
    {"adagrad", 4},   // running sum of squared gradients
    {"rmsprop", 4},   // running mean of squared gradients (torch adds a 4-byte
                      // momentum buffer only when momentum > 0)
    {"adam", 8},      // first and second moments
    {"adamw", 8},
};

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
struct Precision {
  std::string_view name;
  double params;
  double grads;
};
constexpr Precision kPrecisions[] = {
    {"fp32", 4, 4},
    {"bf16-mixed", 2, 2},
    {"fp16-mixed", 2, 2},
    {"fp8-mixed", 2, 2},
};

bool iequals(std::string_view a, std::string_view b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(), [](char x, char y) {
    return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
  });
}

template <class Table>
auto find_named(const Table& table, std::string_view name) -> decltype(&table[0]) {
  for (const auto& entry : table)
    if (iequals(entry.name, name)) return &entry;
  return nullptr;
}

template <class Table>
std::string names_of(const Table& table) {
  std::string out;
  for (const auto& entry : table) {
    if (!out.empty()) out += ", ";
    out += entry.name;
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
  const OptimizerState* opt = find_named(kOptimizers, optimizer);
  if (!opt)
    return {std::nullopt, fmt::format("unknown optimizer '{}' (known: {})", optimizer,
                                      known_optimizer_names())};
  const Precision* prec = find_named(kPrecisions, precision);
  if (!prec)
    return {std::nullopt, fmt::format("unknown precision '{}' (known: {})", precision,
                                      known_precision_names())};
  BytesPerParam b;
  b.params = prec->params;
  b.grads = prec->grads;
  b.optimizer_state = opt->bytes;
  b.total = b.params + b.grads + b.optimizer_state;
  return {b, ""};
}

std::string known_optimizer_names() { return names_of(kOptimizers); }
std::string known_precision_names() { return names_of(kPrecisions); }

double max_trainable_params(int gpus, double memory_bytes, const BytesPerParam& bytes) {
  return gpus * memory_bytes / bytes.total;
}

}  // namespace napkin::passes
