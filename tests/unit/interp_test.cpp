// The reference interpreter: every op against hand-computed numbers, the
// backward-only ops against central differences of their forward ops, views,
// Native rounding (including a double-rounding tie), updates, seeded init and
// random inputs.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <map>
#include <numbers>
#include <stdexcept>
#include <string>

#include "interp/interpreter.h"
#include "interp/rounding.h"
#include "ir/builder.h"
#include "runtime/float_formats.h"
#include "runtime/rng.h"
#include "support/test_models.h"

using namespace napkin;
using interp::Interpreter;
using interp::Numerics;
using ir::DType;
using ir::Op;
using ir::ValueId;
using napkin::testing::compile;
using Vec = std::vector<double>;
using Ints = std::vector<int64_t>;

namespace {

ir::TensorType T(Ints sizes, DType dtype = DType::F32) {
  ir::TensorType t;
  t.dtype = dtype;
  for (int64_t s : sizes) t.dims.push_back({s, ""});
  return t;
}

struct Operand {
  ir::TensorType type;
  Vec data;
};

// Builds inputs -> one `op` node, runs it, returns the output.
// Output `output` of one node of op over `ins`.
Vec eval(Op op, std::vector<Operand> ins, ir::Attrs attrs = {}, Numerics numerics = Numerics::Float64, int output = 0) {
  ir::Graph g;
  ir::Builder b(g);
  std::vector<ValueId> ids;
  for (size_t i = 0; i < ins.size(); ++i) ids.push_back(g.add_input("in" + std::to_string(i), ins[i].type, {}));
  ir::Built out = b.add(op, ids, std::move(attrs));
  INFO(out.error);
  REQUIRE(out.ok());
  Interpreter it(g, numerics);
  for (size_t i = 0; i < ins.size(); ++i) it.set(ids[i], ins[i].data);
  it.run();
  return it.get(g.node(g.value(out.value).producer).out(output));
}

void check_near(const Vec& got, const Vec& want, double tol = 1e-12) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    CAPTURE(i);
    CAPTURE(got[i]);
    CAPTURE(want[i]);
    if (std::isnan(want[i]))
      CHECK(std::isnan(got[i]));
    else if (std::isinf(want[i]))
      CHECK(got[i] == want[i]);
    else
      CHECK(std::fabs(got[i] - want[i]) <= tol * std::max(1.0, std::fabs(want[i])));
  }
}

Vec iota(int n, double start = 0) {
  Vec v(n);
  for (int i = 0; i < n; ++i) v[i] = start + i;
  return v;
}

Vec randn(int n, uint64_t seed) {
  runtime::Rng r(seed, 0);
  Vec v(n);
  for (double& x : v) x = r.normal();
  return v;
}

ValueId named(const ir::Graph& g, const std::string& name) {
  for (ValueId v = g.num_values() - 1; v >= 0; --v)
    if (g.value(v).name == name) return v;
  FAIL("no value named " << name);
  return ir::kNoValue;
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "(no exception)";
}

// A forward graph ending in a scalar `loss` over inputs; the harness for the
// central differences below.
struct Net {
  ir::Graph g;
  ir::Builder b{g};
  std::map<ValueId, Vec> values;
  ValueId input(const std::string& name, Ints sizes, Vec data) {
    ValueId v = g.add_input(name, T(sizes), {});
    values[v] = std::move(data);
    return v;
  }
  ValueId add(Op op, std::vector<ValueId> ins, ir::Attrs attrs = {}) { return b.must(b.add(op, ins, std::move(attrs))); }
  // sum(y * w) over all axes: a scalar whose gradient w.r.t. y is w.
  ValueId weighted_sum(ValueId y, ValueId w) {
    Ints all;
    for (int i = 0; i < g.value(y).type.rank(); ++i) all.push_back(i);
    return add(Op::ReduceSum, {add(Op::Mul, {y, w})}, {{"axes", all}, {"keepdims", int64_t{0}}});
  }
  double eval(ValueId loss, const std::map<ValueId, Vec>& vals) {
    Interpreter it(g, Numerics::Float64);
    it.set(vals);
    it.run();
    return it.get(loss).at(0);
  }
  // d loss / d x by central differences, in double.
  Vec numeric_grad(ValueId loss, ValueId x, double h = 1e-5) {
    std::map<ValueId, Vec> vals = values;
    Vec grad;
    for (size_t i = 0; i < vals[x].size(); ++i) {
      double x0 = vals[x][i];
      vals[x][i] = x0 + h;
      double up = eval(loss, vals);
      vals[x][i] = x0 - h;
      double down = eval(loss, vals);
      vals[x][i] = x0;
      grad.push_back((up - down) / (2 * h));
    }
    return grad;
  }
};

}  // namespace

TEST_CASE("interp: sources and unary ops") {
  check_near(eval(Op::Constant, {}, {{"value", 2.5}, {"dtype", DType::F32}}), {2.5});
  check_near(eval(Op::Iota, {}, {{"n", int64_t{4}}, {"dtype", DType::I32}}), {0, 1, 2, 3});
  Operand x{T({4}), {-1, 0, 0.5, 2}};
  check_near(eval(Op::Neg, {x}), {1, 0, -0.5, -2});
  check_near(eval(Op::Abs, {x}), {1, 0, 0.5, 2});
  check_near(eval(Op::Relu, {x}), {0, 0, 0.5, 2});
  check_near(eval(Op::Exp, {{T({2}), {0, 1}}}), {1, 2.718281828459045});
  check_near(eval(Op::Log, {{T({2}), {1, 2}}}), {0, 0.6931471805599453});
  check_near(eval(Op::Sqrt, {{T({2}), {4, 2}}}), {2, 1.4142135623730951});
  check_near(eval(Op::Rsqrt, {{T({2}), {4, 2}}}), {0.5, 0.7071067811865475});
  check_near(eval(Op::Tanh, {{T({2}), {0, 0.5}}}), {0, 0.46211715726000974});
  check_near(eval(Op::Sigmoid, {{T({2}), {0, 1}}}), {0.5, 0.7310585786300049});
  check_near(eval(Op::Silu, {{T({2}), {0, 1}}}), {0, 0.7310585786300049});
  check_near(eval(Op::Sin, {{T({2}), {0, std::numbers::pi / 2}}}), {0, 1});
  check_near(eval(Op::Cos, {{T({2}), {0, std::numbers::pi}}}), {1, -1});
  check_near(eval(Op::Gelu, {{T({3}), {0, 1, -1}}}, {{"approximate", std::string("tanh")}}),
             {0, 0.8411919906082768, -0.15880800939172324});
  check_near(eval(Op::Gelu, {{T({3}), {0, 1, -1}}}, {{"approximate", std::string("none")}}),
             {0, 0.8413447460685429, -0.15865525393145707});
  // Integers stay integers.
  check_near(eval(Op::Neg, {{T({2}, DType::I32), {3, -4}}}), {-3, 4});
}

