// Elementwise, reduction, contraction and data-movement kernels, and the one
// switch over every op (no default: -Werror=switch flags a new op here).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "interp/kernels.h"
#include "interp/float64_arithmetic.h"

namespace napkin::interp::detail {

using ir::DType;
using ir::Op;

void fail(const ir::Node& n, const std::string& what) {
  std::string where = fmt::format("node {}", n.id);
  if (n.loc.known()) where += fmt::format(", {}:{}", *n.loc.file, n.loc.line);
  throw std::runtime_error(fmt::format("{} ({}): {}", ir::op_name(n.op), where, what));
}

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Every elementwise op: its formula (ir/elementwise_formulas.h) in double at
// each element of the broadcast output shape.
Data elementwise(const ir::Node& n, const std::vector<Arg>& in, const OutType& out) {
  Float64Arithmetic arith(&n);
  std::vector<Shape> strides;
  for (const Arg& a : in) strides.push_back(broadcast_strides(a.shape, out.shape));
  std::vector<Float64Arithmetic::Value> args(in.size());
  ir::formulas::Position<Float64Arithmetic> at;
  const size_t rank = out.shape.size();
  Data result;
  result.reserve(numel(out.shape));
  for_each_index(out.shape, [&](const Shape& idx) {
    for (size_t k = 0; k < in.size(); ++k) args[k] = arith.value(in[k].data[dot(idx, strides[k])], in[k].dtype);
    if (rank >= 2) {
      at.row = arith.value(static_cast<double>(idx[rank - 2]), DType::I64);
      at.col = arith.value(static_cast<double>(idx[rank - 1]), DType::I64);
    }
    at.flat = arith.value(static_cast<double>(result.size()), DType::I64);
    result.push_back(ir::formulas::apply_elementwise(n.op, n.attrs, in[0].dtype, out.dtype, args, at).handle().v);
  });
  return result;
}

Data reduce(Op op, const Arg& x, const std::vector<int64_t>& axes, bool keepdims, const Shape& out_shape) {
  int rank = static_cast<int>(x.shape.size());
  Shape out_dense = dense_strides(out_shape);
  Shape to_out(rank, 0);  // stride in the output of each input axis (0 if reduced)
  for (int d = 0, o = 0; d < rank; ++d) {
    bool reduced = std::find(axes.begin(), axes.end(), d) != axes.end();
    if (!reduced) to_out[d] = out_dense[o];
    if (!reduced || keepdims) ++o;
  }
  double init = op == Op::ReduceMax ? -kInf : op == Op::ReduceMin ? kInf : 0.0;
  Data out(numel(out_shape), init);
  Shape x_dense = dense_strides(x.shape);
  for_each_index(x.shape, [&](const Shape& idx) {
    double v = x.data[dot(idx, x_dense)];
    double& acc = out[dot(idx, to_out)];
    switch (op) {
      case Op::ReduceMax: acc = nan_max(acc, v); break;
      case Op::ReduceMin: acc = nan_min(acc, v); break;
      default: acc += v; break;
    }
  });
  if (op == Op::ReduceMean) {
    double count = static_cast<double>(numel(x.shape)) / static_cast<double>(out.size());
    for (double& v : out) v /= count;
  }
  return out;
}

Data matmul(const Arg& a, const Arg& b, const Shape& out_shape) {
  int ra = static_cast<int>(a.shape.size()), rb = static_cast<int>(b.shape.size());
  int64_t m = a.shape[ra - 2], k = a.shape[ra - 1], n = b.shape[rb - 1];
  Shape batch(out_shape.begin(), out_shape.end() - 2);
  Shape sa = broadcast_strides(Shape(a.shape.begin(), a.shape.end() - 2), batch);
  Shape sb = broadcast_strides(Shape(b.shape.begin(), b.shape.end() - 2), batch);
  Data out(numel(out_shape), 0.0);
  int64_t mat = 0;
  for_each_index(batch, [&](const Shape& idx) {
    const double* pa = a.data.data() + dot(idx, sa) * m * k;
    const double* pb = b.data.data() + dot(idx, sb) * k * n;
    double* po = out.data() + mat * m * n;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t p = 0; p < k; ++p) s += pa[i * k + p] * pb[p * n + j];
        po[i * n + j] = s;
      }
    ++mat;
  });
  return out;
}

// Every axis id is one loop; ids missing from `out` are summed.
Data einsum(const Arg& a, const Arg& b, const ir::Attrs& attrs, const Shape& out_shape) {
  const auto& lhs = attrs.get_ints("lhs");
  const auto& rhs = attrs.get_ints("rhs");
  const auto& out_ids = attrs.get_ints("out");
  std::vector<int64_t> ids(out_ids.begin(), out_ids.end());
  std::map<int64_t, int64_t> size;
  for (size_t i = 0; i < lhs.size(); ++i) size[lhs[i]] = a.shape[i];
  for (size_t i = 0; i < rhs.size(); ++i) size[rhs[i]] = b.shape[i];
  for (const auto& [id, s] : size)
    if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
  Shape loop, sa(ids.size(), 0), sb(ids.size(), 0), so(ids.size(), 0);
  Shape da = dense_strides(a.shape), db = dense_strides(b.shape), dout = dense_strides(out_shape);
  for (size_t l = 0; l < ids.size(); ++l) {
    loop.push_back(size[ids[l]]);
    for (size_t i = 0; i < lhs.size(); ++i)
      if (lhs[i] == ids[l]) sa[l] += da[i];
    for (size_t i = 0; i < rhs.size(); ++i)
      if (rhs[i] == ids[l]) sb[l] += db[i];
    for (size_t i = 0; i < out_ids.size(); ++i)
      if (out_ids[i] == ids[l]) so[l] += dout[i];
  }
  Data out(numel(out_shape), 0.0);
  for_each_index(loop, [&](const Shape& idx) { out[dot(idx, so)] += a.data[dot(idx, sa)] * b.data[dot(idx, sb)]; });
  return out;
}

