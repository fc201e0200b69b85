#include "ir/training_config.h"

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

}  // namespace napkin::ir
