// Elementwise, reduction, contraction and data-movement kernels, and the one
// switch over every loop kind (ir/loop.h; no default: -Werror=switch flags a
// new kind here).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "interp/kernels.h"
#include "interp/rounding.h"
#include "ir/builder.h"
#include "ir/rng.h"
#include "runtime/rng.h"

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
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

template <typename F>
Data map_unary(const Arg& x, F f) {
  Data out(x.data.size());
  for (size_t i = 0; i < out.size(); ++i) out[i] = f(x.data[i]);
  return out;
}

// out[idx] = f(a[idx'], b[idx'], ...) over the broadcast output shape.
template <typename F>
Data map_broadcast(const std::vector<Arg>& in, const Shape& out_shape, F f) {
  std::vector<Shape> strides;
  for (const Arg& a : in) strides.push_back(broadcast_strides(a.shape, out_shape));
  Data out;
  out.reserve(numel(out_shape));
  std::vector<double> vals(in.size());
  for_each_index(out_shape, [&](const Shape& idx) {
    for (size_t k = 0; k < in.size(); ++k) vals[k] = in[k].data[dot(idx, strides[k])];
    out.push_back(f(vals));
  });
  return out;
}

double nan_max(double a, double b) { return std::isnan(a) || std::isnan(b) ? kNaN : std::max(a, b); }
double nan_min(double a, double b) { return std::isnan(a) || std::isnan(b) ? kNaN : std::min(a, b); }

Data cast(const Arg& x, DType to) {
  // To an integer or bool: toward zero (NaN -> 0, saturating) or != 0, as
  // round_to_dtype defines it. To a floating dtype: the driver rounds
  // (Native) or keeps the value (Float64).
  if (!ir::is_floating(to)) return map_unary(x, [&](double v) { return round_to_dtype(v, to); });
  return x.data;
}

Data binary(const ir::Node& n, const std::vector<Arg>& in, const Shape& out_shape) {
  bool integer = ir::is_integer(in[0].dtype);
  auto bin = [&](auto f) {
    return map_broadcast(in, out_shape, [&](const std::vector<double>& v) { return f(v[0], v[1]); });
  };
  switch (n.op) {
    case Op::Add: return bin([](double a, double b) { return a + b; });
    case Op::Sub: return bin([](double a, double b) { return a - b; });
    case Op::Mul: return bin([](double a, double b) { return a * b; });
    case Op::Div:
      if (integer)  // C++ integer division: truncates toward zero
        return bin([&](double a, double b) {
          if (b == 0) fail(n, fmt::format("integer division of {} by zero", a));
          return static_cast<double>(static_cast<int64_t>(a) / static_cast<int64_t>(b));
        });
      return bin([](double a, double b) { return a / b; });
    case Op::Pow: return bin([](double a, double b) { return std::pow(a, b); });
    case Op::Maximum: return bin(nan_max);
    case Op::Minimum: return bin(nan_min);
    case Op::Less: return bin([](double a, double b) { return a < b ? 1.0 : 0.0; });
    case Op::LessEqual: return bin([](double a, double b) { return a <= b ? 1.0 : 0.0; });
    case Op::Greater: return bin([](double a, double b) { return a > b ? 1.0 : 0.0; });
    case Op::GreaterEqual: return bin([](double a, double b) { return a >= b ? 1.0 : 0.0; });
    case Op::Equal: return bin([](double a, double b) { return a == b ? 1.0 : 0.0; });
    case Op::NotEqual: return bin([](double a, double b) { return a != b ? 1.0 : 0.0; });
    default: fail(n, "not a binary op");
  }
}

// Keep elements by their (row, column) in the last two axes.
template <typename F>
Data by_row_col(const Arg& x, F f) {
  int r = static_cast<int>(x.shape.size());
  int64_t rows = x.shape[r - 2], cols = x.shape[r - 1];
  Data out(x.data.size());
  for (size_t flat = 0; flat < out.size(); ++flat) {
    int64_t j = static_cast<int64_t>(flat) % cols;
    int64_t i = (static_cast<int64_t>(flat) / cols) % rows;
    out[flat] = f(x.data[flat], i, j);
  }
  return out;
}

// ir/rng.h's definition, element by element (the rng words are whole numbers).
Data dropout(const Arg& x, const std::vector<Arg>& in, const ir::Attrs& a) {
  auto word = [&](int i) { return static_cast<int64_t>(in[i].data.at(0)); };
  if (word(1 + ir::kRngTraining) == 0) return x.data;
  double p = a.get_double("p");
  const uint32_t threshold = ir::dropout_threshold(p);
  const double scale = ir::dropout_scale(p, x.dtype);
  const auto seed_lo = static_cast<uint32_t>(word(1 + ir::kRngSeedLow));
  const auto seed_hi = static_cast<uint32_t>(word(1 + ir::kRngSeedHigh));
  const auto step = static_cast<uint64_t>(word(1 + ir::kRngStep));
  const auto stream = static_cast<uint32_t>(a.get_int("stream"));
  Data out(x.data.size());
  for (size_t i = 0; i < out.size(); ++i) {
    uint32_t r = runtime::philox4x32_10(
        {static_cast<uint32_t>(i), stream, static_cast<uint32_t>(step), static_cast<uint32_t>(step >> 32)},
        {seed_lo, seed_hi})[0];
    out[i] = r >= threshold ? x.data[i] * scale : 0.0;
  }
  return out;
}

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

