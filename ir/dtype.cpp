#include "ir/dtype.h"

#include <cmath>
#include <cstddef>

#include "ir/internal_check.h"
#include "ir/text.h"

namespace napkin::ir {

namespace {

// Everything napkin knows about one dtype. Floating formats are described only by
// their field widths; float_info derives the rest.
struct Facts {
  DType type;
  std::string_view name;
  int size;
  int exponent_bits;  // 0 for non-floating types
  int mantissa_bits;
  // OCP "fn" encoding (E4M3): no infinities, and only S.1111.111 is NaN, so the top
  // exponent field holds ordinary values.
  bool finite_only;
};

constexpr Facts kFacts[] = {
    {DType::F64, "f64", 8, 11, 52, false},      {DType::F32, "f32", 4, 8, 23, false},
    {DType::F16, "f16", 2, 5, 10, false},       {DType::BF16, "bf16", 2, 8, 7, false},
    {DType::F8E4M3, "f8e4m3", 1, 4, 3, true},   {DType::F8E5M2, "f8e5m2", 1, 5, 2, false},
    {DType::I32, "i32", 4, 0, 0, false},        {DType::I64, "i64", 8, 0, 0, false},
    {DType::Bool, "bool", 1, 0, 0, false},
};

// kFacts is indexed by the enum value; this keeps the two in step.
constexpr bool facts_follow_enum() {
  for (size_t i = 0; i < std::size(kAllDTypes); ++i)
    if (kFacts[i].type != kAllDTypes[i]) return false;
  return std::size(kFacts) == std::size(kAllDTypes);
}
static_assert(facts_follow_enum(), "kFacts must list every DType in enum order");

const Facts& facts(DType t) { return kFacts[static_cast<size_t>(t)]; }

struct Alias {
  std::string_view name;
  DType type;
};

// Spellings seen in torch (float32, bfloat16, float8_e4m3fn), numpy (float64, int32)
// and papers (fp16, fp8_e4m3); the canonical names parse too.
constexpr Alias kAliases[] = {
    {"float64", DType::F64},         {"fp64", DType::F64},           {"double", DType::F64},
    {"float32", DType::F32},         {"fp32", DType::F32},           {"float", DType::F32},
    {"float16", DType::F16},         {"fp16", DType::F16},           {"half", DType::F16},
    {"bfloat16", DType::BF16},       {"f8e4m3fn", DType::F8E4M3},    {"float8_e4m3fn", DType::F8E4M3},
    {"fp8_e4m3", DType::F8E4M3},     {"e4m3", DType::F8E4M3},        {"float8_e5m2", DType::F8E5M2},
    {"fp8_e5m2", DType::F8E5M2},     {"e5m2", DType::F8E5M2},        {"int32", DType::I32},
    {"int64", DType::I64},           {"long", DType::I64},           {"boolean", DType::Bool},
};

}  // namespace

int dtype_size(DType t) { return facts(t).size; }

std::string_view dtype_name(DType t) { return facts(t).name; }

std::optional<DType> parse_dtype(std::string_view name) {
  for (const Facts& f : kFacts)
    if (iequals(name, f.name)) return f.type;
  for (const Alias& a : kAliases)
    if (iequals(name, a.name)) return a.type;
  return std::nullopt;
}

// "f64 (float64, fp64, double), f32 (...), ..., bool (boolean)".
std::string dtype_names_list() {
  std::string out;
  for (const Facts& f : kFacts) {
    if (!out.empty()) out += ", ";
    out += f.name;
    std::string aliases;
    for (const Alias& a : kAliases) {
      if (a.type != f.type) continue;
      aliases += aliases.empty() ? " (" : ", ";
      aliases += a.name;
    }
    out += aliases.empty() ? aliases : aliases + ")";
  }
  return out;
}

bool is_floating(DType t) { return facts(t).exponent_bits > 0; }

bool is_integer(DType t) { return t == DType::I32 || t == DType::I64; }

FloatInfo float_info(DType t) {
  NAPKIN_INTERNAL_CHECK(is_floating(t), "float_info asked for non-floating dtype {}",
                        dtype_name(t));
  const Facts& f = facts(t);
  const int bias = (1 << (f.exponent_bits - 1)) - 1;
  const int min_exponent = 1 - bias;
  // IEEE formats reserve the all-ones exponent for inf/NaN; "fn" formats use it for
  // numbers and give up only the all-ones mantissa (NaN) there.
  const int max_exponent = (1 << f.exponent_bits) - (f.finite_only ? 1 : 2) - bias;
  const int ulps_below_two = f.finite_only ? 2 : 1;  // largest significand: 2 - ulps * eps

  FloatInfo info;
  info.bits = 1 + f.exponent_bits + f.mantissa_bits;
  info.exponent_bits = f.exponent_bits;
  info.mantissa_bits = f.mantissa_bits;
  info.eps = std::ldexp(1.0, -f.mantissa_bits);
  info.max = std::ldexp(2.0 - ulps_below_two * info.eps, max_exponent);
  info.smallest_normal = std::ldexp(1.0, min_exponent);
  info.smallest_subnormal = std::ldexp(1.0, min_exponent - f.mantissa_bits);
  info.has_infinity = !f.finite_only;
  return info;
}

}  // namespace napkin::ir
