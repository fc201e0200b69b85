// Elementwise, reduction, contraction and data-movement kernels, and the one
// switch over every loop kind (ir/loop.h; no default: -Werror=switch flags a
// new kind here).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "interp/float64_arithmetic.h"
#include "interp/kernels.h"
#include "ir/builder.h"

namespace napkin::interp::detail {

using ir::DType;
using ir::Op;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

Data reduce(const ir::ReductionParams& p, const Arg& x, const Shape& out_shape) {
  const std::vector<int64_t>& axes = p.axes;
  int rank = static_cast<int>(x.shape.size());
  Shape out_dense = dense_strides(out_shape);
  Shape to_out(rank, 0);  // stride in the output of each input axis (0 if reduced)
  for (int d = 0, o = 0; d < rank; ++d) {
    bool reduced = std::find(axes.begin(), axes.end(), d) != axes.end();
    if (!reduced) to_out[d] = out_dense[o];
    if (!reduced || p.keepdims) ++o;
  }
  double init = 0.0;
  switch (p.combiner) {
    case ir::Combiner::Sum: break;
    case ir::Combiner::Max: init = -kInf; break;
    case ir::Combiner::Min: init = kInf; break;
  }
  Data out(numel(out_shape), init);
  Shape x_dense = dense_strides(x.shape);
  for_each_index(x.shape, [&](const Shape& idx) {
    double v = x.data[dot(idx, x_dense)];
    double& acc = out[dot(idx, to_out)];
    switch (p.combiner) {
      case ir::Combiner::Sum: acc += v; break;
      case ir::Combiner::Max: acc = nan_max(acc, v); break;
      case ir::Combiner::Min: acc = nan_min(acc, v); break;
    }
  });
  if (p.mean) {
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
Data einsum(const Arg& a, const Arg& b, const ir::ContractionParams& p, const Shape& out_shape) {
  const auto& lhs = p.lhs;
  const auto& rhs = p.rhs;
  const auto& out_ids = p.out;
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

// out[idx] = x[base + idx . strides].
Data gather_strided(const Arg& x, const Shape& out_shape, const Shape& strides, int64_t base) {
  Data out;
  out.reserve(numel(out_shape));
  for_each_index(out_shape, [&](const Shape& idx) { out.push_back(x.data[base + dot(idx, strides)]); });
  return out;
}

// A view's elements, read from its dense input by the view's layout rule.
Data view(const ir::Node& n, const Arg& x, const Shape& out_shape) {
  const ir::Layout l = ir::view_layout(n.op, n.attrs, x.shape, ir::contiguous_layout(x.shape), out_shape);
  return gather_strided(x, out_shape, l.strides, l.offset);
}

// Writes x into `out` (dense, shape out_shape) shifted by `shift` along axis.
void place(const Arg& x, Data& out, const Shape& out_shape, int64_t axis, int64_t shift) {
  Shape od = dense_strides(out_shape), xd = dense_strides(x.shape);
  for_each_index(x.shape, [&](const Shape& idx) { out[dot(idx, od) + shift * od[axis]] = x.data[dot(idx, xd)]; });
}

Data concat(const ir::ConcatParams& p, const std::vector<Arg>& in, const Shape& out_shape) {
  Data d(numel(out_shape), 0.0);
  if (p.pad_before) {
    place(in[0], d, out_shape, p.axis, *p.pad_before);
    return d;
  }
  int64_t shift = 0;
  for (const Arg& x : in) {
    place(x, d, out_shape, p.axis, shift);
    shift += x.shape[p.axis];
  }
  return d;
}

// dy [..., d] summed over every row: [d].
Data sum_rows(const Arg& dy) {
  const int64_t d = dy.shape.empty() ? 1 : dy.shape.back();
  Data out(static_cast<size_t>(d), 0.0);
  for (size_t i = 0; i < dy.data.size(); ++i) out[i % static_cast<size_t>(d)] += dy.data[i];
  return out;
}

Data rows(const ir::Node& n, const ir::RowParams& p, const std::vector<Arg>& in) {
  switch (p.variant) {
    case ir::RowVariant::Softmax: return softmax(in[0], p.axis, false);
    case ir::RowVariant::LogSoftmax: return softmax(in[0], p.axis, true);
    case ir::RowVariant::SoftmaxGrad: return softmax_grad(in[0], in[1], p.axis);
    case ir::RowVariant::CrossEntropy: return cross_entropy(n, in[0], in[1]);
    case ir::RowVariant::CrossEntropyGrad: return cross_entropy_grad(n, in[0], in[1], in[2]);
    case ir::RowVariant::Norm: return p.centered ? layernorm(in[0], in[1], in[2], p.eps) : rmsnorm(in[0], in[1], p.eps);
    case ir::RowVariant::NormGrad: {
      Data dx = p.centered ? layernorm_grad(in[0], in[1], in[2], p.eps) : rmsnorm_grad(in[0], in[1], in[2], p.eps);
      if (in.size() > 3)  // the residual stream's gradient added as dx is stored
        for (size_t i = 0; i < dx.size(); ++i) dx[i] += in[3].data[i];
      return dx;
    }
  }
  fail(n, "unknown row variant");
}

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

}  // namespace

std::vector<Data> eval_node(const ir::Node& n, const std::vector<Arg>& in, const std::vector<OutType>& outs,
                            bool native) {
  const OutType& out = outs.at(0);
  auto one = [](Data d) {
    std::vector<Data> r;
    r.push_back(std::move(d));
    return r;
  };
  const ir::LoopParams params = ir::loop_params(n.op, n.attrs);
  switch (ir::op_info(n.op).loop) {
    case ir::LoopKind::View: return one(view(n, in[0], out.shape));
    case ir::LoopKind::Fill: {
      const auto& p = std::get<ir::FillParams>(params);
      if (p.pattern == ir::FillPattern::Constant) return one(Data{p.value});
      Data d(numel(out.shape));
      for (size_t i = 0; i < d.size(); ++i) d[i] = static_cast<double>(i);
      return one(d);
    }
    case ir::LoopKind::Elementwise: return one(elementwise(n, in, out));
    case ir::LoopKind::Reduction: return one(reduce(std::get<ir::ReductionParams>(params), in[0], out.shape));
    case ir::LoopKind::Contraction: {
      const auto& p = std::get<ir::ContractionParams>(params);
      return one(p.einsum ? einsum(in[0], in[1], p, out.shape) : matmul(in[0], in[1], out.shape));
    }
    case ir::LoopKind::Concat: return one(concat(std::get<ir::ConcatParams>(params), in, out.shape));
    case ir::LoopKind::Gather: return one(embedding(n, in[0], in[1]));
    case ir::LoopKind::ScatterAdd:
      return one(embedding_grad(n, in[0], in[1], out.shape[0], in.size() > 2 ? &in[2] : nullptr));
    case ir::LoopKind::Rows: {
      const auto& p = std::get<ir::RowParams>(params);
      std::vector<Data> r = one(rows(n, p, in));
      if (p.variant == ir::RowVariant::NormGrad && p.gains) {
        r.push_back(norm_gain_grad(in[0], in[2], p.eps, p.centered));
        if (p.centered) r.push_back(sum_rows(in[2]));
      }
      return r;
    }
    case ir::LoopKind::Mse: return one(mse(in[0], in[1]));
    case ir::LoopKind::Attention: {
      const auto& p = std::get<ir::AttentionParams>(params);
      return p.backward ? attention_grad(p, in) : attention(p, in);
    }
    case ir::LoopKind::CachedAttention:
      return cached_attention(n, std::get<ir::CachedAttentionParams>(params), in);
    case ir::LoopKind::Rope: return one(rope(std::get<ir::RopeParams>(params), in[0], in.size() > 1 ? &in[1] : nullptr));
    // One process is a job of one rank: the sum over its ranks is its value.
    case ir::LoopKind::Collective: return one(in[0].data);
    case ir::LoopKind::TopK: return top_k(std::get<ir::TopKParams>(params), in[0]);
    case ir::LoopKind::MoeSlots: return moe_slots(n, std::get<ir::MoeSlotsParams>(params), in[0]);
    case ir::LoopKind::Classifier:
      return std::get<ir::ClassifierParams>(params).backward ? linear_cross_entropy_grad(n, in, native)
                                                            : linear_cross_entropy(n, in, native);
  }
  fail(n, "unknown loop kind");
}

}  // namespace napkin::interp::detail
