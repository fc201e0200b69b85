// The runtime's enums for a tensor: its element type, named as the IR names
// them (ir/dtype.h): f64 f32 f16 bf16 f8e4m3 f8e5m2 i32 i64 bool; and its
// role in a program. Compared as enums; the names are for the program's JSON
// and for messages.
#pragma once

#include <cstdint>
#include <string_view>

namespace napkin::runtime {

enum class DType : uint8_t { F64, F32, F16, BF16, F8E4M3, F8E5M2, I32, I64, Bool };
std::string_view dtype_name(DType t);
DType parse_dtype(std::string_view name);  // throws Error("unknown dtype NAME")
int64_t element_bytes(DType t);

// What a named tensor of a program is to the trainer.
enum class TensorRole : uint8_t { Param, State, Input, Rng, Loss, Output };
std::string_view tensor_role_name(TensorRole r);  // "param", "state", "input", "rng", "loss", "output"
TensorRole parse_tensor_role(std::string_view name);  // throws Error

}  // namespace napkin::runtime
