// The model language's blocks with several arguments, model parameters shared
// by block copies, and einsum of three or more operands, checked by value in
// the float64 interpreter against hand computations and brute-force sums, and
// by gradient against float64 central differences (`napkin check`).
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "interp/gradient_check.h"
#include "interp/interpreter.h"
#include "support/compiled_step.h"
#include "support/test_models.h"

using namespace napkin;
using interp::Interpreter;
using interp::Numerics;

namespace {

ir::ValueId value_named(const ir::Graph& g, const std::string& name) {
  for (ir::ValueId v = 0; v < g.num_values(); ++v)
    if (g.value(v).name == name) return v;
  FAIL("no value named " << name);
  return ir::kNoValue;
}

ir::ValueId param_named(const ir::Graph& g, const std::string& name) {
  for (const ir::Param& p : g.params)
    if (g.value(p.value).name == name) return p.value;
  FAIL("no parameter named " << name);
  return ir::kNoValue;
}

void check_values(const std::vector<double>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    CAPTURE(i);
    CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-12));
  }
}

// einsum by brute force: every assignment of every axis, the product of the
// operands' entries added to the output's entry. Axes are single letters;
// `sizes` gives each letter's size; tensors are dense row-major.
std::vector<double> brute_force_einsum(const std::vector<std::string>& operand_axes, const std::string& out_axes,
                                       const std::vector<std::vector<double>>& operands,
                                       const std::map<char, int>& sizes) {
  std::vector<char> letters;
  for (const auto& [c, n] : sizes) letters.push_back(c);
  auto flat = [&](const std::string& axes, const std::map<char, int>& at) {
    int index = 0;
    for (char c : axes) index = index * sizes.at(c) + at.at(c);
    return index;
  };
  int out_size = 1;
  for (char c : out_axes) out_size *= sizes.at(c);
  std::vector<double> out(out_size, 0.0);
  std::map<char, int> at;
  std::function<void(size_t)> loop = [&](size_t k) {
    if (k == letters.size()) {
      double product = 1;
      for (size_t i = 0; i < operands.size(); ++i) product *= operands[i][flat(operand_axes[i], at)];
      out[flat(out_axes, at)] += product;
      return;
    }
    for (int i = 0; i < sizes.at(letters[k]); ++i) {
      at[letters[k]] = i;
      loop(k + 1);
    }
  };
  loop(0);
  return out;
}

// 1, -2, 3, ... / 7: small distinct values with both signs.
std::vector<double> ramp(int n, int phase) {
  std::vector<double> v;
  for (int i = 0; i < n; ++i) v.push_back(((i + phase) % 2 ? -1.0 : 1.0) * (i + 1 + phase) / 7.0);
  return v;
}

}  // namespace

TEST_CASE("numeric: a two-argument block repeated with a shared model weight computes (x w + s) w + s") {
  ir::Graph g = napkin::testing::compile(R"yaml(
model: t
optimizer: sgd(lr=0.1)
dims: {n: 2, d: 2}
inputs: {x: {shape: [n, d]}, s: {shape: [n, d]}}
params:
  w: {shape: [d, d], init: ones}
blocks:
  res:
    args: [x, skip]
    forward:
      - y: x @ w + skip
forward:
  - y: repeat(res, 2, x, s)
  - z: res(x, skip=s)
loss: mean(y) + mean(z)
)yaml");
  Interpreter it(g, Numerics::Float64);
  it.set(g.inputs[0], {1, 0, 0, 1});  // x = I
  it.set(g.inputs[1], {1, 1, 1, 1});  // s = all ones
  it.set(param_named(g, "w"), {1, 2, 3, 4});
  it.run();
  // By hand: copy 0 gives I w + 1 = [[2, 3], [4, 5]]; copy 1 gives
  // [[2, 3], [4, 5]] w + 1 = [[2+9, 4+12], [4+15, 8+20]] + 1.
  check_values(it.get(value_named(g, "blocks.0.y")), {2, 3, 4, 5});
  check_values(it.get(value_named(g, "blocks.1.y")), {12, 17, 20, 29});
  // The direct call is one more copy with the same weight.
  check_values(it.get(value_named(g, "res.0.y")), {2, 3, 4, 5});
  check_values(it.get(g.outputs[0].second), {(12 + 17 + 20 + 29) / 4.0 + (2 + 3 + 4 + 5) / 4.0});
}

TEST_CASE("numeric: einsum of three and four operands equals the brute-force sum") {
  ir::Graph g = napkin::testing::compile(R"yaml(
model: t
optimizer: sgd(lr=0.1)
dims: {i: 2, j: 3, k: 4, l: 2}
inputs:
  a: {shape: [i, j]}
  b: {shape: [j, k]}
  c: {shape: [k, l]}
  d: {shape: [i, l]}
forward:
  - chain: einsum(a, b, c, "i j, j k, k l -> l i")
  - ring: einsum(a, b, c, d, "i j, j k, k l, i l -> j")
  - scalar: einsum(a, b, c, d, "i j, j k, k l, i l ->")
loss: mean(chain) + mean(ring) + scalar
)yaml");
  const std::map<char, int> sizes = {{'i', 2}, {'j', 3}, {'k', 4}, {'l', 2}};
  std::vector<std::vector<double>> data = {ramp(6, 0), ramp(12, 1), ramp(8, 2), ramp(4, 3)};
  Interpreter it(g, Numerics::Float64);
  for (int i = 0; i < 4; ++i) it.set(g.inputs[i], data[i]);
  it.run();
  std::vector<std::vector<double>> abc(data.begin(), data.begin() + 3);
  check_values(it.get(value_named(g, "chain")), brute_force_einsum({"ij", "jk", "kl"}, "li", abc, sizes));
  check_values(it.get(value_named(g, "ring")), brute_force_einsum({"ij", "jk", "kl", "il"}, "j", data, sizes));
  check_values(it.get(value_named(g, "scalar")), brute_force_einsum({"ij", "jk", "kl", "il"}, "", data, sizes));
}