TEST_CASE("interp: cast truncates toward zero, to bool is != 0") {
  Operand x{T({5}), {-1.7, 2.5, -0.0, 3.9, 0.25}};
  check_near(eval(Op::Cast, {x}, {{"dtype", DType::I32}}), {-1, 2, 0, 3, 0});
  check_near(eval(Op::Cast, {x}, {{"dtype", DType::Bool}}), {1, 1, 0, 1, 1});
  check_near(eval(Op::Cast, {{T({3}, DType::Bool), {1, 0, 1}}}, {{"dtype", DType::F32}}), {1, 0, 1});
  check_near(eval(Op::Cast, {{T({2}, DType::I64), {-3, 7}}}, {{"dtype", DType::F64}}), {-3, 7});
  // Float64 keeps a float-to-float cast exact; Native rounds it.
  check_near(eval(Op::Cast, {{T({1}, DType::F64), {0.1}}}, {{"dtype", DType::F32}}), {0.1}, 0);
  check_near(eval(Op::Cast, {{T({1}, DType::F64), {0.1}}}, {{"dtype", DType::F32}}, Numerics::Native),
             {static_cast<double>(0.1f)}, 0);
}

TEST_CASE("interp: triu and causal_mask index the last two axes") {
  Operand m{T({3, 3}), iota(9, 1)};  // 1..9
  check_near(eval(Op::Triu, {m}, {{"k", int64_t{0}}}), {1, 2, 3, 0, 5, 6, 0, 0, 9});
  check_near(eval(Op::Triu, {m}, {{"k", int64_t{1}}}), {0, 2, 3, 0, 0, 6, 0, 0, 0});
  check_near(eval(Op::Triu, {m}, {{"k", int64_t{-1}}}), {1, 2, 3, 4, 5, 6, 0, 8, 9});
  // Batched, non-square: each [2, 3] matrix on its own.
  check_near(eval(Op::Triu, {{T({2, 2, 3}), iota(12, 1)}}, {{"k", int64_t{0}}}),
             {1, 2, 3, 0, 5, 6, 7, 8, 9, 0, 11, 12});
  const double inf = INFINITY;
  check_near(eval(Op::CausalMask, {{T({2, 3}), iota(6, 1)}}), {1, -inf, -inf, 4, 5, -inf});
}

TEST_CASE("interp: binary ops broadcast numpy-style") {
  // [2, 3] + [3]: the row repeats.
  check_near(eval(Op::Add, {{T({2, 3}), iota(6)}, {T({3}), {10, 20, 30}}}), {10, 21, 32, 13, 24, 35});
  // [2, 1] * [1, 3]: an outer product.
  check_near(eval(Op::Mul, {{T({2, 1}), {2, 3}}, {T({1, 3}), {1, 10, 100}}}), {2, 20, 200, 3, 30, 300});
  // [3] - [2, 1, 3] gives [2, 1, 3]; a scalar broadcasts everywhere.
  check_near(eval(Op::Sub, {{T({3}), {1, 2, 3}}, {T({2, 1, 3}), {1, 1, 1, 2, 2, 2}}}), {0, 1, 2, -1, 0, 1});
  check_near(eval(Op::Div, {{T({2}), {1, 3}}, {T({}), {4}}}), {0.25, 0.75});
  check_near(eval(Op::Pow, {{T({3}), {2, 9, 2}}, {T({3}), {3, 0.5, -1}}}), {8, 3, 0.5});
  check_near(eval(Op::Maximum, {{T({3}), {1, 5, -2}}, {T({3}), {3, 4, -2}}}), {3, 5, -2});
  check_near(eval(Op::Minimum, {{T({3}), {1, 5, -2}}, {T({}), {2}}}), {1, 2, -2});
  Operand a{T({3}), {1, 2, 3}}, b{T({3}), {2, 2, 2}};
  check_near(eval(Op::Less, {a, b}), {1, 0, 0});
  check_near(eval(Op::LessEqual, {a, b}), {1, 1, 0});
  check_near(eval(Op::Greater, {a, b}), {0, 0, 1});
  check_near(eval(Op::GreaterEqual, {a, b}), {0, 1, 1});
  check_near(eval(Op::Equal, {a, b}), {0, 1, 0});
  check_near(eval(Op::NotEqual, {a, b}), {1, 0, 1});
  // where(cond [2, 1], a [3], b []) -> [2, 3].
  check_near(eval(Op::Where, {{T({2, 1}, DType::Bool), {1, 0}}, {T({3}), {1, 2, 3}}, {T({}), {-1}}}),
             {1, 2, 3, -1, -1, -1});
  // Integer division truncates toward zero, like C++; dividing by zero is an error.
  Operand ia{T({4}, DType::I32), {-7, 7, 7, -7}}, ib{T({4}, DType::I32), {2, 2, -2, -2}};
  check_near(eval(Op::Div, {ia, ib}), {-3, 3, -3, 3});
  check_near(eval(Op::Div, {ia, ib}, {}, Numerics::Native), {-3, 3, -3, 3});
  std::string msg = message_of([] { eval(Op::Div, {{T({1}, DType::I32), {1}}, {T({1}, DType::I32), {0}}}); });
  CHECK(msg.find("div") != std::string::npos);
  CHECK(msg.find("by zero") != std::string::npos);
}

TEST_CASE("interp: reductions over sorted axes, with and without keepdims") {
  Operand x{T({2, 3, 4}), iota(24)};  // x[i][j][k] = 12i + 4j + k
  auto attrs = [](Ints axes, int64_t keep) { return ir::Attrs{{"axes", axes}, {"keepdims", keep}}; };
  // Over j: 3 * (12i + k) + 12.
  Vec sum_j = {12, 15, 18, 21, 48, 51, 54, 57};
  check_near(eval(Op::ReduceSum, {x}, attrs({1}, 0)), sum_j);
  check_near(eval(Op::ReduceSum, {x}, attrs({1}, 1)), sum_j);
  // Over i and k: the mean of 12i + 4j + k is 6 + 4j + 1.5.
  check_near(eval(Op::ReduceMean, {x}, attrs({0, 2}, 0)), {7.5, 11.5, 15.5});
  check_near(eval(Op::ReduceMax, {x}, attrs({2}, 0)), {3, 7, 11, 15, 19, 23});
  check_near(eval(Op::ReduceMin, {x}, attrs({0, 1}, 1)), {0, 1, 2, 3});
  check_near(eval(Op::ReduceSum, {x}, attrs({0, 1, 2}, 0)), {276});
  check_near(eval(Op::ReduceMax, {{T({3}), {1, NAN, 2}}}, attrs({0}, 0)), {NAN});
}

