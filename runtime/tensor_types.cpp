#include "runtime/tensor_types.h"

#include <iterator>
#include <string>

#include "runtime/error.h"

namespace napkin::runtime {

namespace {

// In the enums' order.
constexpr std::string_view kDTypeNames[] = {"f64", "f32", "f16", "bf16", "f8e4m3", "f8e5m2", "i32", "i64", "bool"};
constexpr int64_t kDTypeBytes[] = {8, 4, 2, 2, 1, 1, 4, 8, 1};
constexpr std::string_view kRoleNames[] = {"param", "state", "input", "rng", "loss", "output"};
static_assert(std::size(kDTypeNames) == static_cast<size_t>(DType::Bool) + 1 &&
              std::size(kDTypeBytes) == std::size(kDTypeNames));
static_assert(std::size(kRoleNames) == static_cast<size_t>(TensorRole::Output) + 1);

template <class Enum, size_t N>
Enum parse(const std::string_view (&names)[N], std::string_view name, const char* what) {
  for (size_t i = 0; i < N; ++i)
    if (names[i] == name) return static_cast<Enum>(i);
  throw Error("unknown " + std::string(what) + " " + std::string(name));
}

}  // namespace

std::string_view dtype_name(DType t) { return kDTypeNames[static_cast<size_t>(t)]; }
DType parse_dtype(std::string_view name) { return parse<DType>(kDTypeNames, name, "dtype"); }
int64_t element_bytes(DType t) { return kDTypeBytes[static_cast<size_t>(t)]; }
std::string_view tensor_role_name(TensorRole r) { return kRoleNames[static_cast<size_t>(r)]; }
TensorRole parse_tensor_role(std::string_view name) { return parse<TensorRole>(kRoleNames, name, "tensor role"); }

}  // namespace napkin::runtime