namespace {
// w is used by three repeat copies and a direct call; u and v only by the
// einsum chain; each copy has its own g.
const char* kSharedWeightModel = R"yaml(
model: t
optimizer: sgd(lr=0.1)
dims: {n: 3, d: 4, k: 2}
inputs: {x: {shape: [n, d]}, s: {shape: [n, d]}}
params:
  w: {shape: [d, d], init: normal(0.5)}
  u: {shape: [d, k], init: normal(0.5)}
  v: {shape: [k, d], init: normal(0.5)}
blocks:
  res:
    args: [x, skip]
    params: {g: {shape: [d], init: ones}}
    forward:
      - y: tanh(x @ w) * g + skip
forward:
  - h: repeat(res, 3, x, s)
  - h: res(h, x)
  - z: einsum(h, u, v, "n d, d k, k e -> n e")
loss: mean(z * z)
)yaml";
}  // namespace

TEST_CASE("numeric: gradients of a shared weight sum over block copies and calls - napkin check passes") {
  // A gradient that kept one use of w, or an einsum chain with a wrong
  // pairwise rule, fails the check.
  ir::Graph g = napkin::testing::compile_training(kSharedWeightModel);
  // w, u, v once each, and one g per copy.
  CHECK(g.param_count() == 4 * 4 + 4 * 2 + 2 * 4 + 4 * 4);
  interp::GradCheckOptions options;
  options.samples = 16;  // every element of w
  interp::GradCheckResult r = interp::check_gradients(g, options);
  REQUIRE(r.tensors.size() == g.params.size());
  for (const interp::TensorCheck& t : r.tensors) {
    CAPTURE(t.name);
    CAPTURE(t.error_f64);
    CHECK(t.passed);
  }
  CHECK(r.passed);
}

TEST_CASE("numeric: the CPU kernels of a shared weight and an einsum chain agree with the interpreter") {
  // The gradient of w accumulates over four uses and the chain's intermediate
  // einsums have their own axis orders: each compiled kernel, on its own inputs.
  napkin::testing::CompiledStep step(napkin::testing::compile_training(kSharedWeightModel));
  int checked = 0;
  napkin::testing::check_each_kernel(step, [&](const napkin::testing::KernelOutputCheck& c) {
    INFO(c.kernel->name << " output " << c.output << " at " << c.kernel->where);
    CHECK(c.error <= napkin::testing::kernel_tolerance(c.precision));
    ++checked;
  });
  CHECK(checked > 10);
}

namespace {
// t is a top-level forward value that every copy of the repeat reads: its
// gradient is the sum over the three copies, and p's follows from it
// elementwise, so each entry of p checks one entry of that sum.
const char* kTopLevelValueModel = R"yaml(
model: t
optimizer: sgd(lr=0.1)
dims: {n: 2, d: 3}
inputs: {x: {shape: [n, d]}}
params:
  p: {shape: [n, d], init: normal(0.5)}
blocks:
  layer:
    params: {g: {shape: [d], init: normal(0.5)}}
    forward:
      - x: tanh(x * g + t)
forward:
  - t: tanh(p)
  - y: repeat(layer, 3, x)
loss: mean(y * y)
)yaml";
}  // namespace

TEST_CASE("numeric: a top-level value read by every copy of a repeat - by hand, and napkin check passes") {
  ir::Graph forward = napkin::testing::compile(kTopLevelValueModel);
  Interpreter it(forward, Numerics::Float64);
  const std::vector<double> x = ramp(6, 0), p = ramp(6, 1);
  const std::vector<std::vector<double>> gains = {ramp(3, 2), ramp(3, 3), ramp(3, 4)};
  it.set(forward.inputs[0], x);
  it.set(param_named(forward, "p"), p);
  for (int i = 0; i < 3; ++i) it.set(param_named(forward, "blocks." + std::to_string(i) + ".g"), gains[i]);
  it.run();
  std::vector<double> y = x;
  for (int i = 0; i < 3; ++i)
    for (int e = 0; e < 6; ++e) y[e] = std::tanh(y[e] * gains[i][e % 3] + std::tanh(p[e]));
  check_values(it.get(value_named(forward, "blocks.2.x")), y);

  // A gradient that kept one copy's use of t (or dropped t's) fails on p.
  ir::Graph g = napkin::testing::compile_training(kTopLevelValueModel);
  interp::GradCheckOptions options;
  options.samples = 6;  // every element of p
  interp::GradCheckResult r = interp::check_gradients(g, options);
  REQUIRE(r.tensors.size() == 4);
  for (const interp::TensorCheck& t : r.tensors) {
    CAPTURE(t.name);
    CAPTURE(t.error_f64);
    CHECK(t.passed);
  }
  CHECK(r.passed);
}
