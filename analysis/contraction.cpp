#include "analysis/contraction.h"

#include <algorithm>
#include <utility>

#include "ir/internal_check.h"
#include "ir/loop.h"

namespace napkin::analysis {

namespace {

// A group of axes merged into one matrix dim: its size and its stride in the
// two operands that hold it.
struct Merged {
  int64_t size = 1, x = 0, y = 0;
};

// Sorts `group` outermost first (by stride in y, then x) and returns how many of
// its innermost axes merge into one dim in both x and y (at least 1 when the
// group is not empty).
template <typename StrideX, typename StrideY>
size_t mergeable_suffix(std::vector<ContractionAxis>& group, StrideX sx, StrideY sy) {
  std::sort(group.begin(), group.end(), [&](const ContractionAxis& p, const ContractionAxis& q) {
    return sy(p) != sy(q) ? sy(p) > sy(q) : sx(p) > sx(q);
  });
  size_t n = group.empty() ? 0 : 1;
  for (size_t i = group.size() - 1; i >= 1 && i < group.size(); --i) {
    const ContractionAxis& outer = group[i - 1];
    const ContractionAxis& inner = group[i];
    if (sx(outer) != sx(inner) * inner.size || sy(outer) != sy(inner) * inner.size) break;
    ++n;
  }
  return n;
}

template <typename StrideX, typename StrideY>
Merged merge(const std::vector<ContractionAxis>& axes, StrideX sx, StrideY sy) {
  Merged m;
  if (axes.empty()) return m;
  for (const ContractionAxis& a : axes) m.size *= a.size;
  m.x = sx(axes.back());
  m.y = sy(axes.back());
  return m;
}

bool unit_or_trivial(int64_t stride_1, int64_t size_1, int64_t stride_2, int64_t size_2) {
  return stride_1 == 1 || stride_2 == 1 || size_1 == 1 || size_2 == 1;
}

}  // namespace

std::vector<ContractionAxis> contraction_axes(const ir::Graph& g, const ir::Node& n, ir::ValueId out) {
  const ir::ContractionParams p = std::get<ir::ContractionParams>(ir::loop_params(n.op, n.attrs));
  const ir::Value &a = g.value(n.in(0)), &b = g.value(n.in(1)), &c = g.value(out);
  const std::vector<int64_t> as = a.type.sizes(), bs = b.type.sizes(), cs = c.type.sizes();
  const std::vector<int64_t> &at = a.layout.strides, &bt = b.layout.strides, &ct = c.layout.strides;
  std::vector<ContractionAxis> axes;
  if (p.einsum) {
    int64_t max_id = 0;
    for (const auto* ids : {&p.lhs, &p.rhs, &p.out})
      for (int64_t id : *ids) max_id = std::max(max_id, id);
    axes.resize(max_id + 1);
    // An id repeated within one operand (a diagonal) adds its strides.
    for (size_t i = 0; i < p.lhs.size(); ++i) axes[p.lhs[i]].size = as[i], axes[p.lhs[i]].a += at[i];
    for (size_t i = 0; i < p.rhs.size(); ++i) axes[p.rhs[i]].size = bs[i], axes[p.rhs[i]].b += bt[i];
    for (size_t i = 0; i < p.out.size(); ++i) axes[p.out[i]].size = cs[i], axes[p.out[i]].c += ct[i];
    return axes;
  }
  // matmul: (..., m, k) @ (..., k, n) -> (..., m, n); batch dims broadcast
  // (aligned from the right; a missing or size-1 dim has stride 0).
  const int ra = static_cast<int>(as.size()), rb = static_cast<int>(bs.size()), rc = static_cast<int>(cs.size());
  NAPKIN_INTERNAL_CHECK(ra >= 2 && rb >= 2, "matmul operands below rank 2");
  for (int d = 0; d < rc - 2; ++d) {
    ContractionAxis ax;
    ax.size = cs[d];
    ax.c = ct[d];
    const int da = d - (rc - ra), db = d - (rc - rb);
    if (da >= 0 && as[da] == ax.size) ax.a = at[da];
    if (db >= 0 && bs[db] == ax.size) ax.b = bt[db];
    axes.push_back(ax);
  }
  axes.push_back({cs[rc - 2], at[ra - 2], 0, ct[rc - 2]});  // m
  axes.push_back({cs[rc - 1], 0, bt[rb - 1], ct[rc - 1]});  // n
  axes.push_back({as[ra - 1], at[ra - 1], bt[rb - 2], 0});  // k
  return axes;
}

std::optional<MatmulLowering> lower_to_gemm(const std::vector<ContractionAxis>& all_axes) {
  std::vector<ContractionAxis> batch, m_axes, n_axes, k_axes;
  for (const ContractionAxis& ax : all_axes) {
    if (ax.size == 1) continue;
    bool in_a = ax.a != 0, in_b = ax.b != 0, in_c = ax.c != 0;
    if (in_c && in_a == in_b) batch.push_back(ax);
    else if (in_c && in_a) m_axes.push_back(ax);
    else if (in_c) n_axes.push_back(ax);
    else if (in_a && in_b) k_axes.push_back(ax);
    else return std::nullopt;  // summed over one input only (or over nothing)
  }
  auto sa = [](const ContractionAxis& x) { return x.a; };
  auto sb = [](const ContractionAxis& x) { return x.b; };
  auto sc = [](const ContractionAxis& x) { return x.c; };

  // K must merge in A and B whole.
  if (mergeable_suffix(k_axes, sb, sa) != k_axes.size()) return std::nullopt;
  // M (N) axes that do not merge with the innermost ones become batch axes.
  auto split_off = [&](std::vector<ContractionAxis>& group, auto sx) {
    size_t keep = mergeable_suffix(group, sx, sc);
    batch.insert(batch.end(), group.begin(), group.end() - static_cast<std::ptrdiff_t>(keep));
    group.erase(group.begin(), group.end() - static_cast<std::ptrdiff_t>(keep));
  };
  split_off(m_axes, sa);
  split_off(n_axes, sb);

  Merged m = merge(m_axes, sa, sc), n = merge(n_axes, sb, sc), k = merge(k_axes, sa, sb);
  MatmulLowering g;
  // C's unit stride must be N's; otherwise compute C^T = B^T A^T.
  if (n.size > 1 && n.y != 1 && m.size > 1 && m.y == 1) {
    std::swap(m, n);
    std::swap(k.x, k.y);
    g.swap_operands = true;
  }
  if (n.size > 1 && n.y != 1) return std::nullopt;
  g.m = m.size;
  g.n = n.size;
  g.k = k.size;
  g.a_m_stride = m.x;
  g.a_k_stride = k.size > 1 ? k.x : 1;
  g.b_k_stride = k.size > 1 ? k.y : 1;
  g.b_n_stride = n.size > 1 ? n.x : 1;
  g.c_m_stride = m.size > 1 ? m.y : 0;
  if (g.m == 1) g.a_m_stride = 0;
  if (g.n == 1) g.b_n_stride = 1;
  if (!unit_or_trivial(g.a_m_stride, g.m, g.a_k_stride, g.k)) return std::nullopt;
  if (!unit_or_trivial(g.b_k_stride, g.k, g.b_n_stride, g.n)) return std::nullopt;

  std::sort(batch.begin(), batch.end(), [](const ContractionAxis& p, const ContractionAxis& q) { return p.c > q.c; });
  for (const ContractionAxis& ax : batch) {
    g.batch.push_back(ax.size);
    g.a_batch_stride.push_back(g.swap_operands ? ax.b : ax.a);
    g.b_batch_stride.push_back(g.swap_operands ? ax.a : ax.b);
    g.c_batch_stride.push_back(ax.c);
  }
  return g;
}

bool gemm_takes(ir::DType a, ir::DType b, ir::DType c) {
  using ir::DType;
  auto gemm_float = [](DType t) { return t == DType::F32 || t == DType::F64 || t == DType::BF16 || t == DType::F16; };
  if (!gemm_float(a) || !gemm_float(b)) return false;
  NAPKIN_INTERNAL_CHECK(a == b, "a contraction of {} by {}: its inputs must share one dtype",
                        ir::dtype_name(a), ir::dtype_name(b));
  return c == a || ((a == DType::BF16 || a == DType::F16) && c == DType::F32);
}

}  // namespace napkin::analysis
