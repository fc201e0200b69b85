// The op table walked row by row: every op carries what each stage needs
// (a shape rule, a cost rule, a precision rule, a VJP or none, a formula), so
// an op added without one of them fails here, not in a backend or a pass.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "frontend/lowering.h"
#include "interp/float64_arithmetic.h"
#include "ir/elementwise_formulas.h"
#include "ir/op.h"

namespace napkin {
namespace {

using ir::DType;
using ir::Op;
using ir::OpClass;
using ir::PrecisionRule;

std::vector<const ir::OpInfo*> all_rows() {
  std::vector<const ir::OpInfo*> rows;
  for (int i = 0; i < ir::kNumOps; ++i) rows.push_back(&ir::op_info(static_cast<Op>(i)));
  return rows;
}

using Value = interp::Float64Arithmetic::Value;

// One element of elementwise op `op` in the float64 arithmetic on sample
// operands: 0.5 of dtype f32, except where's condition (true) and dropout's
// rng words (seed 1, 2, step 3, training).
double evaluate(interp::Float64Arithmetic& arith, const ir::OpInfo& info, const ir::Attrs& attrs) {
  std::vector<Value> args;
  for (int i = 0; i < info.arity; ++i) {
    if (info.op == Op::Where && i == 0) args.push_back(arith.value(1, DType::Bool));
    else if (info.op == Op::Dropout && i > 0) args.push_back(arith.value(i, DType::I64));
    else args.push_back(arith.value(0.5, DType::F32));
  }
  ir::formulas::Position<interp::Float64Arithmetic> at{arith.value(1, DType::I64), arith.value(2, DType::I64),
                                                       arith.value(3, DType::I64)};
  return ir::formulas::apply_elementwise(info.op, attrs, DType::F32, DType::F32, args, at).handle().v;
}

TEST_CASE("op table: every row has its op, a name, an arity, a shape rule, a cost rule and a precision rule its class allows") {
  for (const ir::OpInfo* info : all_rows()) {
    CAPTURE(info->name);
    CHECK(!info->name.empty());
    CHECK(ir::find_op(info->name) == info->op);
    CHECK(info->arity >= -1);
    CHECK(bool(info->infer));
    CHECK(bool(info->cost));
    // Sources are as written, contractions contract, a view keeps its
    // input's dtype, and autodiff's ops never meet the pass.
    if (info->op_class == OpClass::Source) CHECK(info->precision == PrecisionRule::AsWritten);
    if (info->op_class == OpClass::Contraction) CHECK(info->precision == PrecisionRule::Contraction);
    if (info->op_class == OpClass::View || info->backward_only) CHECK(info->precision == PrecisionRule::FollowsInputs);
    if (info->precision == PrecisionRule::Contraction)
      CHECK((info->op_class == OpClass::Contraction || info->op_class == OpClass::Attention));
  }
}

TEST_CASE("op table: every forward op has a VJP and the backward-only ops have none") {
  for (const ir::OpInfo* info : all_rows()) {
    CAPTURE(info->name);
    CHECK(bool(info->vjp) != info->backward_only);
  }
}

TEST_CASE("op table: FLOPs per element are set where the class's cost rule counts them") {
  for (const ir::OpInfo* info : all_rows()) {
    CAPTURE(info->name);
    switch (info->op_class) {
      case OpClass::Elementwise:
        // A cast converts: the FLOP convention counts no arithmetic step in it.
        if (info->op != Op::Cast) CHECK(info->flops_per_element > 0);
        break;
      case OpClass::Normalization:
      case OpClass::Loss:
      case OpClass::Rotary: CHECK(info->flops_per_element > 0); break;
      case OpClass::Source:
      case OpClass::View:
      case OpClass::Copy:
      case OpClass::Contraction:
      case OpClass::Collective:
      case OpClass::Routing: CHECK(info->flops_per_element == 0); break;
      case OpClass::Reduction:
      case OpClass::Gather: break;  // their cost rules count per input element or per row
      case OpClass::Attention:
      case OpClass::Classifier:
        // Their cost rules count per visible score (per logit), and so do
        // their transcendentals (one exp each).
        CHECK(info->flops_per_element == 0);
        CHECK(info->transcendentals_per_element == 1);
        continue;
    }
    // A transcendental call is one of the steps the FLOPs count.
    CHECK(info->transcendentals_per_element >= 0);
    CHECK(info->transcendentals_per_element <= info->flops_per_element);
  }
}

TEST_CASE("op table: every elementwise op has a formula the float64 arithmetic evaluates") {
  interp::Float64Arithmetic arith;
  for (std::string approximate : {"tanh", "none"}) {
    ir::Attrs attrs{{"approximate", approximate}, {"k", int64_t{0}}, {"p", 0.25}, {"stream", int64_t{1}},
                    {"dtype", DType::F32}};
    for (const ir::OpInfo* info : all_rows()) {
      if (info->op_class != OpClass::Elementwise) continue;
      CAPTURE(info->name);
      CAPTURE(approximate);
      double v = NAN;
      CHECK_NOTHROW(v = evaluate(arith, *info, attrs));
      CHECK(!std::isnan(v));  // causal_mask's element above the diagonal is -inf
    }
  }
}

TEST_CASE("op table: gelu_grad's formula is the derivative of gelu's, in both forms") {
  interp::Float64Arithmetic arith;
  for (std::string approximate : {"tanh", "none"}) {
    CAPTURE(approximate);
    ir::Attrs attrs{{"approximate", approximate}};
    auto apply = [&](Op op, std::vector<Value> args) {
      return ir::formulas::apply_elementwise(op, attrs, DType::F64, DType::F64, args, {}).handle().v;
    };
    for (double x : {-3.0, -0.7, 0.0, 0.3, 2.5}) {
      CAPTURE(x);
      const double h = 1e-6;
      double slope = (apply(Op::Gelu, {arith.value(x + h, DType::F64)}) - apply(Op::Gelu, {arith.value(x - h, DType::F64)})) / (2 * h);
      CHECK(apply(Op::GeluGrad, {arith.value(x, DType::F64), arith.value(1, DType::F64)}) == doctest::Approx(slope).epsilon(1e-8));
    }
  }
}

TEST_CASE("op table: a user function is a unary elementwise op the frontend calls by its name") {
  std::vector<std::string> functions = frontend::known_functions();
  for (const ir::OpInfo* info : all_rows()) {
    if (info->user_function == ir::UserFunction::None) continue;
    CAPTURE(info->name);
    CHECK(info->op_class == OpClass::Elementwise);
    CHECK(info->arity == 1);
    CHECK(std::count(functions.begin(), functions.end(), std::string(info->name)) == 1);
  }
}

}  // namespace
}  // namespace napkin