TEST_CASE("interp: matmul with broadcast batch axes") {
  // [[1,2,3],[4,5,6]] @ [[1,0],[0,1],[1,1]] = [[4,5],[10,11]].
  check_near(eval(Op::MatMul, {{T({2, 3}), iota(6, 1)}, {T({3, 2}), {1, 0, 0, 1, 1, 1}}}), {4, 5, 10, 11});
  // [2, 1, 2] @ [2, 1] : batch of two 1x2 rows against one 2x1 column.
  check_near(eval(Op::MatMul, {{T({2, 1, 2}), {1, 2, 3, 4}}, {T({2, 1}), {10, 1}}}), {12, 34});
  // [1, 2, 2] @ [3, 2, 1]: batch axes broadcast 1 against 3.
  check_near(eval(Op::MatMul, {{T({1, 2, 2}), {1, 2, 3, 4}}, {T({3, 2, 1}), {1, 0, 0, 1, 1, 1}}}),
             {1, 3, 2, 4, 3, 7});
}

TEST_CASE("interp: einsum sums the axes missing from the output") {
  auto attrs = [](Ints lhs, Ints rhs, Ints out, std::string names) {
    return ir::Attrs{{"lhs", lhs}, {"rhs", rhs}, {"out", out}, {"axis_names", names}, {"spec", std::string("test")}};
  };
  Operand a{T({2, 3}), iota(6, 1)}, b{T({3, 2}), {1, 0, 0, 1, 1, 1}};
  // i j, j k -> i k is a matmul; -> k i its transpose.
  check_near(eval(Op::Einsum, {a, b}, attrs({0, 1}, {1, 2}, {0, 2}, "i j k")), {4, 5, 10, 11});
  check_near(eval(Op::Einsum, {a, b}, attrs({0, 1}, {1, 2}, {2, 0}, "i j k")), {4, 10, 5, 11});
  // i j, i j -> : the full contraction, sum of squares 1..6 = 91.
  check_near(eval(Op::Einsum, {a, a}, attrs({0, 1}, {0, 1}, {}, "i j")), {91});
  // b i d, b j d -> b i j (attention scores) against a hand loop.
  Vec q = randn(2 * 2 * 3, 1), k = randn(2 * 4 * 3, 2), want;
  for (int bb = 0; bb < 2; ++bb)
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 4; ++j) {
        double s = 0;
        for (int d = 0; d < 3; ++d) s += q[(bb * 2 + i) * 3 + d] * k[(bb * 4 + j) * 3 + d];
        want.push_back(s);
      }
  check_near(eval(Op::Einsum, {{T({2, 2, 3}), q}, {T({2, 4, 3}), k}}, attrs({0, 1, 3}, {0, 2, 3}, {0, 1, 2}, "b i j d")),
             want);
  // An axis kept from one side only (outer product): i, j -> i j.
  check_near(eval(Op::Einsum, {{T({2}), {1, 2}}, {T({3}), {1, 10, 100}}}, attrs({0}, {1}, {0, 1}, "i j")),
             {1, 10, 100, 2, 20, 200});
}

TEST_CASE("interp: views follow their logical index maps (permute + reshape order)") {
  ir::Graph g = compile(R"yaml(
model: views
dims: {b: 2, s: 3, d: 4}
inputs: {x: {shape: [b, s, d]}}
forward:
  - y: rearrange(x, "b s d -> b (d s)")
  - z: rearrange(x, "b s (h e) -> b h s e", h=2)
  - w: x[1, 1:3]
  - t: transpose(x, 0, 2)
loss: sum(y) + sum(z) + sum(w) + sum(t)
optimizer: sgd(lr=0.1)
)yaml");
  // The merge after the permute needs a copy: the view chain is not trivial.
  bool has_copy = false;
  for (ir::NodeId n : g.schedule()) has_copy = has_copy || g.node(n).op == Op::Copy;
  CHECK(has_copy);
  Interpreter it(g, Numerics::Float64);
  it.set(named(g, "x"), iota(24));  // x[b][s][d] = 12b + 4s + d
  it.run();
  Vec y, z, w, t;
  for (int b = 0; b < 2; ++b)
    for (int d = 0; d < 4; ++d)
      for (int s = 0; s < 3; ++s) y.push_back(12 * b + 4 * s + d);
  for (int b = 0; b < 2; ++b)
    for (int h = 0; h < 2; ++h)
      for (int s = 0; s < 3; ++s)
        for (int e = 0; e < 2; ++e) z.push_back(12 * b + 4 * s + 2 * h + e);
  for (int s = 1; s < 3; ++s)
    for (int d = 0; d < 4; ++d) w.push_back(12 + 4 * s + d);
  for (int d = 0; d < 4; ++d)
    for (int s = 0; s < 3; ++s)
      for (int b = 0; b < 2; ++b) t.push_back(12 * b + 4 * s + d);
  check_near(it.get(named(g, "y")), y);
  check_near(it.get(named(g, "z")), z);
  check_near(it.get(named(g, "w")), w);
  check_near(it.get(named(g, "t")), t);
  // y, z and t are rearrangements of x: the loss is 3 sum(x) + sum(w).
  double sum_w = 0;
  for (double v : w) sum_w += v;
  check_near(it.get(g.find_output("loss")), {3 * 276 + sum_w});
}

TEST_CASE("interp: broadcast, slice, select, copy, concat, pad") {
  Operand x{T({3, 1}), {1, 2, 3}};
  check_near(eval(Op::Broadcast, {x}, {{"shape", Ints{2, 3, 2}}}), {1, 1, 2, 2, 3, 3, 1, 1, 2, 2, 3, 3});
  Operand m{T({2, 3}), iota(6)};
  check_near(eval(Op::Slice, {m}, {{"axis", int64_t{1}}, {"start", int64_t{1}}, {"stop", int64_t{3}}}), {1, 2, 4, 5});
  check_near(eval(Op::Select, {m}, {{"axis", int64_t{1}}, {"index", int64_t{2}}}), {2, 5});
  check_near(eval(Op::Select, {m}, {{"axis", int64_t{0}}, {"index", int64_t{1}}}), {3, 4, 5});
  check_near(eval(Op::Copy, {m}), iota(6));
  check_near(eval(Op::Reshape, {m}, {{"shape", Ints{3, 2}}}), iota(6));
  check_near(eval(Op::Permute, {m}, {{"perm", Ints{1, 0}}}), {0, 3, 1, 4, 2, 5});
  check_near(eval(Op::Concat, {{T({2, 1}), {10, 20}}, m, {T({2, 1}), {-1, -2}}}, {{"axis", int64_t{1}}}),
             {10, 0, 1, 2, -1, 20, 3, 4, 5, -2});
  check_near(eval(Op::Concat, {m, {T({1, 3}), {7, 8, 9}}}, {{"axis", int64_t{0}}}), {0, 1, 2, 3, 4, 5, 7, 8, 9});
  check_near(eval(Op::Pad, {m}, {{"axis", int64_t{1}}, {"before", int64_t{1}}, {"after", int64_t{2}}}),
             {0, 0, 1, 2, 0, 0, 0, 3, 4, 5, 0, 0});
}

