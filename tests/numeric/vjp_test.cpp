// Every op's VJP against float64 central differences. The test walks the op
// table: each op with a rule must have at least one sample configuration below
// (an op added later without one fails, naming it), and the ops without a rule
// must be exactly the backward-only ops at the end of ir/ops.def.
//
// A sample builds params -> the op -> out, then loss = sum(out * r) with r a
// random float input of out's shape (so every output element matters; a loss
// op's scalar is the loss itself). Autodiff and dce run as in the training
// pipeline, then EVERY element of every parameter gradient is compared with
// the five-point central difference of the loss in Float64, at a point the
// test chooses: values well away from kinks (|x| >= 0.25 for relu, abs; all
// values distinct by >= 0.01 so maximum/minimum/reduce_max have no ties;
// positive where log, sqrt, rsqrt, a divisor or pow's base need it). The
// tolerance is 1e-6 (napkin check uses 1e-5); the gradient computed in Native
// numerics (the graph's dtypes) is checked too, at napkin check's tolerance
// from each element's rounding noise (interp/gradient_check.h).
//
// NAPKIN_NUMERIC_VERBOSE=1 prints the largest errors per op.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "interp/gradient_check.h"
#include "interp/interpreter.h"
#include "ir/rng.h"
#include "ir/builder.h"
#include "ir/rope.h"
#include "runtime/rng.h"
#include "support/test_models.h"

using namespace napkin;
using ir::DType;
using ir::Op;
using ir::ValueId;

namespace {

// Where a parameter's values lie at the check point.
enum class Point {
  Signed,    // ±[0.25, 1.5]: away from the kinks of relu and abs at 0
  Positive,  // [0.5, 2]: log, sqrt, rsqrt, divisors, pow's base
  Central,   // [-0.2, 0.2]: maximum(a, b) against a Signed b picks each operand somewhere
};

// Builds one sample graph and its check point.
class Ctx {
 public:
  explicit Ctx(ir::Graph& g) : g_(g), b_(g), rng_(7, 11) {
    file_ = std::make_shared<const std::string>("numeric.yaml");
    b_.set_loc(loc());
  }

  ir::Builder& builder() { return b_; }
  ir::Graph& graph() { return g_; }
  std::map<ValueId, std::vector<double>>& point() { return point_; }

  // A trained parameter of `shape`; every value in the graph is distinct from
  // every other by at least 0.01 (no ties for maximum, reduce_max, ...).
  ValueId param(std::vector<int64_t> shape, Point where = Point::Signed, DType dtype = DType::F32) {
    ValueId v = g_.add_param("p" + std::to_string(params_++), type(shape, dtype), {}, loc());
    std::vector<double>& data = point_[v];
    data.resize(g_.value(v).type.numel());
    for (double& x : data) {
      for (;;) {
        double u = rng_.uniform01();
        if (where == Point::Positive) {
          x = 0.5 + 1.5 * u;
        } else if (where == Point::Central) {
          x = -0.2 + 0.4 * u;
        } else {
          x = 0.25 + 1.25 * u;
          if (rng_.next_u32() & 1) x = -x;
        }
        bool clash = false;
        for (double y : used_) clash = clash || std::fabs(x - y) < 0.01;
        if (!clash) break;
      }
      used_.push_back(x);
    }
    return v;
  }

  // A data input with the given values (integer ids, targets, bool masks).
  ValueId data(std::vector<int64_t> shape, DType dtype, std::vector<double> values) {
    ValueId v = g_.add_input("in" + std::to_string(inputs_++), type(shape, dtype), loc());
    REQUIRE(static_cast<int64_t>(values.size()) == g_.value(v).type.numel());
    point_[v] = std::move(values);
    return v;
  }

  // A float data input ~ N(0, 1).
  ValueId random_input(const ir::TensorType& t) {
    ValueId v = g_.add_input("r" + std::to_string(inputs_++), t, loc());
    std::vector<double>& d = point_[v];
    d.resize(t.numel());
    for (double& x : d) x = rng_.normal();
    return v;
  }

  ValueId op(Op op, std::vector<ValueId> inputs, ir::Attrs attrs = {}) {
    ir::Built built = b_.add(op, std::move(inputs), std::move(attrs));
    INFO(built.error);
    REQUIRE(built.ok());
    return built.value;
  }

  static ir::TensorType type(const std::vector<int64_t>& shape, DType dtype) {
    ir::TensorType t;
    t.dtype = dtype;
    for (int64_t s : shape) t.dims.push_back({s, ""});
    return t;
  }

