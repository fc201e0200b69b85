#include "runtime/tensor_types.h"

#include <iterator>
#include <string>

#include "runtime/error.h"

namespace napkin::runtime {

namespace {

// In the enums' order.
constexpr std::string_view kDTypeNames[] = {"f64", "f32", "f16", "bf16", "f8e4m3", "f8e5m2", "i32", "i64", "bool", "u8", "u16", "u32"};
constexpr int64_t kDTypeBytes[] = {8, 4, 2, 2, 1, 1, 4, 8, 1, 1, 2, 4};
constexpr std::string_view kRoleNames[] = {"param", "state", "input", "rng", "loss", "output", "metric"};
constexpr std::string_view kPhaseNames[] = {"forward", "backward", "optimizer", "decode", "setup"};
constexpr std::string_view kActivationNames[] = {"none", "gelu", "gelu_grad"};
static_assert(std::size(kDTypeNames) == static_cast<size_t>(DType::U32) + 1 &&
              std::size(kDTypeBytes) == std::size(kDTypeNames));
static_assert(std::size(kRoleNames) == static_cast<size_t>(TensorRole::Metric) + 1);
static_assert(std::size(kPhaseNames) == static_cast<size_t>(KernelPhase::Setup) + 1);
static_assert(std::size(kActivationNames) == static_cast<size_t>(GemmActivation::GeluGrad) + 1);

}  // namespace

size_t name_index(std::span<const std::string_view> names, std::string_view name, const char* what) {
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i] == name) return i;
  throw Error("unknown " + std::string(what) + " " + std::string(name));
}

std::string_view dtype_name(DType t) { return kDTypeNames[static_cast<size_t>(t)]; }
DType parse_dtype(std::string_view name) { return static_cast<DType>(name_index(kDTypeNames, name, "dtype")); }
int64_t element_bytes(DType t) { return kDTypeBytes[static_cast<size_t>(t)]; }
bool is_integer(DType t) { return t == DType::I32 || t == DType::I64 || t == DType::U8 || t == DType::U16 || t == DType::U32;
}
std::string_view tensor_role_name(TensorRole r) { return kRoleNames[static_cast<size_t>(r)]; }
TensorRole parse_tensor_role(std::string_view name) { return static_cast<TensorRole>(name_index(kRoleNames, name, "tensor role")); }
std::string_view phase_name(KernelPhase p) { return kPhaseNames[static_cast<size_t>(p)]; }
KernelPhase parse_phase(std::string_view name) { return static_cast<KernelPhase>(name_index(kPhaseNames, name, "phase")); }
std::string_view activation_name(GemmActivation a) { return kActivationNames[static_cast<size_t>(a)]; }
GemmActivation parse_activation(std::string_view name) {
  return static_cast<GemmActivation>(name_index(kActivationNames, name, "GEMM epilogue activation"));
}

}  // namespace napkin::runtime