TEST_CASE("interp: embedding gathers rows and rejects ids outside the table") {
  Operand table{T({4, 2}), {0, 1, 10, 11, 20, 21, 30, 31}};
  check_near(eval(Op::Embedding, {table, {T({3}, DType::I32), {3, 0, 3}}}), {30, 31, 0, 1, 30, 31});
  check_near(eval(Op::Embedding, {table, {T({2, 1}, DType::I64), {2, 1}}}), {20, 21, 10, 11});
  std::string msg = message_of([&] { eval(Op::Embedding, {table, {T({2}, DType::I32), {1, 4}}}); });
  CHECK(msg.find("embedding") != std::string::npos);
  CHECK(msg.find("id 4") != std::string::npos);
  CHECK(message_of([&] { eval(Op::Embedding, {table, {T({1}, DType::I32), {-1}}}); }).find("id -1") != std::string::npos);
}

TEST_CASE("interp: top_k picks each row's k largest, descending, ties to the lower index, a NaN first") {
  const ir::Attrs k3{{"k", int64_t{3}}};
  const Operand x{T({3, 5}), {1, 3, 3, -2, 5, /**/ 0, 0, 0, 0, 0, /**/ -1, -4, -3, -2, -5}};
  check_near(eval(Op::TopK, {x}, k3), {5, 3, 3, /**/ 0, 0, 0, /**/ -1, -2, -3});
  check_near(eval(Op::TopK, {x}, k3, Numerics::Float64, 1), {4, 1, 2, /**/ 0, 1, 2, /**/ 0, 3, 2});
  const Operand nan{T({3}), {1, std::nan(""), 2}};
  check_near(eval(Op::TopK, {nan}, {{"k", int64_t{2}}}), {std::nan(""), 2});
  check_near(eval(Op::TopK, {nan}, {{"k", int64_t{2}}}, Numerics::Float64, 1), {1, 2});
}

// Slots fill choice-major: every token's first choice before any token's
// second, each in token order; past an expert's capacity an assignment drops.
TEST_CASE("interp: moe_slots places choices choice-major and drops past capacity (worked by hand)") {
  auto slots = [](Ints shape, Vec indices, int64_t experts, int64_t capacity, int output) {
    return eval(Op::MoeSlots, {{T(shape, DType::I32), std::move(indices)}},
                {{"experts", experts}, {"capacity", capacity}}, Numerics::Float64, output);
  };
  // T = 4, k = 2, E = 2, C = 2: tokens 0..2 choose (0, 1), token 3 (1, 0).
  // First choices: t0 -> e0 slot 0, t1 -> e0 slot 1, t2 -> e0 full: dropped,
  // t3 -> e1 slot 0. Second: t0 -> e1 slot 1, then e1 and e0 are full.
  // Token order would have let t0 and t1 fill both experts and dropped both
  // of t3's choices; choice-major keeps t3's first choice over t1's second.
  const Vec two{0, 1, 0, 1, 0, 1, 1, 0};
  check_near(slots({4, 2}, two, 2, 2, 0), {0, 3, 1, -1, -1, -1, 2, -1});  // pos: e * C + slot
  check_near(slots({4, 2}, two, 2, 2, 1), {0, 1, 3, 0});                   // src: e0 <- t0, t1; e1 <- t3, t0
  check_near(slots({4, 2}, two, 2, 2, 2), {4, 4});                         // counts before capacity
  // E = 3, C = 2: t0 (2, 0), t1 (2, 1), t2 (2, 0), t3 (0, 2). First choices:
  // t0 -> e2 s0, t1 -> e2 s1, t2 dropped, t3 -> e0 s0; second: t0 -> e0 s1,
  // t1 -> e1 s0, t2 -> e0 full, t3 -> e2 full. e1's slot 1 stays empty (0).
  const Vec three{2, 0, 2, 1, 2, 0, 0, 2};
  check_near(slots({4, 2}, three, 3, 2, 0), {4, 1, 5, 2, -1, -1, 0, -1});
  check_near(slots({4, 2}, three, 3, 2, 1), {3, 0, 1, 0, 0, 1});
  check_near(slots({4, 2}, three, 3, 2, 2), {3, 1, 4});
  // Capacity T (a capacity factor of E / k) drops nothing.
  check_near(slots({4, 2}, three, 3, 4, 0), {8, 1, 9, 4, 10, 2, 0, 11});
  // An index outside [0, E) is the data's error, named.
  const std::string msg = message_of([&] { slots({2, 1}, {1, 3}, 3, 2, 0); });
  CHECK(msg.find("moe_slots") != std::string::npos);
  CHECK(msg.find("expert index 3 is out of range [0, 3)") != std::string::npos);
  CHECK(message_of([&] { slots({1, 1}, {-1}, 3, 2, 0); }).find("expert index -1") != std::string::npos);
}

TEST_CASE("interp: softmax, log_softmax, layernorm, rmsnorm, cross_entropy, mse") {
  check_near(eval(Op::Softmax, {{T({3}), {1, 2, 3}}}, {{"axis", int64_t{0}}}),
             {0.09003057317038046, 0.24472847105479767, 0.6652409557748219});
  // Stable: a huge shift changes nothing.
  check_near(eval(Op::Softmax, {{T({3}), {1001, 1002, 1003}}}, {{"axis", int64_t{0}}}),
             {0.09003057317038046, 0.24472847105479767, 0.6652409557748219});
  // Along axis 0 of a [2, 2]: columns normalize.
  double p = 1 / (1 + std::exp(-2.0));
  check_near(eval(Op::Softmax, {{T({2, 2}), {0, 5, 2, 5}}}, {{"axis", int64_t{0}}}), {1 - p, 0.5, p, 0.5});
  check_near(eval(Op::LogSoftmax, {{T({3}), {1, 2, 3}}}, {{"axis", int64_t{0}}}),
             {1 - 3.40760596444438, 2 - 3.40760596444438, 3 - 3.40760596444438});
  // layernorm([1,2,3,4]): mean 2.5, biased variance 1.25.
  check_near(eval(Op::LayerNorm, {{T({4}), {1, 2, 3, 4}}, {T({4}), {1, 2, 1, 1}}, {T({4}), {0, 0, 1, 0}}},
                  {{"eps", 1e-5}}),
             {-1.3416354199689269, -0.894423613312618, 1.447211806656309, 1.3416354199689269});
  // rmsnorm([1,2,3,4]): mean square 7.5.
  check_near(eval(Op::RMSNorm, {{T({4}), {1, 2, 3, 4}}, {T({4}), {1, 2, 1, 1}}}, {{"eps", 1e-6}}),
             {0.3651483473268884, 1.4605933893075536, 1.0954450419806652, 1.4605933893075536});
  // Two rows: -log softmax([1,2,3])[2] and -log(1/3); the mean.
  check_near(eval(Op::CrossEntropy, {{T({2, 3}), {1, 2, 3, 1, 1, 1}}, {T({2}, DType::I32), {2, 0}}}),
             {0.753109126556245});
  check_near(eval(Op::MSE, {{T({2}), {1, 2}}, {T({2}), {3, 5}}}), {6.5});
  std::string msg = message_of([] { eval(Op::CrossEntropy, {{T({1, 3}), {1, 2, 3}}, {T({1}, DType::I32), {3}}}); });
  CHECK(msg.find("cross_entropy") != std::string::npos);
  CHECK(msg.find("3") != std::string::npos);
}

