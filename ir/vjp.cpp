// The vector-Jacobian products of napkin's ops (docs/autodiff.md has the table).
//
// Conventions every rule follows:
//  - `dy` has the type of the node's output; the rule returns one entry per
//    input, of exactly that input's type, or kNoValue where an input carries no
//    gradient (bool/integer inputs: where's condition, embedding ids,
//    cross_entropy targets, a cast from an integer, comparison operands).
//  - A rule builds the gradient of every floating input: it does not know which
//    inputs need one. Autodiff erases the backward nodes no parameter gradient
//    reads, so an unneeded gradient (pow's exponent, a data operand of a
//    matmul) costs nothing.
//  - Rules read the forward output y instead of the input x where both work
//    (exp, tanh, sigmoid, sqrt, rsqrt, relu): one saved activation fewer.
//  - Ties: maximum/minimum send dy to the first operand on ties;
//    reduce_max/min split dy evenly among the tied elements (torch amax).
//  - The builder's loc, scope and phase are set by the caller.
#include "ir/vjp.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <string>

#include "ir/builder.h"
#include "ir/internal_check.h"
#include "ir/rope.h"

namespace napkin::ir {

namespace {

using Grads = std::vector<ValueId>;

TensorType type_of(Builder& b, ValueId v) { return b.graph().value(v).type; }

ValueId node(Builder& b, Op op, std::vector<ValueId> inputs, Attrs attrs = {}) {
  return b.must(b.add(op, std::move(inputs), std::move(attrs)));
}
ValueId scalar(Builder& b, double value, DType dtype) { return b.must(b.constant(value, dtype)); }
ValueId reshape(Builder& b, ValueId x, const std::vector<Dim>& dims) { return b.must(b.reshape(x, dims)); }

ValueId neg(Builder& b, ValueId x) { return node(b, Op::Neg, {x}); }
ValueId add(Builder& b, ValueId x, ValueId y) { return node(b, Op::Add, {x, y}); }
ValueId sub(Builder& b, ValueId x, ValueId y) { return node(b, Op::Sub, {x, y}); }
ValueId mul(Builder& b, ValueId x, ValueId y) { return node(b, Op::Mul, {x, y}); }
ValueId div(Builder& b, ValueId x, ValueId y) { return node(b, Op::Div, {x, y}); }
ValueId where(Builder& b, ValueId c, ValueId x, ValueId y) { return node(b, Op::Where, {c, x, y}); }

ValueId reduce_sum(Builder& b, ValueId x, const std::vector<int64_t>& axes, bool keepdims) {
  if (axes.empty()) return x;
  return node(b, Op::ReduceSum, {x}, {{"axes", axes}, {"keepdims", int64_t{keepdims ? 1 : 0}}});
}

// A view of x broadcast to `target`'s shape (x is right-aligned, its size-1 axes repeat).
ValueId broadcast_to(Builder& b, ValueId x, const TensorType& target) {
  if (type_of(b, x).same_shape(target) && type_of(b, x).rank() == target.rank()) return x;
  ValueId v = node(b, Op::Broadcast, {x}, {{"shape", target.sizes()}});
  b.rename_dims(v, target.dims);
  return v;
}

// The gradient of an operand that numpy broadcasting stretched to grad's shape:
// sum over the leading extra axes and the axes where the operand has size 1,
// then reshape to the operand's shape.
ValueId unbroadcast(Builder& b, ValueId grad, const TensorType& target) {
  TensorType gt = type_of(b, grad);
  int extra = gt.rank() - target.rank();
  NAPKIN_INTERNAL_CHECK(extra >= 0, "unbroadcast: {} has fewer axes than {}", to_string(gt), to_string(target));
  std::vector<int64_t> axes;
  for (int i = 0; i < gt.rank(); ++i)
    if (i < extra || (target.dims[i - extra].size == 1 && gt.dims[i].size != 1)) axes.push_back(i);
  return reshape(b, reduce_sum(b, grad, axes, false), target.dims);
}

// dy of a reduction over `axes`, reshaped so the reduced axes are there with size 1.
ValueId keepdims_form(Builder& b, ValueId v, const TensorType& in, const std::vector<int64_t>& axes) {
  std::vector<Dim> dims = in.dims;
  for (int64_t a : axes) dims[a] = {1, ""};
  return reshape(b, v, dims);
}

// ---- elementwise, unary --------------------------------------------------------

Grads vjp_none(Builder&, const Node& n, ValueId) { return Grads(n.inputs.size(), kNoValue); }

Grads vjp_neg(Builder& b, const Node&, ValueId dy) { return {neg(b, dy)}; }

Grads vjp_exp(Builder& b, const Node& n, ValueId dy) { return {mul(b, n.out(), dy)}; }

Grads vjp_log(Builder& b, const Node& n, ValueId dy) { return {div(b, dy, n.in(0))}; }

// d sqrt(x) = dy / (2 y)
Grads vjp_sqrt(Builder& b, const Node& n, ValueId dy) {
  DType t = type_of(b, dy).dtype;
  return {div(b, dy, mul(b, n.out(), scalar(b, 2, t)))};
}

// d x^(-1/2) = -0.5 x^(-3/2) dy = -0.5 y^3 dy
Grads vjp_rsqrt(Builder& b, const Node& n, ValueId dy) {
  DType t = type_of(b, dy).dtype;
  ValueId y = n.out();
  ValueId y3 = mul(b, mul(b, y, y), y);
  return {mul(b, mul(b, y3, scalar(b, -0.5, t)), dy)};
}

// sign(x) dy, with sign(0) = 0
Grads vjp_abs(Builder& b, const Node& n, ValueId dy) {
  ValueId x = n.in(0);
  ValueId zero = scalar(b, 0, type_of(b, x).dtype);
  ValueId negative = where(b, node(b, Op::Less, {x, zero}), neg(b, dy), zero);
  return {where(b, node(b, Op::Greater, {x, zero}), dy, negative)};
}

// (1 - y^2) dy
Grads vjp_tanh(Builder& b, const Node& n, ValueId dy) {
  ValueId y = n.out();
  ValueId one = scalar(b, 1, type_of(b, y).dtype);
  return {mul(b, sub(b, one, mul(b, y, y)), dy)};
}

// where(y > 0, dy, 0): y > 0 exactly where x > 0, and y is the value already kept.
Grads vjp_relu(Builder& b, const Node& n, ValueId dy) {
  ValueId y = n.out();
  ValueId zero = scalar(b, 0, type_of(b, y).dtype);
  return {where(b, node(b, Op::Greater, {y, zero}), dy, zero)};
}

Grads vjp_gelu(Builder& b, const Node& n, ValueId dy) {
  return {node(b, Op::GeluGrad, {n.in(0), dy}, {{"approximate", n.attrs.get_string("approximate")}})};
}

// y (1 - y) dy
Grads vjp_sigmoid(Builder& b, const Node& n, ValueId dy) {
  ValueId y = n.out();
  ValueId one = scalar(b, 1, type_of(b, y).dtype);
  return {mul(b, mul(b, y, sub(b, one, y)), dy)};
}

// silu = x s(x): s (1 + x (1 - s)) dy
Grads vjp_silu(Builder& b, const Node& n, ValueId dy) {
  ValueId x = n.in(0);
  ValueId one = scalar(b, 1, type_of(b, x).dtype);
  ValueId s = node(b, Op::Sigmoid, {x});
  ValueId inner = add(b, one, mul(b, x, sub(b, one, s)));
  return {mul(b, mul(b, s, inner), dy)};
}

// softplus' = sigmoid: s(x) dy
Grads vjp_softplus(Builder& b, const Node& n, ValueId dy) { return {mul(b, node(b, Op::Sigmoid, {n.in(0)}), dy)}; }

Grads vjp_sin(Builder& b, const Node& n, ValueId dy) { return {mul(b, node(b, Op::Cos, {n.in(0)}), dy)}; }

Grads vjp_cos(Builder& b, const Node& n, ValueId dy) {
  return {neg(b, mul(b, node(b, Op::Sin, {n.in(0)}), dy))};
}

// Back to the input's dtype; an integer or bool input has no gradient.
Grads vjp_cast(Builder& b, const Node& n, ValueId dy) {
  DType from = type_of(b, n.in(0)).dtype;
  if (!is_floating(from)) return {kNoValue};
  if (type_of(b, dy).dtype == from) return {dy};
  return {node(b, Op::Cast, {dy}, {{"dtype", from}})};
}

Grads vjp_triu(Builder& b, const Node& n, ValueId dy) {
  return {node(b, Op::Triu, {dy}, {{"k", n.attrs.get_int("k")}})};
}

// The masked entries (j > i) are constants: dy - triu(dy, 1) zeroes them.
Grads vjp_causal_mask(Builder& b, const Node&, ValueId dy) {
  return {sub(b, dy, node(b, Op::Triu, {dy}, {{"k", int64_t{1}}}))};
}

// The same mask again (a pure function of the rng words and attributes):
// dx = dy * mask / (1 - p), which is dropout(dy); the rng words get none.
Grads vjp_dropout(Builder& b, const Node& n, ValueId dy) {
  std::vector<ValueId> inputs = n.inputs;
  inputs[0] = dy;
  return {node(b, Op::Dropout, inputs, n.attrs), kNoValue, kNoValue, kNoValue, kNoValue};
}

// ---- elementwise, binary -------------------------------------------------------

Grads vjp_add(Builder& b, const Node& n, ValueId dy) {
  return {unbroadcast(b, dy, type_of(b, n.in(0))), unbroadcast(b, dy, type_of(b, n.in(1)))};
}

Grads vjp_sub(Builder& b, const Node& n, ValueId dy) {
  return {unbroadcast(b, dy, type_of(b, n.in(0))), neg(b, unbroadcast(b, dy, type_of(b, n.in(1))))};
}

Grads vjp_mul(Builder& b, const Node& n, ValueId dy) {
  ValueId x = n.in(0), y = n.in(1);
  return {unbroadcast(b, mul(b, dy, y), type_of(b, x)), unbroadcast(b, mul(b, dy, x), type_of(b, y))};
}

// z = a / b: da = dy / b; db = -dy a / b^2 = -(dy z / b)
Grads vjp_div(Builder& b, const Node& n, ValueId dy) {
  ValueId x = n.in(0), y = n.in(1);
  ValueId da = unbroadcast(b, div(b, dy, y), type_of(b, x));
  ValueId db = neg(b, unbroadcast(b, div(b, mul(b, dy, n.out()), y), type_of(b, y)));
  return {da, db};
}

// z = a^p: da = p a^(p-1) dy; db = log(a) z dy (erased unless the exponent needs it)
Grads vjp_pow(Builder& b, const Node& n, ValueId dy) {
  ValueId a = n.in(0), p = n.in(1);
  ValueId one = scalar(b, 1, type_of(b, a).dtype);
  ValueId da = mul(b, mul(b, p, node(b, Op::Pow, {a, sub(b, p, one)})), dy);
  ValueId db = mul(b, mul(b, node(b, Op::Log, {a}), n.out()), dy);
  return {unbroadcast(b, da, type_of(b, a)), unbroadcast(b, db, type_of(b, p))};
}

// dy goes to the operand that was chosen; ties go to the first operand.
Grads vjp_select_one(Builder& b, const Node& n, ValueId dy, Op first_wins) {
  ValueId x = n.in(0), y = n.in(1);
  ValueId zero = scalar(b, 0, type_of(b, dy).dtype);
  ValueId c = node(b, first_wins, {x, y});
  return {unbroadcast(b, where(b, c, dy, zero), type_of(b, x)),
          unbroadcast(b, where(b, c, zero, dy), type_of(b, y))};
}
Grads vjp_maximum(Builder& b, const Node& n, ValueId dy) { return vjp_select_one(b, n, dy, Op::GreaterEqual); }
Grads vjp_minimum(Builder& b, const Node& n, ValueId dy) { return vjp_select_one(b, n, dy, Op::LessEqual); }

Grads vjp_where(Builder& b, const Node& n, ValueId dy) {
  ValueId c = n.in(0);
  ValueId zero = scalar(b, 0, type_of(b, dy).dtype);
  return {kNoValue, unbroadcast(b, where(b, c, dy, zero), type_of(b, n.in(1))),
          unbroadcast(b, where(b, c, zero, dy), type_of(b, n.in(2)))};
}

// ---- reductions ----------------------------------------------------------------

Grads vjp_reduce_sum(Builder& b, const Node& n, ValueId dy) {
  TensorType in = type_of(b, n.in(0));
  const auto& axes = n.attrs.get_ints("axes");
  return {broadcast_to(b, keepdims_form(b, dy, in, axes), in)};
}

Grads vjp_reduce_mean(Builder& b, const Node& n, ValueId dy) {
  TensorType in = type_of(b, n.in(0));
  const auto& axes = n.attrs.get_ints("axes");
  double count = 1;
  for (int64_t a : axes) count *= static_cast<double>(in.dims[a].size);
  ValueId scaled = div(b, dy, scalar(b, count, in.dtype));
  return {broadcast_to(b, keepdims_form(b, scaled, in, axes), in)};
}

// dy is shared evenly among the elements equal to the extremum (torch amax/amin).
Grads vjp_reduce_extremum(Builder& b, const Node& n, ValueId dy) {
  ValueId x = n.in(0);
  TensorType in = type_of(b, x);
  const auto& axes = n.attrs.get_ints("axes");
  ValueId y = keepdims_form(b, n.out(), in, axes);
  ValueId mask = node(b, Op::Cast, {node(b, Op::Equal, {x, y})}, {{"dtype", in.dtype}});
  ValueId count = reduce_sum(b, mask, axes, true);
  ValueId share = div(b, keepdims_form(b, dy, in, axes), count);
  return {mul(b, mask, share)};
}

// ---- contractions --------------------------------------------------------------

std::vector<std::string> split_names(const std::string& s) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s + " ") {
    if (c == ' ') {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  return out;
}

std::string spec_side(const std::vector<int64_t>& ids, const std::vector<std::string>& names) {
  std::string s;
  for (int64_t id : ids) {
    if (!s.empty()) s += ' ';
    s += id >= 0 && id < static_cast<int64_t>(names.size()) ? names[id] : std::to_string(id);
  }
  return s;
}

// einsum(x[xs], y[ys] -> [target ids]), where target ids that appear in
// neither x nor y are left out of the contraction: the result is reshaped
// to put size-1 axes there and broadcast to `target` (a view).
ValueId einsum_grad(Builder& b, ValueId x, const std::vector<int64_t>& xs, ValueId y,
                    const std::vector<int64_t>& ys, const std::vector<int64_t>& target_ids,
                    const TensorType& target, const std::vector<std::string>& names) {
  auto has = [](const std::vector<int64_t>& v, int64_t id) { return std::find(v.begin(), v.end(), id) != v.end(); };
  std::vector<int64_t> out;
  std::vector<Dim> kept_dims = target.dims;
  for (size_t i = 0; i < target_ids.size(); ++i) {
    if (has(xs, target_ids[i]) || has(ys, target_ids[i])) out.push_back(target_ids[i]);
    else kept_dims[i] = {1, ""};
  }
  std::string axis_names;
  for (const std::string& name : names) axis_names += (axis_names.empty() ? "" : " ") + name;
  Attrs attrs{{"lhs", xs},
              {"rhs", ys},
              {"out", out},
              {"axis_names", axis_names},
              {"spec", spec_side(xs, names) + ", " + spec_side(ys, names) + " -> " + spec_side(out, names)}};
  ValueId g = node(b, Op::Einsum, {x, y}, attrs);
  if (out.size() == target_ids.size()) {
    b.rename_dims(g, target.dims);
    return g;
  }
  return broadcast_to(b, reshape(b, g, kept_dims), target);
}

// Y = einsum(A[lhs], B[rhs] -> out): dA = einsum(dY[out], B[rhs] -> lhs), dB = einsum(A[lhs], dY[out] -> rhs).
Grads vjp_einsum(Builder& b, const Node& n, ValueId dy) {
  const auto& lhs = n.attrs.get_ints("lhs");
  const auto& rhs = n.attrs.get_ints("rhs");
  const auto& out = n.attrs.get_ints("out");
  std::vector<std::string> names = split_names(n.attrs.get_string("axis_names"));
  ValueId a = n.in(0), c = n.in(1);
  ValueId da = einsum_grad(b, dy, out, c, rhs, lhs, type_of(b, a), names);
  ValueId dc = einsum_grad(b, a, lhs, dy, out, rhs, type_of(b, c), names);
  return {da, dc};
}

// matmul (..a, m, k) @ (..b, k, n) -> (.., m, n) as einsums, so each gradient
// costs exactly the forward's 2·batch·M·N·K and no transpose is materialized.
// Batch axes of an operand that broadcasting stretched (missing, or size 1 where
// the output is larger) are summed inside the einsum and put back as size 1.
Grads vjp_matmul(Builder& b, const Node& n, ValueId dy) {
  ValueId a = n.in(0), c = n.in(1);
  TensorType ta = type_of(b, a), tc = type_of(b, c), ty = type_of(b, dy);
  int nb = ty.rank() - 2;
  int64_t m = nb, k = nb + 1, nn = nb + 2;
  int64_t next_id = nb + 3;
  std::vector<std::string> names;
  for (int i = 0; i < nb; ++i) names.push_back("batch" + std::to_string(i));
  names.insert(names.end(), {"m", "k", "n"});
  std::vector<int64_t> y_ids(nb);
  std::iota(y_ids.begin(), y_ids.end(), 0);
  y_ids.insert(y_ids.end(), {m, nn});
  // An operand's ids: its batch axes map to the output's, except broadcast
  // size-1 axes, which get ids of their own (summed away, a factor of 1).
  auto ids_of = [&](const TensorType& t, int64_t row, int64_t col) {
    std::vector<int64_t> ids;
    int ob = t.rank() - 2;
    for (int i = 0; i < ob; ++i) {
      int yi = i + (nb - ob);
      if (t.dims[i].size == ty.dims[yi].size) {
        ids.push_back(yi);
      } else {
        ids.push_back(next_id++);
        names.push_back("one" + std::to_string(i));
      }
    }
    ids.push_back(row);
    ids.push_back(col);
    return ids;
  };
  std::vector<int64_t> a_ids = ids_of(ta, m, k);
  std::vector<int64_t> c_ids = ids_of(tc, k, nn);
  ValueId da = einsum_grad(b, dy, y_ids, c, c_ids, a_ids, ta, names);
  ValueId dc = einsum_grad(b, a, a_ids, dy, y_ids, c_ids, tc, names);
  return {da, dc};
}

// ---- views and data movement ---------------------------------------------------

Grads vjp_reshape(Builder& b, const Node& n, ValueId dy) { return {reshape(b, dy, type_of(b, n.in(0)).dims)}; }

Grads vjp_permute(Builder& b, const Node& n, ValueId dy) {
  const auto& perm = n.attrs.get_ints("perm");
  std::vector<int64_t> inverse(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) inverse[perm[i]] = static_cast<int64_t>(i);
  return {b.must(b.permute(dy, inverse))};
}

Grads vjp_broadcast(Builder& b, const Node& n, ValueId dy) { return {unbroadcast(b, dy, type_of(b, n.in(0)))}; }

ValueId pad(Builder& b, ValueId x, int64_t axis, int64_t before, int64_t after) {
  if (before == 0 && after == 0) return x;
  return node(b, Op::Pad, {x}, {{"axis", axis}, {"before", before}, {"after", after}});
}

ValueId slice(Builder& b, ValueId x, int64_t axis, int64_t start, int64_t stop) {
  if (start == 0 && stop == type_of(b, x).dims[axis].size) return x;
  return node(b, Op::Slice, {x}, {{"axis", axis}, {"start", start}, {"stop", stop}});
}

Grads vjp_slice(Builder& b, const Node& n, ValueId dy) {
  int64_t axis = n.attrs.get_int("axis");
  int64_t size = type_of(b, n.in(0)).dims[axis].size;
  return {pad(b, dy, axis, n.attrs.get_int("start"), size - n.attrs.get_int("stop"))};
}

Grads vjp_select(Builder& b, const Node& n, ValueId dy) {
  int64_t axis = n.attrs.get_int("axis"), index = n.attrs.get_int("index");
  TensorType in = type_of(b, n.in(0));
  std::vector<Dim> dims = in.dims;
  dims[axis] = {1, ""};
  return {pad(b, reshape(b, dy, dims), axis, index, in.dims[axis].size - index - 1)};
}

Grads vjp_copy(Builder&, const Node&, ValueId dy) { return {dy}; }

Grads vjp_concat(Builder& b, const Node& n, ValueId dy) {
  int64_t axis = n.attrs.get_int("axis");
  Grads grads;
  int64_t offset = 0;
  for (ValueId in : n.inputs) {
    int64_t size = type_of(b, in).dims[axis].size;
    grads.push_back(slice(b, dy, axis, offset, offset + size));
    offset += size;
  }
  return grads;
}

Grads vjp_pad(Builder& b, const Node& n, ValueId dy) {
  int64_t axis = n.attrs.get_int("axis"), before = n.attrs.get_int("before");
  return {slice(b, dy, axis, before, before + type_of(b, n.in(0)).dims[axis].size)};
}

Grads vjp_embedding(Builder& b, const Node& n, ValueId dy) {
  int64_t vocab = type_of(b, n.in(0)).dims[0].size;
  ValueId table = node(b, Op::EmbeddingGrad, {dy, n.in(1)}, {{"vocab", vocab}});
  b.rename_dims(table, type_of(b, n.in(0)).dims);
  return {table, kNoValue};
}

// ---- composite ops -------------------------------------------------------------

Grads vjp_softmax(Builder& b, const Node& n, ValueId dy) {
  return {node(b, Op::SoftmaxGrad, {n.out(), dy}, {{"axis", n.attrs.get_int("axis")}})};
}

// y = x - logsumexp(x): dx = dy - exp(y) sum(dy, axis)
Grads vjp_log_softmax(Builder& b, const Node& n, ValueId dy) {
  ValueId total = reduce_sum(b, dy, {n.attrs.get_int("axis")}, true);
  return {sub(b, dy, mul(b, node(b, Op::Exp, {n.out()}), total))};
}

// Fused attention: one attention_grad node recomputes the scores from q, k and
// the saved lse (ir/loop.h) and gives all three gradients; it takes the
// forward's attributes, so a fused rope (rope_*) rotates its q and k alike and
// its dq, dk are those of the unrotated q and k.
Grads vjp_attention(Builder& b, const Node& n, ValueId dy) {
  ValueId d_o = b.unit_inner_stride(dy);
  ValueId dq = b.must(b.add(Op::AttentionGrad, {n.in(0), n.in(1), n.in(2), n.out(0), n.out(1), d_o}, n.attrs));
  const Node& grad = b.graph().node(b.graph().value(dq).producer);
  return {grad.out(0), grad.out(1), grad.out(2)};
}

// The fused classifier: one linear_cross_entropy_grad node recomputes the
// logits chunk by chunk from x, w and the saved lse (ir/loop.h) and gives dx and dw.
Grads vjp_linear_cross_entropy(Builder& b, const Node& n, ValueId dloss) {
  ValueId dx = b.must(b.add(Op::LinearCrossEntropyGrad, {n.in(0), n.in(1), n.in(2), n.out(1), dloss}, n.attrs));
  const Node& grad = b.graph().node(b.graph().value(dx).producer);
  return {grad.out(0), grad.out(1), kNoValue};
}

// A rotation's transpose is the rotation by the negated angles: dx is rope of
// dy with `inverse` flipped; the positions are integers and get no gradient.
Grads vjp_rope(Builder& b, const Node& n, ValueId dy) {
  RopeParams p = rope_params(n.attrs);
  p.inverse = !p.inverse;
  Attrs attrs;
  set_rope_attrs(attrs, p);
  std::vector<ValueId> inputs{dy};
  if (p.explicit_positions) inputs.push_back(n.in(1));
  Grads grads{node(b, Op::Rope, inputs, attrs)};
  if (p.explicit_positions) grads.push_back(kNoValue);
  return grads;
}

// top_k sends each dvalue to the element it picked, zeros elsewhere: a
// scatter-add of the R·k rows of dvalues (R: the product of x's leading axes)
// into the R·n elements of x at the ids indices + n · row, which is the
// embedding's gradient over a table of R·n rows of one element. A row's k
// indices are distinct, so nothing adds. Built from existing ops: no kernel of
// its own. The indices are integers and get no gradient; nor does x through them.
Grads vjp_top_k(Builder& b, const Node& n, ValueId dvalues) {
  const TensorType x = type_of(b, n.in(0)), picked = type_of(b, n.out(0));
  const int64_t row = x.dims.back().size, k = picked.dims.back().size, rows = x.numel() / row;
  // The ids reach R·n - 1: i32 unless that does not fit.
  const DType id = rows * row - 1 <= std::numeric_limits<int32_t>::max() ? DType::I32 : DType::I64;
  ValueId indices = n.out(1);
  if (id != DType::I32) indices = node(b, Op::Cast, {indices}, {{"dtype", id}});
  const ValueId row_base = reshape(b, mul(b, node(b, Op::Iota, {}, {{"n", rows}, {"dtype", id}}), scalar(b, double(row), id)),
                                   {{rows, ""}, {1, ""}});
  const ValueId ids = reshape(b, add(b, reshape(b, indices, {{rows, ""}, {k, ""}}), row_base), {{rows * k, ""}});
  const ValueId dy = reshape(b, dvalues, {{rows * k, ""}, {1, ""}});
  const ValueId dx = node(b, Op::EmbeddingGrad, {dy, ids}, {{"vocab", rows * row}});
  return {reshape(b, dx, x.dims)};
}

Grads vjp_layernorm(Builder& b, const Node& n, ValueId dy) {
  ValueId x = n.in(0), gain = n.in(1);
  double eps = n.attrs.get_double("eps");
  // dx, the gain's and the bias's gradients from one pass over x and dy.
  ValueId dx = node(b, Op::LayerNormGrad, {x, gain, dy}, {{"eps", eps}, {"gains", int64_t{1}}});
  const Node& grads = b.graph().node(b.graph().value(dx).producer);
  return {dx, grads.out(1), grads.out(2)};
}

Grads vjp_rmsnorm(Builder& b, const Node& n, ValueId dy) {
  ValueId x = n.in(0), gain = n.in(1);
  double eps = n.attrs.get_double("eps");
  ValueId dx = node(b, Op::RMSNormGrad, {x, gain, dy}, {{"eps", eps}, {"gains", int64_t{1}}});
  const Node& grads = b.graph().node(b.graph().value(dx).producer);
  return {dx, grads.out(1)};
}

Grads vjp_cross_entropy(Builder& b, const Node& n, ValueId dy) {
  return {node(b, Op::CrossEntropyGrad, {n.in(0), n.in(1), dy}, n.attrs), kNoValue};
}

// mean((a - b)^2): da = 2 (a - b) / numel · dy, db = -da
Grads vjp_mse(Builder& b, const Node& n, ValueId dy) {
  ValueId a = n.in(0), t = n.in(1);
  TensorType ta = type_of(b, a);
  ValueId scale = mul(b, dy, scalar(b, 2.0 / static_cast<double>(ta.numel()), ta.dtype));
  ValueId da = mul(b, sub(b, a, t), scale);
  return {da, neg(b, da)};
}

Grads vjp_source(Builder&, const Node&, ValueId) { return {}; }

}  // namespace

VjpFn vjp_rule(Op op) {
  switch (op) {
    case Op::Constant: return vjp_source;
    case Op::Iota: return vjp_source;
    case Op::Neg: return vjp_neg;
    case Op::Exp: return vjp_exp;
    case Op::Log: return vjp_log;
    case Op::Sqrt: return vjp_sqrt;
    case Op::Rsqrt: return vjp_rsqrt;
    case Op::Abs: return vjp_abs;
    case Op::Tanh: return vjp_tanh;
    case Op::Relu: return vjp_relu;
    case Op::Gelu: return vjp_gelu;
    case Op::Sigmoid: return vjp_sigmoid;
    case Op::Silu: return vjp_silu;
    case Op::Softplus: return vjp_softplus;
    case Op::Sin: return vjp_sin;
    case Op::Cos: return vjp_cos;
    case Op::Cast: return vjp_cast;
    case Op::Triu: return vjp_triu;
    case Op::CausalMask: return vjp_causal_mask;
    case Op::Dropout: return vjp_dropout;
    case Op::Add: return vjp_add;
    case Op::Sub: return vjp_sub;
    case Op::Mul: return vjp_mul;
    case Op::Div: return vjp_div;
    case Op::Pow: return vjp_pow;
    case Op::Maximum: return vjp_maximum;
    case Op::Minimum: return vjp_minimum;
    case Op::Less: return vjp_none;
    case Op::LessEqual: return vjp_none;
    case Op::Greater: return vjp_none;
    case Op::GreaterEqual: return vjp_none;
    case Op::Equal: return vjp_none;
    case Op::NotEqual: return vjp_none;
    case Op::Where: return vjp_where;
    case Op::ReduceSum: return vjp_reduce_sum;
    case Op::ReduceMean: return vjp_reduce_mean;
    case Op::ReduceMax: return vjp_reduce_extremum;
    case Op::ReduceMin: return vjp_reduce_extremum;
    case Op::MatMul: return vjp_matmul;
    case Op::Einsum: return vjp_einsum;
    case Op::Reshape: return vjp_reshape;
    case Op::Permute: return vjp_permute;
    case Op::Broadcast: return vjp_broadcast;
    case Op::Slice: return vjp_slice;
    case Op::Select: return vjp_select;
    case Op::Copy: return vjp_copy;
    case Op::Concat: return vjp_concat;
    case Op::Embedding: return vjp_embedding;
    case Op::Pad: return vjp_pad;
    case Op::Softmax: return vjp_softmax;
    case Op::LogSoftmax: return vjp_log_softmax;
    case Op::LayerNorm: return vjp_layernorm;
    case Op::RMSNorm: return vjp_rmsnorm;
    case Op::CrossEntropy: return vjp_cross_entropy;
    case Op::MSE: return vjp_mse;
    case Op::Attention: return vjp_attention;
    case Op::LinearCrossEntropy: return vjp_linear_cross_entropy;
    case Op::Rope: return vjp_rope;
    case Op::TopK: return vjp_top_k;
    // Integer results and counts of them: nothing to send back (its operand is integer).
    case Op::MoeSlots: return vjp_none;
    // Backward-only ops: napkin differentiates once.
    case Op::SoftmaxGrad: return nullptr;
    case Op::LayerNormGrad: return nullptr;
    case Op::RMSNormGrad: return nullptr;
    case Op::GeluGrad: return nullptr;
    case Op::CrossEntropyGrad: return nullptr;
    case Op::AttentionGrad: return nullptr;
    case Op::LinearCrossEntropyGrad: return nullptr;
    case Op::CachedAttention: return nullptr;
    case Op::EmbeddingGrad: return nullptr;
    case Op::AllReduceSum: return nullptr;  // the optimizer's and loss scaling's, after the backward
    case Op::AllGather:
    case Op::ReduceScatter: return nullptr;  // shard_parameters', after autodiff
  }
  return nullptr;
}

}  // namespace napkin::ir
