// Every elementwise op's math, written once: the reference interpreter, the
// frontend's constant folding, the CPU backend (LLVM IR) and the CUDA backend
// (CUDA C expressions) all evaluate these templates, each with its own
// arithmetic. apply_elementwise holds the compiler's one switch over
// elementwise ops.
//
// Terms:
//  - arithmetic: a backend's class A that makes values. It names its value
//    representation A::Handle (a double, an llvm::Value*, a CUDA C
//    expression) and provides the primitives, each taking and returning
//    handles:
//      constant(like, v)        v as a value of like's type (rounded to it)
//      add sub mul div neg      integer or floating as the operands are
//                               (integer division truncates)
//      less less_equal greater greater_equal equal not_equal -> bool
//      select(cond, a, b)
//      exp log tanh erf sqrt sin cos abs pow maximum minimum
//                               maximum/minimum propagate NaN
//      convert(x, from, to)     a cast between dtypes
//      dropout_keep(flat, stream, seed_lo, seed_hi, step, threshold) -> bool
//                               ir/rng.h's keep test of element `flat`:
//                               Philox word 0 of its counter >= threshold.
//                               The keep test is the primitive (Philox is
//                               integer work each backend writes in its own
//                               words); dropout's structure is the formula here.
//    Which variant a primitive takes for integers or floats (relu and abs of
//    an integer, integer division) is the arithmetic's business.
//  - Value<A>: a handle and its arithmetic, with operators, so a formula reads
//    like math. A double operand is a constant of the other operand's type:
//    0.5 * x is constant(x, 0.5) * x.
//  - formula order: each formula's operations and constants are the CPU
//    backend's, in that order (x3 = (x*x)*x, not x*x*x), so every backend
//    rounds the same steps; a constant is computed in double, then made a
//    constant of the value's type.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "ir/internal_check.h"
#include "ir/op.h"
#include "ir/rng.h"

namespace napkin::ir::formulas {

template <class A>
class Value {
 public:
  using Handle = typename A::Handle;
  Value() = default;
  Value(A& arith, Handle handle) : arith_(&arith), handle_(std::move(handle)) {}
  A& arith() const { return *arith_; }
  const Handle& handle() const { return handle_; }
  Value with(Handle handle) const { return Value(*arith_, std::move(handle)); }