// out[idx] = x[base + idx . strides]: permute, broadcast, slice, select.
Data gather_strided(const Arg& x, const Shape& out_shape, const Shape& strides, int64_t base) {
  Data out;
  out.reserve(numel(out_shape));
  for_each_index(out_shape, [&](const Shape& idx) { out.push_back(x.data[base + dot(idx, strides)]); });
  return out;
}

// Writes x into `out` (dense, shape out_shape) shifted by `shift` along axis.
void place(const Arg& x, Data& out, const Shape& out_shape, int64_t axis, int64_t shift) {
  Shape od = dense_strides(out_shape), xd = dense_strides(x.shape);
  for_each_index(x.shape, [&](const Shape& idx) { out[dot(idx, od) + shift * od[axis]] = x.data[dot(idx, xd)]; });
}

}  // namespace

Data eval_node(const ir::Node& n, const std::vector<Arg>& in, const OutType& out) {
  const ir::Attrs& a = n.attrs;
  switch (n.op) {
    case Op::Constant: return {a.get_double("value")};
    case Op::Iota: {
      Data d(a.get_int("n"));
      for (size_t i = 0; i < d.size(); ++i) d[i] = static_cast<double>(i);
      return d;
    }
    case Op::Neg:
    case Op::Exp:
    case Op::Log:
    case Op::Sqrt:
    case Op::Rsqrt:
    case Op::Abs:
    case Op::Tanh:
    case Op::Relu:
    case Op::Gelu:
    case Op::Sigmoid:
    case Op::Silu:
    case Op::Sin:
    case Op::Cos:
    case Op::Cast:
    case Op::Triu:
    case Op::CausalMask:
    case Op::Dropout:
    case Op::Add:
    case Op::Sub:
    case Op::Mul:
    case Op::Div:
    case Op::Pow:
    case Op::Maximum:
    case Op::Minimum:
    case Op::Less:
    case Op::LessEqual:
    case Op::Greater:
    case Op::GreaterEqual:
    case Op::Equal:
    case Op::NotEqual:
    case Op::Where:
    case Op::GeluGrad: return elementwise(n, in, out);
    case Op::ReduceSum:
    case Op::ReduceMean:
    case Op::ReduceMax:
    case Op::ReduceMin: return reduce(n.op, in[0], a.get_ints("axes"), a.get_int("keepdims") != 0, out.shape);
    case Op::MatMul: return matmul(in[0], in[1], out.shape);
    case Op::Einsum: return einsum(in[0], in[1], a, out.shape);
    case Op::Reshape:
    case Op::Copy: return in[0].data;  // row-major order is unchanged
    case Op::Permute: {
      const auto& perm = a.get_ints("perm");
      Shape dense = dense_strides(in[0].shape), strides;
      for (int64_t p : perm) strides.push_back(dense[p]);
      return gather_strided(in[0], out.shape, strides, 0);
    }
    case Op::Broadcast: return gather_strided(in[0], out.shape, broadcast_strides(in[0].shape, out.shape), 0);
    case Op::Slice: {
      int64_t axis = a.get_int("axis");
      Shape dense = dense_strides(in[0].shape);
      return gather_strided(in[0], out.shape, dense, a.get_int("start") * dense[axis]);
    }
    case Op::Select: {
      int64_t axis = a.get_int("axis");
      Shape strides = dense_strides(in[0].shape);
      int64_t base = a.get_int("index") * strides[axis];
      strides.erase(strides.begin() + axis);
      return gather_strided(in[0], out.shape, strides, base);
    }
    case Op::Concat: {
      int64_t axis = a.get_int("axis"), shift = 0;
      Data d(numel(out.shape), 0.0);
      for (const Arg& x : in) {
        place(x, d, out.shape, axis, shift);
        shift += x.shape[axis];
      }
      return d;
    }
    case Op::Pad: {
      Data d(numel(out.shape), 0.0);
      place(in[0], d, out.shape, a.get_int("axis"), a.get_int("before"));
      return d;
    }
    case Op::Embedding: return embedding(n, in[0], in[1]);
    case Op::Softmax: return softmax(in[0], a.get_int("axis"), false);
    case Op::LogSoftmax: return softmax(in[0], a.get_int("axis"), true);
    case Op::LayerNorm: return layernorm(in[0], in[1], in[2], a.get_double("eps"));
    case Op::RMSNorm: return rmsnorm(in[0], in[1], a.get_double("eps"));
    case Op::CrossEntropy: return cross_entropy(n, in[0], in[1]);
    case Op::MSE: return mse(in[0], in[1]);
    case Op::SoftmaxGrad: return softmax_grad(in[0], in[1], a.get_int("axis"));
    case Op::LayerNormGrad: return layernorm_grad(in[0], in[1], in[2], a.get_double("eps"));
    case Op::RMSNormGrad: return rmsnorm_grad(in[0], in[1], in[2], a.get_double("eps"));
    case Op::NormGainGrad: return norm_gain_grad(in[0], in[1], a.get_double("eps"), a.get_int("centered") != 0);
    case Op::CrossEntropyGrad: return cross_entropy_grad(n, in[0], in[1], in[2]);
    case Op::EmbeddingGrad: return embedding_grad(n, in[0], in[1], a.get_int("vocab"));
  }
  fail(n, "unknown op");
}

}  // namespace napkin::interp::detail
