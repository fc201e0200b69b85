// The napkin math of CS336 lecture 2 ("resource accounting"), as pure functions
// with structured results so a report can show each term:
//   training FLOPs = 6 * params * tokens   (2 forward + 4 backward per param-token)
//   time           = FLOPs / (gpus * peak * MFU)
//   memory         = params * bytes/param (params + grads + optimizer state)
// Like the lecture, the memory estimate ignores activations, which depend on the
// batch and the model, not just its size; napkin's memory planner counts those.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace napkin::analysis {

// A value, or an error that says what was wrong (and the accepted names). Unknown
// names are errors: an estimate built on a guessed optimizer would look exact.
template <class T>
struct Checked {
  std::optional<T> value;
  std::string error;
  explicit operator bool() const { return value.has_value(); }
};

inline constexpr double kSecondsPerDay = 86400;

double training_flops(double params, double tokens);  // 6 * params * tokens

struct TrainingTime {
  double flops = 0;    // 6 * params * tokens
  double seconds = 0;  // flops / (gpus * peak_flops * mfu)
  double days = 0;
};
// peak_flops is one device's (see matmul_peak); mfu in (0, 1].
Checked<TrainingTime> training_time(double params, double tokens, int gpus, double peak_flops,
                                    double mfu);

// Bytes each parameter costs during training, by component.
struct BytesPerParam {
  double params = 0;
  double grads = 0;
  double optimizer_state = 0;
  double total = 0;
};
// optimizer: sgd momentum adagrad rmsprop adam adamw; precision: fp32 bf16-mixed
// fp16-mixed fp8-mixed (case-insensitive). The conventions are in estimate.cpp.
Checked<BytesPerParam> bytes_per_param(std::string_view optimizer, std::string_view precision);
std::string known_optimizer_names();  // "sgd, momentum, adagrad, rmsprop, adam, adamw"
std::string known_precision_names();  // "fp32, bf16-mixed, fp16-mixed, fp8-mixed"

// Largest parameter count whose params, grads and optimizer state fit in
// gpus * memory_bytes, sharded perfectly (ZeRO-3 / FSDP style) as in the lecture.
double max_trainable_params(int gpus, double memory_bytes, const BytesPerParam& bytes);

}  // namespace napkin::analysis