 private:
  ir::Graph& g_;
  ir::Builder b_;
  runtime::Rng rng_;
  std::shared_ptr<const std::string> file_;
  std::map<ValueId, std::vector<double>> point_;
  std::vector<double> used_;
  int params_ = 0, inputs_ = 0;
  ir::SourceLoc loc() const { return {file_, 1, 1}; }
};

using BuildFn = std::function<ValueId(Ctx&)>;
struct Sample {
  std::string label;
  BuildFn build;
};

std::vector<int64_t> ints(std::initializer_list<int64_t> v) { return v; }

ir::Attrs reduce_attrs(std::vector<int64_t> axes, int64_t keepdims) { return {{"axes", axes}, {"keepdims", keepdims}}; }

ir::Attrs einsum_attrs(std::vector<int64_t> lhs, std::vector<int64_t> rhs, std::vector<int64_t> out, std::string spec) {
  return {{"lhs", lhs}, {"rhs", rhs}, {"out", out}, {"axis_names", std::string("i j k l")}, {"spec", spec}};
}

// The sample configurations, by op. Each builds a graph containing the op
// and returns the value to weight into the loss.
std::map<Op, std::vector<Sample>> sample_table() {
  std::map<Op, std::vector<Sample>> t;
  auto add = [&](Op op, std::string label, BuildFn f) { t[op].push_back({std::move(label), std::move(f)}); };

  // Sources: they feed differentiable computations.
  add(Op::Constant, "p * constant", [](Ctx& c) {
    return c.op(Op::Mul, {c.param({3, 4}), c.builder().must(c.builder().constant(2.5, DType::F32))});
  });
  add(Op::Constant, "constant - p", [](Ctx& c) {
    return c.op(Op::Sub, {c.builder().must(c.builder().constant(0.5, DType::F32)), c.param({3, 4})});
  });
  add(Op::Iota, "embedding(p, arange)", [](Ctx& c) {
    ValueId ids = c.op(Op::Iota, {}, {{"n", int64_t{4}}, {"dtype", DType::I32}});
    return c.op(Op::Embedding, {c.param({6, 3}), ids});
  });
  add(Op::Iota, "p * cast(arange)", [](Ctx& c) {
    ValueId ids = c.op(Op::Iota, {}, {{"n", int64_t{4}}, {"dtype", DType::I32}});
    return c.op(Op::Mul, {c.param({3, 4}), c.op(Op::Cast, {ids}, {{"dtype", DType::F32}})});
  });

  // Elementwise, unary.
  for (Op op : {Op::Neg, Op::Exp, Op::Tanh, Op::Relu, Op::Abs, Op::Sigmoid, Op::Silu, Op::Softplus, Op::Sin, Op::Cos})
    add(op, "[3,4]", [op](Ctx& c) { return c.op(op, {c.param({3, 4})}); });
  for (Op op : {Op::Log, Op::Sqrt, Op::Rsqrt})
    add(op, "[3,4] positive", [op](Ctx& c) { return c.op(op, {c.param({3, 4}, Point::Positive)}); });
  add(Op::Exp, "scalar", [](Ctx& c) { return c.op(Op::Exp, {c.param({})}); });
  add(Op::Relu, "relu(p) * p (rank 3)", [](Ctx& c) {
    ValueId p = c.param({2, 2, 3});
    return c.op(Op::Mul, {c.op(Op::Relu, {p}), p});
  });
  for (const char* approx : {"tanh", "none"})
    add(Op::Gelu, std::string("approximate=") + approx, [approx](Ctx& c) {
      return c.op(Op::Gelu, {c.param({3, 4})}, {{"approximate", std::string(approx)}});
    });
  add(Op::Cast, "f32 -> f64 -> f32", [](Ctx& c) {
    ValueId h = c.op(Op::Cast, {c.param({3, 4})}, {{"dtype", DType::F64}});
    return c.op(Op::Cast, {c.op(Op::Exp, {h})}, {{"dtype", DType::F32}});
  });
  add(Op::Cast, "f32 -> bf16 -> f32", [](Ctx& c) {
    ValueId h = c.op(Op::Cast, {c.param({3, 4})}, {{"dtype", DType::BF16}});
    return c.op(Op::Cast, {c.op(Op::Tanh, {h})}, {{"dtype", DType::F32}});
  });
  add(Op::Cast, "p * cast(int ids)", [](Ctx& c) {
    ValueId ids = c.data({3, 4}, DType::I32, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
    return c.op(Op::Mul, {c.param({3, 4}), c.op(Op::Cast, {ids}, {{"dtype", DType::F32}})});
  });
  for (int64_t k : {-1, 0, 1})
    add(Op::Triu, fmt::format("[2,3,3] k={}", k), [k](Ctx& c) { return c.op(Op::Triu, {c.param({2, 3, 3})}, {{"k", k}}); });
  add(Op::Triu, "[3,4] k=1", [](Ctx& c) { return c.op(Op::Triu, {c.param({3, 4})}, {{"k", int64_t{1}}}); });
  // The masked entries are -inf: softmax turns them into zeros.
  add(Op::CausalMask, "softmax(causal_mask([2,3,3]))", [](Ctx& c) {
    return c.op(Op::Softmax, {c.op(Op::CausalMask, {c.param({2, 3, 3})})}, {{"axis", int64_t{2}}});
  });
  add(Op::CausalMask, "softmax(causal_mask([4,4]))", [](Ctx& c) {
    return c.op(Op::Softmax, {c.op(Op::CausalMask, {c.param({4, 4})})}, {{"axis", int64_t{1}}});
  });

  // The rng words of step 3 under seed 5 fix the mask: the gradient is dy * mask / (1 - p).
  add(Op::Dropout, "[3,5] p=0.4", [](Ctx& c) {
    std::vector<ValueId> inputs{c.param({3, 5})};
    for (ValueId w : ir::rng_words(c.builder())) inputs.push_back(w);
    std::vector<double> words;
    for (int64_t w : runtime::rng_tensor_words(5, 3, true)) words.push_back(static_cast<double>(w));
    c.point()[c.graph().rng] = words;
    return c.op(Op::Dropout, inputs, {{"p", 0.4}, {"stream", int64_t{2}}});
  });

  // Elementwise, binary: every kind of broadcasting, on both sides.
  struct Shapes {
    const char* label;
    std::vector<int64_t> a, b;
  };
  const std::vector<Shapes> shapes = {
      {"[3,4] . [3,4]", {3, 4}, {3, 4}},       {"[] . [3,4]", {}, {3, 4}},
      {"[3,4] . []", {3, 4}, {}},              {"[3,1] . [1,4]", {3, 1}, {1, 4}},
      {"[4] . [2,3,4]", {4}, {2, 3, 4}},       {"[2,3,4] . [3,1]", {2, 3, 4}, {3, 1}},
  };
  for (Op op : {Op::Add, Op::Sub, Op::Mul, Op::Div, Op::Pow, Op::Maximum, Op::Minimum})
    for (const Shapes& s : shapes)
      add(op, s.label, [op, s](Ctx& c) {
        // div needs a divisor away from 0; pow a positive base (its exponent, a param, is signed);
        // maximum and minimum pick a somewhere and b elsewhere: the smaller operand lies near 0.
        Point pa = op == Op::Pow ? Point::Positive : Point::Signed;
        Point pb = op == Op::Div ? Point::Positive : Point::Signed;
        if (op == Op::Maximum || op == Op::Minimum) {
          auto numel = [](const std::vector<int64_t>& shape) {
            int64_t n = 1;
            for (int64_t x : shape) n *= x;
            return n;
          };
          (numel(s.a) <= numel(s.b) ? pa : pb) = Point::Central;
        }
        ValueId a = c.param(s.a, pa), b = c.param(s.b, pb);
        return c.op(op, {a, b});
      });
  // One value as both operands: the two contributions accumulate (x - x is constant: no sample for sub).
  for (Op op : {Op::Add, Op::Mul, Op::Div})
    add(op, "(x . x) * x (one value, both operands)", [op](Ctx& c) {
      ValueId x = c.param({3, 4}, op == Op::Div ? Point::Positive : Point::Signed);
      return c.op(Op::Mul, {c.op(op, {x, x}), x});
    });
  add(Op::Pow, "x ^ x", [](Ctx& c) {
    ValueId x = c.param({3, 4}, Point::Positive);
    return c.op(Op::Pow, {x, x});
  });
  // Comparisons make where's condition; the gradient flows through where.
  for (Op op : {Op::Less, Op::LessEqual, Op::Greater, Op::GreaterEqual})
    add(op, "where(cmp(a, b), a, b)", [op](Ctx& c) {
      ValueId a = c.param({3, 4}, Point::Central), b = c.param({4});
      return c.op(Op::Where, {c.op(op, {a, b}), a, b});
    });
  // Distinct floats are never equal: compare integer data.
  for (Op op : {Op::Less, Op::LessEqual, Op::Greater, Op::GreaterEqual, Op::Equal, Op::NotEqual})
    add(op, "where(cmp(int i, int j), a, b)", [op](Ctx& c) {
      ValueId i = c.data({3, 4}, DType::I32, {0, 1, 2, 3, 3, 2, 1, 0, 1, 1, 2, 2});
      ValueId j = c.data({4}, DType::I32, {1, 1, 2, 0});
      return c.op(Op::Where, {c.op(op, {i, j}), c.param({3, 4}), c.param({3, 1})});
    });
  add(Op::Where, "bool [3,4], [3,4], [3,4]", [](Ctx& c) {
    ValueId cond = c.data({3, 4}, DType::Bool, {1, 0, 0, 1, 1, 1, 0, 0, 0, 1, 0, 1});
    return c.op(Op::Where, {cond, c.param({3, 4}), c.param({3, 4})});
  });
  add(Op::Where, "bool [3,1], [], [1,4]", [](Ctx& c) {
    ValueId cond = c.data({3, 1}, DType::Bool, {1, 0, 1});
    return c.op(Op::Where, {cond, c.param({}), c.param({1, 4})});
  });
  add(Op::Where, "bool [2,3,4], [4], [3,1]", [](Ctx& c) {
    std::vector<double> mask(24);
    for (size_t i = 0; i < mask.size(); ++i) mask[i] = (i * 7 + i / 5) % 3 == 0;
    ValueId cond = c.data({2, 3, 4}, DType::Bool, mask);
    return c.op(Op::Where, {cond, c.param({4}), c.param({3, 1})});
  });

  // Reductions over several axes, with and without keepdims; max/min at distinct values.
  for (Op op : {Op::ReduceSum, Op::ReduceMean, Op::ReduceMax, Op::ReduceMin}) {
    for (int64_t keep : {0, 1}) {
      add(op, fmt::format("[2,3,4] axes 0,2 keepdims={}", keep),
          [op, keep](Ctx& c) { return c.op(op, {c.param({2, 3, 4})}, reduce_attrs({0, 2}, keep)); });
      add(op, fmt::format("[2,3,4] all axes keepdims={}", keep),
          [op, keep](Ctx& c) { return c.op(op, {c.param({2, 3, 4})}, reduce_attrs({0, 1, 2}, keep)); });
    }
    add(op, "[2,3,4] axis 1", [op](Ctx& c) { return c.op(op, {c.param({2, 3, 4})}, reduce_attrs({1}, 0)); });
    add(op, "[3,4] axes 0,1 then * p", [op](Ctx& c) {
      ValueId p = c.param({3, 4});
      return c.op(Op::Mul, {c.op(op, {p}, reduce_attrs({0, 1}, 1)), p});
    });
  }

  // Contractions, with batch broadcasting on either side.
  add(Op::MatMul, "[3,4] @ [4,5]", [](Ctx& c) { return c.op(Op::MatMul, {c.param({3, 4}), c.param({4, 5})}); });
  add(Op::MatMul, "[2,3,4] @ [4,5]", [](Ctx& c) { return c.op(Op::MatMul, {c.param({2, 3, 4}), c.param({4, 5})}); });
  add(Op::MatMul, "[3,4] @ [2,4,5]", [](Ctx& c) { return c.op(Op::MatMul, {c.param({3, 4}), c.param({2, 4, 5})}); });
  add(Op::MatMul, "[2,1,3,4] @ [5,4,2]", [](Ctx& c) {
    return c.op(Op::MatMul, {c.param({2, 1, 3, 4}), c.param({5, 4, 2})});
  });
  add(Op::MatMul, "[1,3,4] @ [2,4,5]", [](Ctx& c) { return c.op(Op::MatMul, {c.param({1, 3, 4}), c.param({2, 4, 5})}); });
  add(Op::MatMul, "[2,3,4] @ [1,4,5]", [](Ctx& c) { return c.op(Op::MatMul, {c.param({2, 3, 4}), c.param({1, 4, 5})}); });
  add(Op::MatMul, "x @ x", [](Ctx& c) {
    ValueId x = c.param({3, 3});
    return c.op(Op::MatMul, {x, x});
  });
  add(Op::Einsum, "i j k, k l -> i l (j summed in one operand)", [](Ctx& c) {
    return c.op(Op::Einsum, {c.param({3, 4, 5}), c.param({5, 2})}, einsum_attrs({0, 1, 2}, {2, 3}, {0, 3}, "i j k, k l -> i l"));
  });
  add(Op::Einsum, "i j, k j -> k i j", [](Ctx& c) {
    return c.op(Op::Einsum, {c.param({3, 4}), c.param({2, 4})}, einsum_attrs({0, 1}, {2, 1}, {2, 0, 1}, "i j, k j -> k i j"));
  });
  add(Op::Einsum, "i j, k -> k i j (outer)", [](Ctx& c) {
    return c.op(Op::Einsum, {c.param({3, 4}), c.param({2})}, einsum_attrs({0, 1}, {2}, {2, 0, 1}, "i j, k -> k i j"));
  });
  add(Op::Einsum, "i j, i j -> (full contraction)", [](Ctx& c) {
    return c.op(Op::Einsum, {c.param({3, 4}), c.param({3, 4})}, einsum_attrs({0, 1}, {0, 1}, {}, "i j, i j ->"));
  });
  add(Op::Einsum, "i j k, l k -> l j (i summed in one operand, k contracted)", [](Ctx& c) {
    return c.op(Op::Einsum, {c.param({2, 3, 4}), c.param({5, 4})}, einsum_attrs({0, 1, 2}, {3, 2}, {3, 1}, "i j k, l k -> l j"));
  });

  // Views.
  add(Op::Reshape, "[3,4] -> [2,6]", [](Ctx& c) { return c.builder().must(c.builder().reshape(c.param({3, 4}), {{2, ""}, {6, ""}})); });
  add(Op::Reshape, "[2,3,4] -> [24]", [](Ctx& c) { return c.builder().must(c.builder().reshape(c.param({2, 3, 4}), {{24, ""}})); });
  add(Op::Reshape, "permute then reshape (a copy)", [](Ctx& c) {
    ValueId p = c.builder().must(c.builder().permute(c.param({2, 3, 4}), ints({2, 0, 1})));
    return c.builder().must(c.builder().reshape(p, {{4, ""}, {6, ""}}));
  });
  add(Op::Permute, "[2,3,4] perm 2,0,1", [](Ctx& c) { return c.op(Op::Permute, {c.param({2, 3, 4})}, {{"perm", ints({2, 0, 1})}}); });
  add(Op::Permute, "[3,4] transpose", [](Ctx& c) { return c.op(Op::Permute, {c.param({3, 4})}, {{"perm", ints({1, 0})}}); });
  add(Op::Broadcast, "[3,1] -> [2,3,4]", [](Ctx& c) { return c.op(Op::Broadcast, {c.param({3, 1})}, {{"shape", ints({2, 3, 4})}}); });
  add(Op::Broadcast, "[4] -> [3,4]", [](Ctx& c) { return c.op(Op::Broadcast, {c.param({4})}, {{"shape", ints({3, 4})}}); });
  add(Op::Broadcast, "[] -> [2,3]", [](Ctx& c) { return c.op(Op::Broadcast, {c.param({})}, {{"shape", ints({2, 3})}}); });
  add(Op::Slice, "[3,4] axis 1 [1,3)", [](Ctx& c) {
    return c.op(Op::Slice, {c.param({3, 4})}, {{"axis", int64_t{1}}, {"start", int64_t{1}}, {"stop", int64_t{3}}});
  });
  add(Op::Slice, "[4,3] axis 0 [0,2)", [](Ctx& c) {
    return c.op(Op::Slice, {c.param({4, 3})}, {{"axis", int64_t{0}}, {"start", int64_t{0}}, {"stop", int64_t{2}}});
  });
  add(Op::Slice, "two slices of one value", [](Ctx& c) {
    ValueId p = c.param({2, 5});
    ValueId a = c.op(Op::Slice, {p}, {{"axis", int64_t{1}}, {"start", int64_t{0}}, {"stop", int64_t{3}}});
    ValueId b = c.op(Op::Slice, {p}, {{"axis", int64_t{1}}, {"start", int64_t{2}}, {"stop", int64_t{5}}});
    return c.op(Op::Mul, {a, b});
  });
  add(Op::Select, "[3,4] axis 1 index 2", [](Ctx& c) {
    return c.op(Op::Select, {c.param({3, 4})}, {{"axis", int64_t{1}}, {"index", int64_t{2}}});
  });
  add(Op::Select, "[2,3,4] axis 0 index 1", [](Ctx& c) {
    return c.op(Op::Select, {c.param({2, 3, 4})}, {{"axis", int64_t{0}}, {"index", int64_t{1}}});
  });
  add(Op::Select, "q * k of one value split by selects (a concat)", [](Ctx& c) {
    ValueId p = c.param({2, 3, 4});
    ValueId q = c.op(Op::Select, {p}, {{"axis", int64_t{0}}, {"index", int64_t{0}}});
    ValueId k = c.op(Op::Select, {p}, {{"axis", int64_t{0}}, {"index", int64_t{1}}});
    return c.op(Op::Mul, {q, k});
  });

  // Data movement.
  add(Op::Copy, "copy(p)", [](Ctx& c) { return c.op(Op::Copy, {c.param({3, 4})}); });
  add(Op::Copy, "copy(transpose(p))", [](Ctx& c) {
    return c.op(Op::Copy, {c.op(Op::Permute, {c.param({3, 4})}, {{"perm", ints({1, 0})}})});
  });
  add(Op::Concat, "axis 1 of [3,4], [3,2], [3,1]", [](Ctx& c) {
    return c.op(Op::Concat, {c.param({3, 4}), c.param({3, 2}), c.param({3, 1})}, {{"axis", int64_t{1}}});
  });
  add(Op::Concat, "axis 0 of [1,3], [2,3]", [](Ctx& c) {
    return c.op(Op::Concat, {c.param({1, 3}), c.param({2, 3})}, {{"axis", int64_t{0}}});
  });
  add(Op::Concat, "one value twice", [](Ctx& c) {
    ValueId p = c.param({2, 3});
    return c.op(Op::Concat, {p, p}, {{"axis", int64_t{0}}});
  });
  add(Op::Pad, "[3,4] axis 0 (1, 2)", [](Ctx& c) {
    return c.op(Op::Pad, {c.param({3, 4})}, {{"axis", int64_t{0}}, {"before", int64_t{1}}, {"after", int64_t{2}}});
  });
  add(Op::Pad, "[2,3,4] axis 2 (0, 3)", [](Ctx& c) {
    return c.op(Op::Pad, {c.param({2, 3, 4})}, {{"axis", int64_t{2}}, {"before", int64_t{0}}, {"after", int64_t{3}}});
  });
  add(Op::Embedding, "[5,3] table, [2,3] ids with repeats and an unused row", [](Ctx& c) {
    ValueId ids = c.data({2, 3}, DType::I32, {0, 3, 1, 3, 4, 0});
    return c.op(Op::Embedding, {c.param({5, 3}), ids});
  });
  add(Op::Embedding, "[6,2,2] table, [4] i64 ids", [](Ctx& c) {
    ValueId ids = c.data({4}, DType::I64, {5, 0, 5, 2});
    return c.op(Op::Embedding, {c.param({6, 2, 2}), ids});
  });

  // Composite ops.
  for (int64_t axis : {0, 1, 2}) {
    add(Op::Softmax, fmt::format("[2,3,4] axis {}", axis),
        [axis](Ctx& c) { return c.op(Op::Softmax, {c.param({2, 3, 4})}, {{"axis", axis}}); });
    add(Op::LogSoftmax, fmt::format("[2,3,4] axis {}", axis),
        [axis](Ctx& c) { return c.op(Op::LogSoftmax, {c.param({2, 3, 4})}, {{"axis", axis}}); });
  }
  // Fused attention: odd lengths, 3 heads, grouped heads, causal with fewer queries than keys.
  add(Op::Attention, "causal q [1,3,5,4], k v [1,3,5,4]", [](Ctx& c) {
    return c.op(Op::Attention, {c.param({1, 3, 5, 4}), c.param({1, 3, 5, 4}), c.param({1, 3, 5, 4})},
                {{"causal", int64_t{1}}, {"scale", 0.5}});
  });
  add(Op::Attention, "full, q [2,2,3,3], k v [2,2,4,3]", [](Ctx& c) {
    return c.op(Op::Attention, {c.param({2, 2, 3, 3}), c.param({2, 2, 4, 3}), c.param({2, 2, 4, 3})},
                {{"causal", int64_t{0}}, {"scale", 0.7}});
  });
  add(Op::Attention, "causal grouped, q [1,4,3,2], k v [1,2,5,2]", [](Ctx& c) {
    return c.op(Op::Attention, {c.param({1, 4, 3, 2}), c.param({1, 2, 5, 2}), c.param({1, 2, 5, 2})},
                {{"causal", int64_t{1}}, {"scale", 1.0}});
  });
  add(Op::LayerNorm, "[2,3,4]", [](Ctx& c) {
    return c.op(Op::LayerNorm, {c.param({2, 3, 4}), c.param({4}), c.param({4})}, {{"eps", 1e-5}});
  });
  add(Op::LayerNorm, "[5] vector, eps 0.1", [](Ctx& c) {
    return c.op(Op::LayerNorm, {c.param({5}), c.param({5}), c.param({5})}, {{"eps", 0.1}});
  });
  add(Op::RMSNorm, "[2,3,4]", [](Ctx& c) {
    return c.op(Op::RMSNorm, {c.param({2, 3, 4}), c.param({4})}, {{"eps", 1e-5}});
  });
  add(Op::RMSNorm, "[5] vector, eps 0.1", [](Ctx& c) {
    return c.op(Op::RMSNorm, {c.param({5}), c.param({5})}, {{"eps", 0.1}});
  });
  add(Op::CrossEntropy, "[2,3,5] logits, [2,3] targets", [](Ctx& c) {
    ValueId targets = c.data({2, 3}, DType::I32, {4, 0, 2, 2, 1, 4});
    return c.op(Op::CrossEntropy, {c.param({2, 3, 5}), targets});
  });
  add(Op::CrossEntropy, "[4,3] logits, [4] i64 targets, times p", [](Ctx& c) {
    ValueId targets = c.data({4}, DType::I64, {0, 2, 1, 2});
    ValueId ce = c.op(Op::CrossEntropy, {c.param({4, 3}), targets});
    return c.op(Op::Mul, {ce, c.param({})});
  });
  // The fused classifier: rows over two axes, a vocabulary not a multiple of
  // anything, i64 targets, w read through a transposed view, a scaled loss.
  add(Op::LinearCrossEntropy, "x [2,3,4], w [5,4], [2,3] targets", [](Ctx& c) {
    ValueId targets = c.data({2, 3}, DType::I32, {4, 0, 2, 2, 1, 4});
    return c.op(Op::LinearCrossEntropy, {c.param({2, 3, 4}), c.param({5, 4}), targets});
  });
  add(Op::LinearCrossEntropy, "x [4,3], w viewed from [3,7], i64 targets, times p", [](Ctx& c) {
    ValueId targets = c.data({4}, DType::I64, {6, 0, 3, 6});
    ValueId w = c.op(Op::Permute, {c.param({3, 7})}, {{"perm", std::vector<int64_t>{1, 0}}});
    ValueId loss = c.op(Op::LinearCrossEntropy, {c.param({4, 3}), w, targets});
    return c.op(Op::Mul, {loss, c.param({})});
  });
  // rope: both pairings, a strided operand, the rotated axis not last,
  // Llama 3.1's scaling, explicit positions (one past the sequence's length).
  auto rope_attrs = [](ir::RopeStyle style, int64_t axis, int64_t seq_axis, double factor, bool positions) {
    ir::RopeParams p;
    p.style = style, p.axis = axis, p.seq_axis = seq_axis, p.theta = 100, p.explicit_positions = positions;
    if (factor > 0) p.factor = factor, p.original_context = 8;
    ir::Attrs a;
    ir::set_rope_attrs(a, p);
    return a;
  };
  add(Op::Rope, "half, [2,5,6] axis 2, seq 1", [=](Ctx& c) {
    return c.op(Op::Rope, {c.param({2, 5, 6})}, rope_attrs(ir::RopeStyle::Half, 2, 1, 0, false));
  });
  add(Op::Rope, "interleaved, [4,3,5] viewed as [3,5,4], axis 2, seq 1", [=](Ctx& c) {
    ValueId x = c.op(Op::Permute, {c.param({4, 3, 5})}, {{"perm", ints({1, 2, 0})}});
    return c.op(Op::Rope, {x}, rope_attrs(ir::RopeStyle::Interleaved, 2, 1, 0, false));
  });
  add(Op::Rope, "half, [8,3] axis 0, seq 1, factor 4", [=](Ctx& c) {
    return c.op(Op::Rope, {c.param({8, 3})}, rope_attrs(ir::RopeStyle::Half, 0, 1, 4, false));
  });
  add(Op::Rope, "interleaved, [3,4], i64 positions 7, 0, 3", [=](Ctx& c) {
    ValueId positions = c.data({3}, DType::I64, {7, 0, 3});
    return c.op(Op::Rope, {c.param({3, 4}), positions}, rope_attrs(ir::RopeStyle::Interleaved, 1, 0, 0, true));
  });
  // top_k: the picked values' gradient lands where they were picked (the
  // parameters' values are distinct, so a small step never changes the pick);
  // rows over two leading axes, k of all n, a strided operand.
  auto top_k = [](Ctx& c, ValueId x, int64_t k) { return c.op(Op::TopK, {x}, {{"k", k}}); };
  add(Op::TopK, "[3,5] k=2", [=](Ctx& c) { return top_k(c, c.param({3, 5}), 2); });
  add(Op::TopK, "[2,3,4] k=4 (every element, sorted)", [=](Ctx& c) { return top_k(c, c.param({2, 3, 4}), 4); });
  add(Op::TopK, "[6] k=1", [=](Ctx& c) { return top_k(c, c.param({6}), 1); });
  add(Op::TopK, "[5,3] viewed as [3,5], k=3", [=](Ctx& c) {
    return top_k(c, c.op(Op::Permute, {c.param({5, 3})}, {{"perm", ints({1, 0})}}), 3);
  });
  // moe_slots' results are integers and counts of them: they gate and scale
  // what flows, never carry a gradient (its f32 counts are data: autodiff
  // must not ask for theirs). Four tokens' top-2 of 3 experts at capacity 2
  // drop some choices; a kept value is scaled by its expert's count, a
  // dropped one contributes nothing.
  add(Op::MoeSlots, "top-2 values of [4,3] kept where placed (capacity 2), times their expert's count", [=](Ctx& c) {
    const ValueId values = top_k(c, c.param({4, 3}), 2);
    const ValueId indices = c.graph().node(c.graph().value(values).producer).out(1);
    const ValueId pos = c.op(Op::MoeSlots, {indices}, {{"experts", int64_t{3}}, {"capacity", int64_t{2}}});
    const ValueId counts = c.graph().node(c.graph().value(pos).producer).out(2);
    const ValueId per_expert = c.builder().must(c.builder().reshape(counts, {{3, ""}, {1, ""}}));
    const ValueId count = c.builder().must(c.builder().reshape(c.op(Op::Embedding, {per_expert, indices}), {{4, ""}, {2, ""}}));
    const ValueId kept = c.op(Op::GreaterEqual, {pos, c.builder().must(c.builder().constant(0, DType::I32))});
    const ValueId zero = c.builder().must(c.builder().constant(0, DType::F32));
    return c.op(Op::Where, {kept, c.op(Op::Mul, {values, count}), zero});
  });
  add(Op::MSE, "[3,4], [3,4]", [](Ctx& c) { return c.op(Op::MSE, {c.param({3, 4}), c.param({3, 4})}); });
  add(Op::MSE, "[5] vs itself squared", [](Ctx& c) {
    ValueId p = c.param({5});
    return c.op(Op::MSE, {p, c.op(Op::Mul, {p, p})});
  });
  return t;
}

// The names of the ops ir/ops.def lists after its "Backward-only ops" comment.
std::set<std::string> backward_only_in_ops_def() {
  std::ifstream in(napkin::testing::source_path("ir/ops.def"));
  REQUIRE(in.good());
  std::set<std::string> names;
  bool after = false;
  std::regex op_line(R"re(^OP\(\s*\w+\s*,\s*"([a-z_]+)")re");
  for (std::string line; std::getline(in, line);) {
    if (line.find("Backward-only ops") != std::string::npos) after = true;
    std::smatch m;
    if (after && std::regex_search(line, m, op_line)) names.insert(m[1]);
  }
  return names;
}

struct Errors {
  double f64 = 0, native = 0;
  int elements = 0;
};

constexpr double kRuleTolerance = 1e-6;  // tighter than napkin check's 1e-5: small tensors, chosen points

// Differentiates g (autodiff + dce, verified) and compares every element of
// every parameter gradient with five-point central differences in Float64.
Errors check_every_element(ir::Graph& g, const std::map<ValueId, std::vector<double>>& point) {
  napkin::testing::differentiate(g);

  interp::Interpreter exact(g, interp::Numerics::Float64), native(g, interp::Numerics::Native);
  for (interp::Interpreter* it : {&exact, &native}) {
    it->set(point);
    it->run();
  }
  ir::Graph forward = interp::forward_phase(g);
  interp::Interpreter eval(forward, interp::Numerics::Float64);
  eval.set(point);
  ValueId loss = g.find_output("loss");
  // Each gradient's rounding noise (RMS deviation over noisy Native runs).
  std::map<ValueId, std::vector<double>> noise_squares;
  constexpr int kNoiseRuns = 8;
  interp::run_with_rounding_noise(g, point, kNoiseRuns, 7, [&](const interp::Interpreter& noisy) {
    for (const ir::Param& p : g.params) {
      ValueId grad = g.find_output("grad." + g.value(p.value).name);
      if (grad == ir::kNoValue) continue;
      const std::vector<double>& moved = noisy.get(grad);
      const std::vector<double>& plain = native.get(grad);
      std::vector<double>& sums = noise_squares[grad];
      sums.resize(moved.size());
      for (size_t i = 0; i < moved.size(); ++i) sums[i] += (moved[i] - plain[i]) * (moved[i] - plain[i]);
    }
  });

  Errors errors;
  for (const ir::Param& p : g.params) {
    const std::string& name = g.value(p.value).name;
    CAPTURE(name);
    ValueId grad = g.find_output("grad." + name);
    REQUIRE_MESSAGE(grad != ir::kNoValue, "every parameter of a sample must reach the loss");
    const std::vector<double>& analytic = exact.get(grad);
    const std::vector<double>& analytic_native = native.get(grad);
    std::vector<double> base = point.at(p.value), moved = base;
    double largest = 0;
    for (double a : analytic) largest = std::max(largest, std::fabs(a));
    REQUIRE_MESSAGE(largest > 0, "a sample whose gradient is all zeros checks nothing");
    const double floor = 1e-3 * largest;
    for (size_t i = 0; i < base.size(); ++i) {
      double h = 1e-4 * std::max(1.0, std::fabs(base[i]));
      double numeric = interp::five_point_derivative(
          [&](double step) {
            moved[i] = base[i] + step;
            eval.set(p.value, moved);
            eval.run();
            return eval.get(loss)[0];
          },
          h);
      moved[i] = base[i];
      double e64 = interp::relative_error(analytic[i], numeric, floor);
      double enat = interp::relative_error(analytic_native[i], numeric, floor);
      double scale = std::max({std::fabs(analytic_native[i]), std::fabs(numeric), floor});
      double native_tol = interp::native_tolerance(std::sqrt(noise_squares[grad][i] / kNoiseRuns) / scale);
      CAPTURE(i);
      CAPTURE(numeric);
      CAPTURE(analytic[i]);
      CAPTURE(analytic_native[i]);
      CHECK(e64 <= kRuleTolerance);
      CHECK(enat <= native_tol);
      errors.f64 = std::max(errors.f64, e64);
      errors.native = std::max(errors.native, enat);
      ++errors.elements;
    }
    eval.set(p.value, base);
  }
  return errors;
}

// One op's node in the forward schedule (the sample must really contain it).
bool has_forward_op(const ir::Graph& g, Op op) {
  for (ir::NodeId id : g.schedule())
    if (g.node(id).phase == ir::Phase::Forward && g.node(id).op == op) return true;
  return false;
}

}  // namespace

TEST_CASE("numeric: every op's VJP matches float64 central differences") {
  const std::map<Op, std::vector<Sample>> table = sample_table();
  const bool verbose = std::getenv("NAPKIN_NUMERIC_VERBOSE") != nullptr;
  std::set<std::string> without_vjp;
  int samples = 0, elements = 0;
  for (int i = 0; i < ir::kNumOps; ++i) {
    const Op op = static_cast<Op>(i);
    const std::string name(ir::op_name(op));
    CAPTURE(name);
    if (ir::op_info(op).vjp == nullptr) {
      without_vjp.insert(name);
      continue;
    }
    auto it = table.find(op);
    if (it == table.end() || it->second.empty()) {
      FAIL_CHECK("add a numeric sample for op " << name << " to tests/numeric/vjp_test.cpp");
      continue;
    }
    Errors worst;
    for (const Sample& s : it->second) {
      CAPTURE(s.label);
      ir::Graph g;
      g.name = name;
      Ctx c(g);
      ValueId out = s.build(c);
      ValueId loss = out;
      if (ir::op_info(g.node(g.value(out).producer).op).op_class != ir::OpClass::Loss) {
        // sum(out * r): random weights, so every element of out matters.
        const ir::TensorType t = g.value(out).type;
        ValueId weighted = c.op(Op::Mul, {out, c.random_input(t)});
        std::vector<int64_t> all(t.rank());
        for (int k = 0; k < t.rank(); ++k) all[k] = k;
        loss = t.rank() == 0 ? weighted : c.op(Op::ReduceSum, {weighted}, reduce_attrs(all, 0));
      }
      REQUIRE(g.value(loss).type.rank() == 0);
      g.outputs = {{"loss", loss}};
      Errors e = check_every_element(g, c.point());
      CHECK_MESSAGE(has_forward_op(g, op), "the sample does not contain a " << name << " node the loss needs");
      if (verbose) std::cout << fmt::format("  {:<14} {:<58} f64 {:8.1e}  native {:8.1e}  ({} elements)\n", name, s.label, e.f64, e.native, e.elements);
      worst.f64 = std::max(worst.f64, e.f64);
      worst.native = std::max(worst.native, e.native);
      worst.elements += e.elements;
      ++samples;
    }
    elements += worst.elements;
    if (verbose)
      std::cout << fmt::format("{:<16} max f64 {:8.1e}  max native {:8.1e}  ({} samples, {} elements)\n", name,
                               worst.f64, worst.native, it->second.size(), worst.elements);
  }
  // The ops without a rule are exactly the backward-only ones, listed last in ops.def.
  const std::set<std::string> listed = backward_only_in_ops_def();
  CHECK_FALSE(listed.empty());
  CHECK(without_vjp == listed);
  for (int i = ir::kNumOps - static_cast<int>(without_vjp.size()); i < ir::kNumOps; ++i)
    CHECK(without_vjp.count(std::string(ir::op_name(static_cast<Op>(i)))));
  // Every sample belongs to an op that has a rule.
  for (const auto& [op, list] : table) {
    bool has_rule = ir::op_info(op).vjp != nullptr;
    CHECK_MESSAGE(has_rule, ir::op_name(op) << " has no VJP");
  }
  if (verbose) std::cout << fmt::format("{} samples, {} gradient elements checked\n", samples, elements);
  CHECK(samples > 100);
}
