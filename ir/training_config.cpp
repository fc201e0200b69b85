#include "ir/training_config.h"

#include <iterator>

#include "ir/text.h"

namespace napkin::ir {

std::string_view optimizer_name(OptimizerKind k) {
  switch (k) {
    case OptimizerKind::SGD: return "sgd";
    case OptimizerKind::Momentum: return "momentum";
    case OptimizerKind::AdaGrad: return "adagrad";
    case OptimizerKind::RMSProp: return "rmsprop";
    case OptimizerKind::Adam: return "adam";
    case OptimizerKind::AdamW: return "adamw";
  }
  return "?";
}

std::string_view precision_name(PrecisionPolicy p) {
  switch (p) {
    case PrecisionPolicy::FP32: return "fp32";
    case PrecisionPolicy::BF16Mixed: return "bf16-mixed";
    case PrecisionPolicy::FP16Mixed: return "fp16-mixed";
    case PrecisionPolicy::FP8Mixed: return "fp8-mixed";
  }
  return "?";
}

DType low_precision_dtype(PrecisionPolicy p) {
  switch (p) {
    case PrecisionPolicy::FP32: return DType::F32;
    case PrecisionPolicy::BF16Mixed: return DType::BF16;
    case PrecisionPolicy::FP16Mixed: return DType::F16;
    case PrecisionPolicy::FP8Mixed: return DType::BF16;
  }
  return DType::F32;
}

namespace {

// The parsers below find a name only if its kind is listed.
static_assert(std::size(kAllOptimizers) == static_cast<size_t>(OptimizerKind::AdamW) + 1);
static_assert(std::size(kAllPrecisions) == static_cast<size_t>(PrecisionPolicy::FP8Mixed) + 1);

template <class Kind, size_t N>
std::optional<Kind> parse_name(const Kind (&kinds)[N], std::string_view (*name_of)(Kind), std::string_view name,
                               bool ignore_case) {
  for (Kind k : kinds)
    if (ignore_case ? iequals(name_of(k), name) : name_of(k) == name) return k;
  return std::nullopt;
}

}  // namespace

std::optional<OptimizerKind> parse_optimizer(std::string_view name, bool ignore_case) {
  return parse_name(kAllOptimizers, optimizer_name, name, ignore_case);
}

std::optional<PrecisionPolicy> parse_precision(std::string_view name, bool ignore_case) {
  return parse_name(kAllPrecisions, precision_name, name, ignore_case);
}

}  // namespace napkin::ir