Data rows(const ir::Node& n, const ir::RowParams& p, const std::vector<Arg>& in) {
  switch (p.variant) {
    case ir::RowVariant::Softmax: return softmax(in[0], p.axis, false);
    case ir::RowVariant::LogSoftmax: return softmax(in[0], p.axis, true);
    case ir::RowVariant::SoftmaxGrad: return softmax_grad(in[0], in[1], p.axis);
    case ir::RowVariant::CrossEntropy: return cross_entropy(n, in[0], in[1]);
    case ir::RowVariant::CrossEntropyGrad: return cross_entropy_grad(n, in[0], in[1], in[2]);
    case ir::RowVariant::Norm: return p.centered ? layernorm(in[0], in[1], in[2], p.eps) : rmsnorm(in[0], in[1], p.eps);
    case ir::RowVariant::NormGrad:
      return p.centered ? layernorm_grad(in[0], in[1], in[2], p.eps) : rmsnorm_grad(in[0], in[1], in[2], p.eps);
    case ir::RowVariant::NormGainGrad: return norm_gain_grad(in[0], in[1], p.eps, p.centered);
  }
  fail(n, "unknown row variant");
}

// The elementwise ops, one element at a time (broadcast where they broadcast).
Data elementwise(const ir::Node& n, const std::vector<Arg>& in, const OutType& out) {
  const ir::Attrs& a = n.attrs;
  switch (n.op) {
    case Op::Neg: return map_unary(in[0], [](double x) { return -x; });
    case Op::Exp: return map_unary(in[0], [](double x) { return std::exp(x); });
    case Op::Log: return map_unary(in[0], [](double x) { return std::log(x); });
    case Op::Sqrt: return map_unary(in[0], [](double x) { return std::sqrt(x); });
    case Op::Rsqrt: return map_unary(in[0], [](double x) { return 1.0 / std::sqrt(x); });
    case Op::Abs: return map_unary(in[0], [](double x) { return std::fabs(x); });
    case Op::Tanh: return map_unary(in[0], [](double x) { return std::tanh(x); });
    case Op::Relu: return map_unary(in[0], [](double x) { return std::isnan(x) ? x : x > 0 ? x : 0.0; });
    case Op::Gelu: {
      bool tanh_form = a.get_string("approximate") == "tanh";
      return map_unary(in[0], [&](double x) { return gelu(x, tanh_form); });
    }
    case Op::Sigmoid: return map_unary(in[0], [](double x) { return 1.0 / (1.0 + std::exp(-x)); });
    case Op::Silu: return map_unary(in[0], [](double x) { return x / (1.0 + std::exp(-x)); });
    case Op::Sin: return map_unary(in[0], [](double x) { return std::sin(x); });
    case Op::Cos: return map_unary(in[0], [](double x) { return std::cos(x); });
    case Op::Cast: return cast(in[0], out.dtype);
    case Op::Triu: {
      int64_t k = a.get_int("k");
      return by_row_col(in[0], [&](double x, int64_t i, int64_t j) { return j - i >= k ? x : 0.0; });
    }
    case Op::CausalMask:
      return by_row_col(in[0], [](double x, int64_t i, int64_t j) { return j > i ? -kInf : x; });
    case Op::Dropout: return dropout(in[0], in, a);
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
    case Op::NotEqual: return binary(n, in, out.shape);
    case Op::Where:
      return map_broadcast(in, out.shape, [](const std::vector<double>& v) { return v[0] != 0 ? v[1] : v[2]; });
    case Op::Copy: return in[0].data;  // row-major order is unchanged
    case Op::GeluGrad: {
      bool tanh_form = a.get_string("approximate") == "tanh";
      Data d(in[0].data.size());
      for (size_t i = 0; i < d.size(); ++i) d[i] = gelu_derivative(in[0].data[i], tanh_form) * in[1].data[i];
      return d;
    }
    default: fail(n, "not an elementwise op");
  }
}

}  // namespace

Data eval_node(const ir::Node& n, const std::vector<Arg>& in, const OutType& out) {
  const ir::LoopParams params = ir::loop_params(n.op, n.attrs);
  switch (ir::op_info(n.op).loop) {
    case ir::LoopKind::View: return view(n, in[0], out.shape);
    case ir::LoopKind::Fill: {
      const auto& p = std::get<ir::FillParams>(params);
      if (p.pattern == ir::FillPattern::Constant) return {p.value};
      Data d(numel(out.shape));
      for (size_t i = 0; i < d.size(); ++i) d[i] = static_cast<double>(i);
      return d;
    }
    case ir::LoopKind::Elementwise: return elementwise(n, in, out);
    case ir::LoopKind::Reduction: return reduce(std::get<ir::ReductionParams>(params), in[0], out.shape);
    case ir::LoopKind::Contraction: {
      const auto& p = std::get<ir::ContractionParams>(params);
      return p.einsum ? einsum(in[0], in[1], p, out.shape) : matmul(in[0], in[1], out.shape);
    }
    case ir::LoopKind::Concat: return concat(std::get<ir::ConcatParams>(params), in, out.shape);
    case ir::LoopKind::Gather: return embedding(n, in[0], in[1]);
    case ir::LoopKind::ScatterAdd: return embedding_grad(n, in[0], in[1], out.shape[0]);
    case ir::LoopKind::Rows: return rows(n, std::get<ir::RowParams>(params), in);
    case ir::LoopKind::Mse: return mse(in[0], in[1]);
  }
  fail(n, "unknown loop kind");
}

}  // namespace napkin::interp::detail