TEST_CASE("interp: softmax_grad matches central differences of sum(softmax(x) * w)") {
  for (int64_t axis : {0, 1}) {
    CAPTURE(axis);
    Net n;
    ValueId x = n.input("x", {3, 4}, randn(12, 10));
    ValueId w = n.input("w", {3, 4}, randn(12, 11));
    ValueId y = n.add(Op::Softmax, {x}, {{"axis", axis}});
    ValueId loss = n.weighted_sum(y, w);
    Interpreter it(n.g, Numerics::Float64);
    it.set(n.values);
    it.run();
    Vec dx = eval(Op::SoftmaxGrad, {{T({3, 4}), it.get(y)}, {T({3, 4}), n.values[w]}}, {{"axis", axis}});
    check_near(dx, n.numeric_grad(loss, x), 1e-8);
  }
}

TEST_CASE("interp: layernorm_grad and rmsnorm_grad, their gain's and bias's gradients too, match central differences") {
  const double eps = 1e-5;
  Net n;
  ValueId x = n.input("x", {3, 5}, randn(15, 20));
  ValueId g = n.input("g", {5}, randn(5, 21));
  ValueId b = n.input("b", {5}, randn(5, 22));
  ValueId w = n.input("w", {3, 5}, randn(15, 23));
  ValueId ln = n.weighted_sum(n.add(Op::LayerNorm, {x, g, b}, {{"eps", eps}}), w);
  ValueId rms = n.weighted_sum(n.add(Op::RMSNorm, {x, g}, {{"eps", eps}}), w);
  Operand ox{T({3, 5}), n.values[x]}, og{T({5}), n.values[g]}, ow{T({3, 5}), n.values[w]};

  check_near(eval(Op::LayerNormGrad, {ox, og, ow}, {{"eps", eps}}), n.numeric_grad(ln, x), 1e-8);
  check_near(eval(Op::RMSNormGrad, {ox, og, ow}, {{"eps", eps}}), n.numeric_grad(rms, x), 1e-8);
  const ir::Attrs gains{{"eps", eps}, {"gains", int64_t{1}}};
  const Numerics f64 = Numerics::Float64;
  check_near(eval(Op::LayerNormGrad, {ox, og, ow}, gains, f64, 0), n.numeric_grad(ln, x), 1e-8);
  check_near(eval(Op::LayerNormGrad, {ox, og, ow}, gains, f64, 1), n.numeric_grad(ln, g), 1e-8);
  check_near(eval(Op::LayerNormGrad, {ox, og, ow}, gains, f64, 2), n.numeric_grad(ln, b), 1e-8);
  check_near(eval(Op::RMSNormGrad, {ox, og, ow}, gains, f64, 0), n.numeric_grad(rms, x), 1e-8);
  check_near(eval(Op::RMSNormGrad, {ox, og, ow}, gains, f64, 1), n.numeric_grad(rms, g), 1e-8);
}

TEST_CASE("interp: gelu_grad matches central differences for both forms") {
  for (std::string form : {"tanh", "none"}) {
    CAPTURE(form);
    Net n;
    Vec xs = randn(8, 30);
    xs.push_back(0);
    xs.push_back(-3.5);
    ValueId x = n.input("x", {10}, xs);
    ValueId w = n.input("w", {10}, randn(10, 31));
    ValueId loss = n.weighted_sum(n.add(Op::Gelu, {x}, {{"approximate", form}}), w);
    Vec dx = eval(Op::GeluGrad, {{T({10}), xs}, {T({10}), n.values[w]}}, {{"approximate", form}});
    check_near(dx, n.numeric_grad(loss, x), 1e-8);
  }
}

TEST_CASE("interp: cross_entropy_grad matches central differences of dloss * cross_entropy") {
  Net n;
  ValueId logits = n.input("logits", {2, 3, 4}, randn(24, 40));
  ValueId targets = n.g.add_input("targets", T({2, 3}, DType::I32), {});
  n.values[targets] = {0, 3, 1, 2, 2, 0};
  ValueId dloss = n.input("dloss", {}, {0.7});
  ValueId loss = n.add(Op::Mul, {n.add(Op::CrossEntropy, {logits, targets}), dloss});
  Vec dx = eval(Op::CrossEntropyGrad,
                {{T({2, 3, 4}), n.values[logits]}, {T({2, 3}, DType::I32), n.values[targets]}, {T({}), {0.7}}});
  check_near(dx, n.numeric_grad(loss, logits), 1e-8);
}

TEST_CASE("interp: embedding_grad matches central differences, repeated ids accumulate") {
  Net n;
  ValueId table = n.input("table", {5, 3}, randn(15, 50));
  ValueId ids = n.g.add_input("ids", T({2, 2}, DType::I32), {});
  n.values[ids] = {4, 1, 4, 0};  // row 4 twice, rows 2 and 3 never
  ValueId w = n.input("w", {2, 2, 3}, randn(12, 51));
  ValueId loss = n.weighted_sum(n.add(Op::Embedding, {table, ids}), w);
  Vec dt = eval(Op::EmbeddingGrad, {{T({2, 2, 3}), n.values[w]}, {T({2, 2}, DType::I32), n.values[ids]}},
                {{"vocab", int64_t{5}}});
  check_near(dt, n.numeric_grad(loss, table), 1e-8);
  const Vec& wv = n.values[w];
  // By hand: row 4 = w[0][0] + w[1][0]; row 2 = 0.
  check_near({dt[12], dt[6]}, {wv[0] + wv[6], 0});
}

