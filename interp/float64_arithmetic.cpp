#include "interp/float64_arithmetic.h"

#include <fmt/format.h>

#include "interp/node_error.h"
#include "interp/rounding.h"
#include "runtime/rng.h"

namespace napkin::interp {

using Handle = Float64Arithmetic::Handle;

Handle Float64Arithmetic::div(const Handle& a, const Handle& b) const {
  if (!ir::is_integer(a.dtype)) return {a.v / b.v, a.dtype};
  // C++ integer division: truncates toward zero.
  if (b.v == 0) {
    NAPKIN_INTERNAL_CHECK(node_, "integer division by zero outside a node");
    detail::fail(*node_, fmt::format("integer division of {} by zero", a.v));
  }
  return {static_cast<double>(static_cast<int64_t>(a.v) / static_cast<int64_t>(b.v)), a.dtype};
}

// To an integer or bool: toward zero (NaN -> 0, saturating) or != 0, as
// round_to_dtype defines it. To a floating dtype: the driver rounds (Native)
// or keeps the value (Float64).
Handle Float64Arithmetic::convert(const Handle& x, ir::DType, ir::DType to) const {
  return {ir::is_floating(to) ? x.v : round_to_dtype(x.v, to), to};
}

// The rng words are whole numbers.
Handle Float64Arithmetic::dropout_keep(const Handle& flat, uint32_t stream, const Handle& seed_lo, const Handle& seed_hi,
                                       const Handle& step, uint32_t threshold) const {
  const auto s = static_cast<uint64_t>(static_cast<int64_t>(step.v));
  uint32_t r = runtime::philox4x32_10({static_cast<uint32_t>(static_cast<int64_t>(flat.v)), stream, static_cast<uint32_t>(s),
                                       static_cast<uint32_t>(s >> 32)},
                                      {static_cast<uint32_t>(static_cast<int64_t>(seed_lo.v)),
                                       static_cast<uint32_t>(static_cast<int64_t>(seed_hi.v))})[0];
  return truth(r >= threshold);
}

double fold_unary(ir::Op op, double x) {
  Float64Arithmetic arith;
  std::vector<Float64Arithmetic::Value> args{arith.value(x, ir::DType::F64)};
  return ir::formulas::apply_elementwise(op, {}, ir::DType::F64, ir::DType::F64, args, {}).handle().v;
}

}  // namespace napkin::interp
