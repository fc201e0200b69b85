// Element types of napkin tensors and their facts (size, finfo).
//
// The floating-point facts are derived from each format's exponent and mantissa
// widths rather than typed in, so that a table typo cannot disagree with the
// arithmetic. fp8 formats follow the OCP 8-bit spec: E4M3 ("fn", no infinities,
// max 448) and E5M2 (IEEE-like, max 57344).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace napkin::ir {

enum class DType : uint8_t { F64, F32, F16, BF16, F8E4M3, F8E5M2, I32, I64, Bool };

inline constexpr DType kAllDTypes[] = {DType::F64,    DType::F32,    DType::F16,
                                       DType::BF16,   DType::F8E4M3, DType::F8E5M2,
                                       DType::I32,    DType::I64,    DType::Bool};

// Bytes per element (bool is stored as one byte).
int dtype_size(DType t);
// Canonical short name used in YAML and the IR text: f64 f32 f16 bf16 f8e4m3 f8e5m2 i32 i64 bool.
std::string_view dtype_name(DType t);
// Accepts the canonical names and common aliases (float32, fp32, float16, half, bfloat16,
// fp8_e4m3, int32, int64, ...).
std::optional<DType> parse_dtype(std::string_view name);
// The list of accepted names, for error messages.
std::string dtype_names_list();

bool is_floating(DType t);
bool is_integer(DType t);  // i32, i64 (bool is neither)

// finfo-like facts of a floating format (torch.finfo semantics).
struct FloatInfo {
  int bits = 0;
  int exponent_bits = 0;
  int mantissa_bits = 0;   // explicit (stored) fraction bits
  double eps = 0;          // 2^-mantissa_bits: gap between 1 and the next value
  double max = 0;          // largest finite value
  double smallest_normal = 0;
  double smallest_subnormal = 0;
  bool has_infinity = true;
};
// Only valid for floating dtypes (internal check otherwise).
FloatInfo float_info(DType t);

}  // namespace napkin::ir