TEST_CASE("interp: Native rounds each op's result once to its dtype") {
  // f32: 1 + 1.5 * 2^-24 is 0.75 ulp above 1: rounds to 1 + 2^-23. Float64 keeps it.
  Operand one{T({1}), {1.0}}, small{T({1}), {0x1.8p-24}};
  check_near(eval(Op::Add, {one, small}, {}, Numerics::Native), {1 + 0x1p-23}, 0);
  check_near(eval(Op::Add, {one, small}, {}, Numerics::Float64), {1 + 0x1.8p-24}, 0);
  // bf16: 1/3 is 0.333984375 (8 significant bits).
  Operand third{T({1}, DType::F64), {1.0 / 3}};
  check_near(eval(Op::Cast, {third}, {{"dtype", DType::BF16}}, Numerics::Native), {0.333984375}, 0);
  check_near(eval(Op::Cast, {third}, {{"dtype", DType::BF16}}, Numerics::Float64), {1.0 / 3}, 0);
  // bf16 * bf16: (1 + 2^-7)^2 = 1 + 2^-6 + 2^-14 rounds to 1 + 2^-6.
  Operand b{T({1}, DType::BF16), {1 + 0x1p-7}};
  check_near(eval(Op::Mul, {b, b}, {}, Numerics::Native), {1 + 0x1p-6}, 0);
  check_near(eval(Op::Mul, {b, b}, {}, Numerics::Float64), {1 + 0x1p-6 + 0x1p-14}, 0);
  // set() rounds inputs in Native: 0.1 as an f32 input is the float 0.1f.
  check_near(eval(Op::Neg, {{T({1}), {0.1}}}, {}, Numerics::Native), {-static_cast<double>(0.1f)}, 0);
  // An e4m3 value past 448 overflows to NaN (the format has no infinity).
  check_near(eval(Op::Mul, {{T({1}, DType::F8E4M3), {448}}, {T({1}, DType::F8E4M3), {2}}}, {}, Numerics::Native), {NAN});
}

TEST_CASE("interp: narrow formats round once from double, not via float (the double-rounding tie)") {
  // 1 + 2^-8 + 2^-30 is just above the bf16 tie between 1 and 1 + 2^-7, so it
  // rounds up. Through float first it loses the 2^-30, lands on the tie, and
  // ties-to-even picks 1: double rounding gets it wrong.
  const double x = 1 + 0x1p-8 + 0x1p-30;
  CHECK(runtime::round_to_bf16(static_cast<float>(x)) == 1.0f);  // the wrong answer
  CHECK(interp::round_to_dtype(x, DType::BF16) == 1 + 0x1p-7);
  check_near(eval(Op::Cast, {{T({1}, DType::F64), {x}}}, {{"dtype", DType::BF16}}, Numerics::Native), {1 + 0x1p-7}, 0);
  // Just below the tie it rounds down; exactly at it, to even.
  CHECK(interp::round_to_dtype(1 + 0x1p-8 - 0x1p-30, DType::BF16) == 1.0);
  CHECK(interp::round_to_dtype(1 + 0x1p-8, DType::BF16) == 1.0);
  CHECK(interp::round_to_dtype(1 + 0x1p-8 + 0x1p-7, DType::BF16) == 1 + 0x1p-6);  // tie, odd below: up
  // The same trap in f16 and e4m3.
  CHECK(runtime::round_to_f16(static_cast<float>(1 + 0x1p-11 + 0x1p-40)) == 1.0f);
  CHECK(interp::round_to_dtype(1 + 0x1p-11 + 0x1p-40, DType::F16) == 1 + 0x1p-10);
  CHECK(interp::round_to_dtype(1 + 0x1p-4 + 0x1p-30, DType::F8E4M3) == 1.125);
  CHECK(interp::round_to_dtype(-(1 + 0x1p-3 + 0x1p-30), DType::F8E5M2) == -1.25);
  // Tiny and huge values: signs kept, overflow as the formats define it.
  CHECK(interp::round_to_dtype(1e-300, DType::BF16) == 0.0);
  CHECK(std::signbit(interp::round_to_dtype(-1e-300, DType::BF16)));
  CHECK(interp::round_to_dtype(1e300, DType::BF16) == INFINITY);
  CHECK(interp::round_to_dtype(-1e300, DType::F32) == -INFINITY);
  CHECK(interp::round_to_dtype(0x1p128 - 0x1p104, DType::F32) == 0x1p128 - 0x1p104);  // FLT_MAX
  CHECK(std::isnan(interp::round_to_dtype(1e300, DType::F8E4M3)));
  CHECK(std::isnan(interp::round_to_dtype(NAN, DType::F16)));
  CHECK(interp::round_to_dtype(-2.9, DType::I32) == -2);
  CHECK(interp::round_to_dtype(0.2, DType::Bool) == 1);
}

TEST_CASE("interp: round_to_dtype is the nearest representable value (ties to even) on random doubles") {
  struct Format {
    DType dtype;
    uint32_t (*to_bits)(float);
    float (*from_bits)(uint32_t);
    double lo, hi;
  };
  const Format formats[] = {
      {DType::BF16, [](float f) -> uint32_t { return runtime::float_to_bf16_bits(f); },
       [](uint32_t b) { return runtime::bf16_bits_to_float(static_cast<uint16_t>(b)); }, 1e-30, 1e30},
      {DType::F16, [](float f) -> uint32_t { return runtime::float_to_f16_bits(f); },
       [](uint32_t b) { return runtime::f16_bits_to_float(static_cast<uint16_t>(b)); }, 1e-4, 6e4},
      {DType::F8E4M3, [](float f) -> uint32_t { return runtime::float_to_f8e4m3_bits(f); },
       [](uint32_t b) { return runtime::f8e4m3_bits_to_float(static_cast<uint8_t>(b)); }, 0.02, 440},
      {DType::F8E5M2, [](float f) -> uint32_t { return runtime::float_to_f8e5m2_bits(f); },
       [](uint32_t b) { return runtime::f8e5m2_bits_to_float(static_cast<uint8_t>(b)); }, 1e-4, 5e4},
  };
  runtime::Rng rng(123, 0);
  for (const Format& f : formats) {
    CAPTURE(ir::dtype_name(f.dtype));
    for (int i = 0; i < 20000; ++i) {
      // Log-uniform positives; every other one pushed next to a tie.
      double x = f.lo * std::pow(f.hi / f.lo, rng.uniform01());
      uint32_t bits = f.to_bits(static_cast<float>(x));
      if (i % 2) {
        double a = f.from_bits(bits), b = f.from_bits(bits + 1);
        if (!std::isfinite(b)) continue;
        double mid = (a + b) / 2;
        int which = i % 6;
        x = which == 1 ? mid : which == 3 ? mid * (1 + 0x1p-40) : mid * (1 - 0x1p-40);
        bits = f.to_bits(static_cast<float>(x));
      }
      double r = interp::round_to_dtype(x, f.dtype);
      CAPTURE(x);
      CAPTURE(r);
      // Among the representable values around x, r is the nearest; ties go to the even code.
      double best = NAN;
      for (uint32_t c = bits - 1; c <= bits + 1; ++c) {
        double v = f.from_bits(c);
        double dv = std::fabs(v - x), db = std::fabs(best - x);
        if (std::isnan(best) || dv < db || (dv == db && c % 2 == 0)) {
          best = v;
        }
      }
      REQUIRE(r == best);
    }
  }
}

