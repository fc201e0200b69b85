#include "runtime/tensor_types.h"

#include <string>

#include "runtime/error.h"

namespace napkin::runtime {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F64: return "f64";
    case DType::F32: return "f32";
    case DType::F16: return "f16";
    case DType::BF16: return "bf16";
    case DType::F8E4M3: return "f8e4m3";
    case DType::F8E5M2: return "f8e5m2";
    case DType::I32: return "i32";
    case DType::I64: return "i64";
    case DType::Bool: return "bool";
  }
  return "?";
}

DType parse_dtype(std::string_view name) {
  for (int t = 0; t <= static_cast<int>(DType::Bool); ++t)
    if (dtype_name(static_cast<DType>(t)) == name) return static_cast<DType>(t);
  throw Error("unknown dtype " + std::string(name));
}

int64_t element_bytes(DType t) {
  switch (t) {
    case DType::F64:
    case DType::I64: return 8;
    case DType::F32:
    case DType::I32: return 4;
    case DType::F16:
    case DType::BF16: return 2;
    case DType::F8E4M3:
    case DType::F8E5M2:
    case DType::Bool: return 1;
  }
  return 0;
}

std::string_view tensor_role_name(TensorRole r) {
  switch (r) {
    case TensorRole::Param: return "param";
    case TensorRole::State: return "state";
    case TensorRole::Input: return "input";
    case TensorRole::Rng: return "rng";
    case TensorRole::Loss: return "loss";
    case TensorRole::Output: return "output";
  }
  return "?";
}

TensorRole parse_tensor_role(std::string_view name) {
  for (int r = 0; r <= static_cast<int>(TensorRole::Output); ++r)
    if (tensor_role_name(static_cast<TensorRole>(r)) == name) return static_cast<TensorRole>(r);
  throw Error("unknown tensor role " + std::string(name));
}

}  // namespace napkin::runtime
