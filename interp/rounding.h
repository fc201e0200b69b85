// Rounding a double to a dtype, once and correctly: what Numerics::Native does
// to every value an op produces.
#pragma once

#include "ir/dtype.h"

namespace napkin::interp {

// The value of dtype t nearest to x (ties to even), as a double:
//   f64          x itself
//   f32          nearest float (round to nearest even; past the range: +-inf)
//   bf16, f16, f8e4m3, f8e5m2
//                correctly rounded from the double, with the overflow rules of
//                runtime/float_formats.h (e4m3 overflows to NaN). Rounding
//                double -> float -> narrow would round twice and can miss: a
//                double just above a bf16 tie becomes the tie in float, which
//                then rounds to even. So the double first goes to float with
//                round-to-odd (truncate, then set the last bit if anything was
//                dropped), which keeps "above/below/at the tie" intact for any
//                format at least two bits narrower than float; the narrow
//                conversion then rounds once, correctly.
//   i32, i64     toward zero (NaN -> 0, saturating), like a cast
//   bool         x != 0
double round_to_dtype(double x, ir::DType t);

// The other way to round x to floating dtype t: of the two values of t that
// enclose x, the one that is not `rounded` (x rounded to nearest). Returns
// `rounded` itself when x is a value of t, or lies outside t's normal range
// (below its smallest normal, or with a neighbour past its largest value).
// Random rounding (interpreter.h's rounding noise) picks either.
double round_other_way(double x, double rounded, ir::DType t);

// x rounded to a float with round-to-odd (exposed for tests).
float round_to_odd_float(double x);

}  // namespace napkin::interp