TEST_CASE("interp: round_other_way is the enclosing value that rounding to nearest did not pick") {
  runtime::Rng rng(321, 0);
  for (DType t : {DType::F32, DType::BF16, DType::F16, DType::F8E4M3, DType::F8E5M2}) {
    CAPTURE(ir::dtype_name(t));
    const ir::FloatInfo info = ir::float_info(t);
    for (int i = 0; i < 20000; ++i) {
      // Log-uniform over the normal range (up to half the largest value), either sign.
      double x = info.smallest_normal * std::pow(info.max / 2 / info.smallest_normal, rng.uniform01());
      if (i % 2) x = -x;
      double nearest = interp::round_to_dtype(x, t);
      double other = interp::round_other_way(x, nearest, t);
      CAPTURE(x);
      CAPTURE(nearest);
      CAPTURE(other);
      if (nearest == x) {
        CHECK(other == x);
        continue;
      }
      REQUIRE(other != nearest);
      CHECK(interp::round_to_dtype(other, t) == other);  // a value of t
      CHECK(std::min(nearest, other) < x);               // enclosing x
      CHECK(std::max(nearest, other) > x);
      CHECK(std::fabs(other - x) >= std::fabs(nearest - x));  // and no nearer
      // Adjacent: nothing of t between them (their midpoint rounds to one of them).
      double mid = interp::round_to_dtype((nearest + other) / 2, t);
      CHECK((mid == nearest || mid == other));
      CHECK(std::fabs(other - nearest) <= 2 * info.eps * std::fabs(x));
    }
  }
  // Outside the normal range there is no other way: subnormals, past the largest value.
  CHECK(interp::round_other_way(1e-41, interp::round_to_dtype(1e-41, DType::F32), DType::F32) ==
        interp::round_to_dtype(1e-41, DType::F32));
  CHECK(interp::round_other_way(1e-6, interp::round_to_dtype(1e-6, DType::F16), DType::F16) ==
        interp::round_to_dtype(1e-6, DType::F16));
  CHECK(interp::round_other_way(65504.5, 65504, DType::F16) == 65504);
  // Across a binade's edge: just below 1 in bf16 the neighbours are 1 - 2^-8 and 1.
  CHECK(interp::round_other_way(1 - 0x1p-10, 1.0, DType::BF16) == 1 - 0x1p-8);
}

TEST_CASE("interp: rounding noise rounds inexact values either way and leaves exact ops exact") {
  // y = cast(x, bf16); m = reduce_max(y); d = y * 2; e = cast(x2, bf16) of bf16 values.
  ir::Graph g;
  ir::Builder b(g);
  ValueId x = g.add_input("x", T({64}, DType::F64), {});
  ValueId x2 = g.add_input("x2", T({4}, DType::F64), {});
  ValueId y = b.must(b.add(Op::Cast, {x}, {{"dtype", DType::BF16}}));
  ValueId m = b.must(b.add(Op::ReduceMax, {y}, {{"axes", Ints{0}}, {"keepdims", int64_t{0}}}));
  ValueId two = b.must(b.constant(2, DType::BF16));
  ValueId d = b.must(b.add(Op::Mul, {y, two}));
  ValueId e = b.must(b.add(Op::Cast, {x2}, {{"dtype", DType::BF16}}));
  const Vec xs = randn(64, 5), exact = {1, 0.5, -1.5, 3};
  Interpreter plain(g, Numerics::Native), noisy(g, Numerics::Native);
  plain.set({{x, xs}, {x2, exact}});
  plain.run();
  int other_way = 0;
  for (uint64_t run = 0; run < 4; ++run) {
    noisy.perturb_roundings(9, run);
    noisy.set({{x, xs}, {x2, exact}});
    noisy.run();
    for (size_t i = 0; i < xs.size(); ++i) {
      double got = noisy.get(y)[i], nearest = plain.get(y)[i];
      CHECK((got == nearest || got == interp::round_other_way(xs[i], nearest, DType::BF16)));
      other_way += got != nearest;
      CHECK(noisy.get(d)[i] == 2 * got);  // exact: not rounded again
    }
    double max = -INFINITY;
    for (double v : noisy.get(y)) max = std::max(max, v);
    CHECK(noisy.get(m)[0] == max);
    check_near(noisy.get(e), exact, 0);  // bf16 values cast to bf16: nothing rounded, nothing moved
  }
  CHECK(other_way > 64);  // about half of 4 · 64
  CHECK(other_way < 3 * 64);
  // Float64's noise moves computed values by at most an ulp, never what was set.
  Interpreter f64(g, Numerics::Float64), f64_plain(g, Numerics::Float64);
  f64_plain.set({{x, xs}, {x2, exact}});
  f64_plain.run();
  f64.perturb_roundings(1, 0);
  f64.set({{x, xs}, {x2, exact}});
  f64.run();
  check_near(f64.get(x), xs, 0);
  int moved = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    double got = f64.get(d)[i], nearest = 2 * f64.get(y)[i];  // y's own noise is already in y
    CHECK((got == nearest || got == std::nextafter(nearest, INFINITY) || got == std::nextafter(nearest, -INFINITY)));
    moved += got != nearest;
  }
  CHECK(moved > 8);  // about half of 64
  CHECK(moved < 56);
}

TEST_CASE("interp: apply_updates writes each target, and the next run sees it") {
  ir::Graph g;
  ir::Builder b(g);
  ir::InitSpec ones;
  ones.kind = ir::InitSpec::Kind::Ones;
  ValueId w = g.add_param("w", T({2}), ones, {});
  ValueId m = g.add_state("m", T({2}), {});
  ValueId x = g.add_input("x", T({2}), {});
  // m' = 0.5 m + x; w' = w - m'
  ValueId half = b.must(b.constant(0.5, DType::F32));
  ValueId m2 = b.must(b.add(Op::Add, {b.must(b.add(Op::Mul, {half, m})), x}));
  ValueId w2 = b.must(b.add(Op::Sub, {w, m2}));
  g.updates = {{w, w2}, {m, m2}};

  Interpreter it(g, Numerics::Float64);
  CHECK_THROWS_AS(it.run(), std::runtime_error);  // nothing set yet
  it.set(interp::initial_values(g, 0));
  CHECK_THROWS_AS(it.run(), std::runtime_error);  // x still missing
  it.set(x, {1, 2});
  it.run();
  check_near(it.get(w2), {0, -1});
  it.apply_updates();
  check_near(it.get(w), {0, -1});
  check_near(it.get(m), {1, 2});
  it.run();
  check_near(it.get(m2), {1.5, 3});
  check_near(it.get(w2), {-1.5, -4});
  // Only inputs, params and state can be set, each with its element count.
  CHECK_THROWS_AS(it.set(w2, {0, 0}), std::invalid_argument);
  CHECK_THROWS_AS(it.set(x, {1, 2, 3}), std::invalid_argument);
  Interpreter fresh(g, Numerics::Float64);
  CHECK_THROWS_AS(fresh.get(w2), std::out_of_range);
}

