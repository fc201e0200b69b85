#include "interp/rounding.h"

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>

#include "runtime/float_formats.h"

namespace napkin::interp {

float round_to_odd_float(double x) {
  if (std::isnan(x) || std::isinf(x)) return static_cast<float>(x);
  double ax = std::fabs(x);
  float f;
  if (ax > FLT_MAX) {
    f = std::copysign(FLT_MAX, static_cast<float>(x));  // truncation; FLT_MAX's last bit is already 1
  } else {
    f = static_cast<float>(x);                     // in range: nearest float
    if (std::fabs(static_cast<double>(f)) > ax) f = std::nextafter(f, 0.0f);  // now truncated toward zero
  }
  if (static_cast<double>(f) != x) f = std::bit_cast<float>(std::bit_cast<uint32_t>(f) | 1u);
  return f;
}

double round_other_way(double x, double rounded, ir::DType t) {
  const ir::FloatInfo info = ir::float_info(t);
  if (x == rounded || !std::isfinite(x) || std::fabs(x) < info.smallest_normal) return rounded;
  // In x's binade [2^e, 2^(e+1)) the values of t are the multiples of
  // 2^(e - mantissa_bits): x lies between lo and lo + step (both exact in double).
  const double step = std::ldexp(1.0, std::ilogb(x) - info.mantissa_bits);
  const double lo = std::floor(x / step) * step, hi = lo + step;
  if (std::fabs(lo) > info.max || std::fabs(hi) > info.max) return rounded;
  if (rounded == lo) return hi;
  if (rounded == hi) return lo;
  return rounded;  // rounding to nearest left the binade's grid (cannot happen for a normal x)
}

double round_to_dtype(double x, ir::DType t) {
  switch (t) {
    case ir::DType::F64: return x;
    case ir::DType::F32:
      // The cast is undefined past float's range; IEEE rounds there to +-inf
      // from the midpoint 2^128 - 2^103 up.
      if (std::fabs(x) >= 0x1p128 - 0x1p103) return std::copysign(INFINITY, x);
      return static_cast<float>(x);
    case ir::DType::BF16: return runtime::round_to_bf16(round_to_odd_float(x));
    case ir::DType::F16: return runtime::round_to_f16(round_to_odd_float(x));
    case ir::DType::F8E4M3: return runtime::round_to_f8e4m3(round_to_odd_float(x));
    case ir::DType::F8E5M2: return runtime::round_to_f8e5m2(round_to_odd_float(x));
    case ir::DType::I32:
    case ir::DType::I64: {
      if (std::isnan(x)) return 0;
      double lo = t == ir::DType::I32 ? -2147483648.0 : -9223372036854775808.0;
      double hi = t == ir::DType::I32 ? 2147483647.0 : 9223372036854775807.0;
      return std::clamp(std::trunc(x), lo, hi);
    }
    case ir::DType::Bool: return x != 0 ? 1.0 : 0.0;
  }
  return x;
}

}  // namespace napkin::interp
