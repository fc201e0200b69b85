// The reference interpreter's arithmetic for ir/elementwise_formulas.h: every
// elementwise op evaluated in double, one element at a time. The interpreter
// computes its elementwise nodes through it, and the frontend folds numbers
// through it (exp(2.0) in a model is this formula's value).
//
// The interpreter's semantics (interpreter.h, Numerics): integers are whole
// numbers in double (division truncates toward zero; dividing by zero is a
// data error of the node), bool is 0/1, tanh is std::tanh (exact, unlike the
// backends' exp-based one), maximum/minimum propagate NaN, and a cast to a
// floating dtype keeps the double (the driver rounds an op's result, not the
// steps inside its formula).
#pragma once

#include <cmath>

#include "ir/elementwise_formulas.h"
#include "ir/graph.h"

namespace napkin::interp {

inline double nan_max(double a, double b) { return std::isnan(a) || std::isnan(b) ? NAN : std::max(a, b); }
inline double nan_min(double a, double b) { return std::isnan(a) || std::isnan(b) ? NAN : std::min(a, b); }

class Float64Arithmetic {
 public:
  // A number and the dtype it is a value of.
  struct Handle {
    double v = 0;
    ir::DType dtype = ir::DType::F64;
  };
  using Value = ir::formulas::Value<Float64Arithmetic>;

  // `node`: the node being evaluated, named by its data errors; none when folding numbers.
  explicit Float64Arithmetic(const ir::Node* node = nullptr) : node_(node) {}

  Handle constant(const Handle& like, double v) const { return {v, like.dtype}; }
  Handle add(const Handle& a, const Handle& b) const { return {a.v + b.v, a.dtype}; }
  Handle sub(const Handle& a, const Handle& b) const { return {a.v - b.v, a.dtype}; }
  Handle mul(const Handle& a, const Handle& b) const { return {a.v * b.v, a.dtype}; }
  Handle div(const Handle& a, const Handle& b) const;
  Handle neg(const Handle& x) const { return {-x.v, x.dtype}; }
  Handle less(const Handle& a, const Handle& b) const { return truth(a.v < b.v); }
  Handle less_equal(const Handle& a, const Handle& b) const { return truth(a.v <= b.v); }
  Handle greater(const Handle& a, const Handle& b) const { return truth(a.v > b.v); }
  Handle greater_equal(const Handle& a, const Handle& b) const { return truth(a.v >= b.v); }
  Handle equal(const Handle& a, const Handle& b) const { return truth(a.v == b.v); }
  Handle not_equal(const Handle& a, const Handle& b) const { return truth(a.v != b.v); }
  Handle select(const Handle& cond, const Handle& a, const Handle& b) const { return cond.v != 0 ? a : b; }
  Handle exp(const Handle& x) const { return {std::exp(x.v), x.dtype}; }
  Handle log(const Handle& x) const { return {std::log(x.v), x.dtype}; }
  Handle tanh(const Handle& x) const { return {std::tanh(x.v), x.dtype}; }
  Handle erf(const Handle& x) const { return {std::erf(x.v), x.dtype}; }
  Handle sqrt(const Handle& x) const { return {std::sqrt(x.v), x.dtype}; }
  Handle sin(const Handle& x) const { return {std::sin(x.v), x.dtype}; }
  Handle cos(const Handle& x) const { return {std::cos(x.v), x.dtype}; }
  Handle abs(const Handle& x) const { return {std::fabs(x.v), x.dtype}; }
  Handle pow(const Handle& a, const Handle& b) const { return {std::pow(a.v, b.v), a.dtype}; }
  Handle maximum(const Handle& a, const Handle& b) const { return {nan_max(a.v, b.v), a.dtype}; }
  Handle minimum(const Handle& a, const Handle& b) const { return {nan_min(a.v, b.v), a.dtype}; }
  Handle convert(const Handle& x, ir::DType from, ir::DType to) const;
  Handle dropout_keep(const Handle& flat, uint32_t stream, const Handle& seed_lo, const Handle& seed_hi,
                      const Handle& step, uint32_t threshold) const;

  Value value(double v, ir::DType dtype) { return Value(*this, {v, dtype}); }

 private:
  static Handle truth(bool b) { return {b ? 1.0 : 0.0, ir::DType::Bool}; }
  const ir::Node* node_;
};

// Unary elementwise op `op` (one without attributes) of a number: constant folding.
double fold_unary(ir::Op op, double x);

}  // namespace napkin::interp