namespace {
const char* kInitModel = R"yaml(
model: init
dims: {d: 8, h: 16}
inputs: {x: {shape: [4, d]}}
params:
  w1: {shape: [d, h], init: xavier}
  w2: {shape: [h, h], init: xavier}
  e: {shape: [h, h], init: normal(0.02)}
  t: {shape: [h, h], init: "trunc_normal(0.5, a=-0.3, b=0.2)"}
  c: {shape: [h], init: constant(0.7)}
  o: {shape: [h], init: ones}
  z: {shape: [h], init: zeros}
forward:
  - y: (x @ w1 @ w2 @ e @ t) * c * o + z
loss: mean(y)
optimizer: sgd(lr=0.1)
)yaml";
}

TEST_CASE("interp: initial_values is seeded per (seed, parameter name)") {
  ir::Graph g = compile(kInitModel);
  auto v0 = interp::initial_values(g, 0);
  auto again = interp::initial_values(g, 0);
  auto v1 = interp::initial_values(g, 1);
  ValueId w1 = named(g, "w1"), w2 = named(g, "w2"), e = named(g, "e"), t = named(g, "t");
  CHECK(v0 == again);
  CHECK(v0[w1] != v1[w1]);
  CHECK(Vec(v0[w1].begin(), v0[w1].begin() + 8) != Vec(v0[w2].begin(), v0[w2].begin() + 8));  // same shape, other name

  // xavier: std 1/sqrt(fan_in = 8), cut at +-3 std.
  const ir::Param* p = g.find_param(w1);
  REQUIRE(p);
  CHECK(p->init.std == doctest::Approx(1 / std::sqrt(8.0)));
  double lo = p->init.lo, hi = p->init.hi, sum2 = 0;
  CHECK(hi == doctest::Approx(3 / std::sqrt(8.0)));
  for (double x : v0[w1]) {
    CHECK(x >= lo);
    CHECK(x <= hi);
    sum2 += x * x;
  }
  CHECK(std::sqrt(sum2 / 128) == doctest::Approx(1 / std::sqrt(8.0)).epsilon(0.2));
  for (double x : v0[t]) {
    CHECK(x >= -0.3);
    CHECK(x <= 0.2);
  }
  // normal(0.02): exactly 0.02 * the stream's normals, in row-major order.
  runtime::Rng rng(0, runtime::stream_for_name("e"));
  for (int i = 0; i < 4; ++i) CHECK(v0[e][i] == 0.02 * rng.normal());
  check_near(v0[named(g, "c")], Vec(16, 0.7), 0);
  check_near(v0[named(g, "o")], Vec(16, 1.0), 0);
  check_near(v0[named(g, "z")], Vec(16, 0.0), 0);
  CHECK(v0.count(named(g, "x")) == 0);  // inputs are not parameters

  // A new parameter does not move the others.
  std::string more = kInitModel;
  more.replace(more.find("params:\n"), 8, "params:\n  a0: {shape: [h], init: normal(1)}\n");
  more.replace(more.find("+ z"), 3, "+ z + a0");
  ir::Graph g2 = compile(more);
  auto u0 = interp::initial_values(g2, 0);
  CHECK(u0[named(g2, "w1")] == v0[w1]);
  CHECK(u0[named(g2, "t")] == v0[t]);
}

TEST_CASE("interp: random_inputs bound integer ids by their uses, through views") {
  ir::Graph g = compile(R"yaml(
model: ids
dims: {b: 4, s: 8, d: 3, vocab: 7, classes: 5}
inputs:
  tokens: {shape: [b, s], dtype: i32}
  targets: {shape: [b, s], dtype: i32}
  both: {shape: [b, s], dtype: i64}
  flags: {shape: [b, s], dtype: i32}
  x: {shape: [b, s, d]}
params:
  wte: {shape: [vocab, d], init: normal(0.02)}
  wout: {shape: [d, classes], init: xavier}
forward:
  - tok: transpose(tokens)
  - h: transpose(embedding(wte, tok), 0, 1) + x
  - logits: h @ wout
  - f: rearrange(cast(flags, f32), "b s -> b s 1")
loss: cross_entropy(logits, targets) + cross_entropy(logits, both) + mean(embedding(wte, both)) + mean(h * f)
optimizer: sgd(lr=0.1)
)yaml");
  auto in = interp::random_inputs(g, 0);
  REQUIRE(in.size() == 5);
  auto range = [&](const std::string& name) {
    const Vec& v = in.at(named(g, name));
    CHECK(v.size() == 32);
    double lo = 1e9, hi = -1e9;
    for (double x : v) {
      CHECK(x == std::trunc(x));
      lo = std::min(lo, x);
      hi = std::max(hi, x);
    }
    return std::pair{lo, hi};
  };
  // 32 draws each: the top value shows up with overwhelming probability (fixed seed anyway).
  CHECK(range("tokens") == std::pair{0.0, 6.0});   // through a transpose into embedding: vocab 7
  CHECK(range("targets") == std::pair{0.0, 4.0});  // cross_entropy: 5 classes
  CHECK(range("both") == std::pair{0.0, 4.0});     // the tighter of 7 and 5
  CHECK(range("flags") == std::pair{0.0, 1.0});    // no bounding use: n = 2
  const Vec& x = in.at(named(g, "x"));
  double mean = 0;
  for (double v : x) mean += v / x.size();
  CHECK(std::fabs(mean) < 4 / std::sqrt(96.0));
  CHECK(in == interp::random_inputs(g, 0));
  CHECK(in != interp::random_inputs(g, 1));

  // The whole model runs on them, and Native f32 agrees with Float64 to f32 accuracy.
  Interpreter exact(g, Numerics::Float64), native(g, Numerics::Native);
  for (Interpreter* it : {&exact, &native}) {
    it->set(interp::initial_values(g, 3));
    it->set(in);
    it->run();
  }
  double l64 = exact.get(g.find_output("loss"))[0], l32 = native.get(g.find_output("loss"))[0];
  CHECK(std::isfinite(l64));
  CHECK(l32 == doctest::Approx(l64).epsilon(1e-5));
  CHECK(l32 == static_cast<double>(static_cast<float>(l32)));  // an f32 value
}