 private:
  A* arith_ = nullptr;
  Handle handle_{};
};

// Where an element is, as i64 values (empty where the op needs none):
// row and col in the last two dims (triu, causal_mask), flat its row-major
// index in the output (dropout).
template <class A>
struct Position {
  Value<A> row, col, flat;
};

// ---- the primitives on values ------------------------------------------------

template <class A> Value<A> constant(const Value<A>& like, double v) { return like.with(like.arith().constant(like.handle(), v)); }

#define NAPKIN_FORMULA_BINARY(op, method)                                                                    \
  template <class A> Value<A> operator op(const Value<A>& x, const Value<A>& y) {                            \
    return x.with(x.arith().method(x.handle(), y.handle()));                                                 \
  }                                                                                                          \
  template <class A> Value<A> operator op(double x, const Value<A>& y) { return constant(y, x) op y; }       \
  template <class A> Value<A> operator op(const Value<A>& x, double y) { return x op constant(x, y); }
NAPKIN_FORMULA_BINARY(+, add)
NAPKIN_FORMULA_BINARY(-, sub)
NAPKIN_FORMULA_BINARY(*, mul)
NAPKIN_FORMULA_BINARY(/, div)
NAPKIN_FORMULA_BINARY(<, less)
NAPKIN_FORMULA_BINARY(<=, less_equal)
NAPKIN_FORMULA_BINARY(>, greater)
NAPKIN_FORMULA_BINARY(>=, greater_equal)
NAPKIN_FORMULA_BINARY(==, equal)
NAPKIN_FORMULA_BINARY(!=, not_equal)
#undef NAPKIN_FORMULA_BINARY

template <class A> Value<A> operator-(const Value<A>& x) { return x.with(x.arith().neg(x.handle())); }

#define NAPKIN_FORMULA_FUNCTION(name) \
  template <class A> Value<A> name(const Value<A>& x) { return x.with(x.arith().name(x.handle())); }
NAPKIN_FORMULA_FUNCTION(exp)
NAPKIN_FORMULA_FUNCTION(log)
NAPKIN_FORMULA_FUNCTION(tanh)
NAPKIN_FORMULA_FUNCTION(erf)
NAPKIN_FORMULA_FUNCTION(sqrt)
NAPKIN_FORMULA_FUNCTION(sin)
NAPKIN_FORMULA_FUNCTION(cos)
NAPKIN_FORMULA_FUNCTION(abs)
#undef NAPKIN_FORMULA_FUNCTION

template <class A> Value<A> pow(const Value<A>& x, const Value<A>& y) { return x.with(x.arith().pow(x.handle(), y.handle())); }
template <class A> Value<A> maximum(const Value<A>& x, const Value<A>& y) {
  return x.with(x.arith().maximum(x.handle(), y.handle()));
}
template <class A> Value<A> minimum(const Value<A>& x, const Value<A>& y) {
  return x.with(x.arith().minimum(x.handle(), y.handle()));
}
template <class A> Value<A> select(const Value<A>& cond, const Value<A>& a, const Value<A>& b) {
  return a.with(a.arith().select(cond.handle(), a.handle(), b.handle()));
}
template <class A> Value<A> convert(const Value<A>& x, DType from, DType to) { return x.with(x.arith().convert(x.handle(), from, to)); }
template <class A>
Value<A> dropout_keep(const Value<A>& flat, uint32_t stream, const Value<A>& seed_lo, const Value<A>& seed_hi,
                      const Value<A>& step, uint32_t threshold) {
  return flat.with(flat.arith().dropout_keep(flat.handle(), stream, seed_lo.handle(), seed_hi.handle(), step.handle(), threshold));
}

// ---- the formulas ------------------------------------------------------------

template <class V> V rsqrt(const V& x) { return 1.0 / sqrt(x); }
template <class V> V relu(const V& x) { return select(x < 0.0, constant(x, 0.0), x); }
template <class V> V sigmoid(const V& x) { return 1.0 / (1.0 + exp(-x)); }
template <class V> V silu(const V& x) { return x / (1.0 + exp(-x)); }

// log(1 + exp(x)) as max(x, 0) + log1p(exp(-|x|)): exp never overflows.
// log1p(t) is log(u) · t / (u - 1) with u = 1 + t (Goldberg's trick, a few
// ulps; u - 1 is exact), and t itself where u rounds to 1, so softplus of a
// very negative x is exp(x) rather than 0 in every dtype.
template <class V> V softplus(const V& x) {
  V t = exp(-abs(x));
  V u = 1.0 + t;
  V log1p_t = select(u == 1.0, t, log(u) * (t / (u - 1.0)));
  return maximum(x, constant(x, 0.0)) + log1p_t;
}

// 0.5 x (1 + tanh(c (x + 0.044715 x^3))), c = sqrt(2/pi)
// The tanh form, 0.5 x (1 + tanh(u)) with u = sqrt(2/pi) (x + 0.044715 x^3),
// computed as x sigmoid(2u) = x / (1 + exp(-2u)) (0.5 (1 + tanh u) is
// sigmoid(2u) exactly): one exp and one division instead of tanh's exp,
// division, sign fix-up and small-|u| polynomial, with no cancellation
// anywhere (exp(-2u) = inf gives -0 for very negative x). The op table's
// FLOP count stays the tanh form's: it counts the function, not this
// evaluation of it.
template <class V> V gelu_tanh(const V& x) {
  const double c = std::sqrt(2.0 / M_PI);
  V x3 = (x * x) * x;
  V minus_two_u = (-2.0 * c) * (x + 0.044715 * x3);
  return x / (1.0 + exp(minus_two_u));
}

// 0.5 x (1 + erf(x / sqrt 2))
template <class V> V gelu_erf(const V& x) { return (0.5 * x) * (1.0 + erf(x * M_SQRT1_2)); }

// d/dx of gelu_tanh: 0.5 (1 + t) + 0.5 x (1 - t^2) u' with t = tanh(u),
// u' = sqrt(2/pi) (1 + 3 * 0.044715 x^2); with s = sigmoid(2u) = 0.5 (1 + t)
// and 1 - t^2 = 4 s (1 - s) that is s + 2 x s (1 - s) u'. s (1 - s) is
// written so, not as e / (1 + e)^2, which would be inf / inf for large -x.
template <class V> V gelu_tanh_derivative(const V& x) {
  const double c = std::sqrt(2.0 / M_PI);
  V x2 = x * x;
  V minus_two_u = (-2.0 * c) * (x + 0.044715 * (x2 * x));
  V s = 1.0 / (1.0 + exp(minus_two_u));
  V slope = (2.0 * c) * (1.0 + (3 * 0.044715) * x2);
  return s + ((x * slope) * (s * (1.0 - s)));
}

// d/dx of gelu_erf: Phi(x) + x phi(x)
template <class V> V gelu_erf_derivative(const V& x) {
  V cdf = 0.5 * (1.0 + erf(x * M_SQRT1_2));
  V pdf = exp(-0.5 * (x * x)) * (1.0 / std::sqrt(2.0 * M_PI));
  return cdf + x * pdf;
}

// ir/rng.h's dropout of one element: args are x and the rng words (i64),
// `dtype` x's dtype (the scale is its compute type's 1 / (1 - p)).
template <class A>
Value<A> dropout(const std::vector<Value<A>>& args, const Attrs& attrs, DType dtype, const Value<A>& flat) {
  const Value<A>& x = args[0];
  auto word = [&](RngWord w) -> const Value<A>& { return args[1 + w]; };
  double p = attrs.get_double("p");
  Value<A> keep = dropout_keep(flat, static_cast<uint32_t>(attrs.get_int("stream")), word(kRngSeedLow),
                               word(kRngSeedHigh), word(kRngStep), dropout_threshold(p));
  Value<A> kept = select(keep, x * dropout_scale(p, dtype), constant(x, 0.0));
  return select(word(kRngTraining) != 0.0, kept, x);
}

// One output element of elementwise op `op` (attributes `attrs`) from its
// input elements `args`: `from` is the first input's dtype, `to` the
// result's (cast converts between them), `at` where the element is. Other
// ops fall to the default, an internal error: an elementwise op added
// without a formula fails tests/unit/op_table_test.cpp.
template <class A>
Value<A> apply_elementwise(Op op, const Attrs& attrs, DType from, DType to, const std::vector<Value<A>>& args,
                           const Position<A>& at) {
  auto unary = [&] { return args.at(0); };
  auto binary = [&] { return std::pair(args.at(0), args.at(1)); };
  auto tanh_form = [&] { return attrs.get_string("approximate") == "tanh"; };
  switch (op) {
    case Op::Neg: return -unary();
    case Op::Exp: return exp(unary());
    case Op::Log: return log(unary());
    case Op::Sqrt: return sqrt(unary());
    case Op::Rsqrt: return rsqrt(unary());
    case Op::Abs: return abs(unary());
    case Op::Tanh: return tanh(unary());
    case Op::Relu: return relu(unary());
    case Op::Gelu: return tanh_form() ? gelu_tanh(unary()) : gelu_erf(unary());
    case Op::Sigmoid: return sigmoid(unary());
    case Op::Silu: return silu(unary());
    case Op::Softplus: return softplus(unary());
    case Op::Sin: return sin(unary());
    case Op::Cos: return cos(unary());
    case Op::Cast: return convert(unary(), from, to);
    case Op::Triu: {
      const Value<A>& x = unary();
      return select(at.col - at.row >= static_cast<double>(attrs.get_int("k")), x, constant(x, 0.0));
    }
    case Op::CausalMask: {
      const Value<A>& x = unary();
      return select(at.col > at.row, constant(x, -std::numeric_limits<double>::infinity()), x);
    }
    case Op::Dropout: return dropout(args, attrs, from, at.flat);
    case Op::Add: { auto [x, y] = binary(); return x + y; }
    case Op::Sub: { auto [x, y] = binary(); return x - y; }
    case Op::Mul: { auto [x, y] = binary(); return x * y; }
    case Op::Div: { auto [x, y] = binary(); return x / y; }
    case Op::Pow: { auto [x, y] = binary(); return pow(x, y); }
    case Op::Maximum: { auto [x, y] = binary(); return maximum(x, y); }
    case Op::Minimum: { auto [x, y] = binary(); return minimum(x, y); }
    case Op::Less: { auto [x, y] = binary(); return x < y; }
    case Op::LessEqual: { auto [x, y] = binary(); return x <= y; }
    case Op::Greater: { auto [x, y] = binary(); return x > y; }
    case Op::GreaterEqual: { auto [x, y] = binary(); return x >= y; }
    case Op::Equal: { auto [x, y] = binary(); return x == y; }
    case Op::NotEqual: { auto [x, y] = binary(); return x != y; }
    case Op::Where: return select(args.at(0), args.at(1), args.at(2));
    case Op::GeluGrad: {
      auto [x, dy] = binary();
      return (tanh_form() ? gelu_tanh_derivative(x) : gelu_erf_derivative(x)) * dy;
    }
    case Op::Copy: return unary();  // a fused group's copy of a view: the value itself
    default: break;
  }
  NAPKIN_INTERNAL_CHECK(false, "{} is not an elementwise op", op_name(op));
  return {};
}

}  // namespace napkin::ir::formulas
