#include "ir/gemm_epilogue.h"

#include <algorithm>

#include "ir/loop.h"

namespace napkin::ir {

bool gemm_with_epilogue_shape(const Graph& g, const Node& c) {
  if (c.op != Op::MatMul && c.op != Op::Einsum) return false;
  const Value& a = g.value(c.in(0));
  const Value& b = g.value(c.in(1));
  const std::vector<int64_t> out = g.value(c.out()).type.sizes();
  if (b.type.rank() != 2 || out.size() < 2) return false;
  // The output dims in the first input: for each, the input dim it is (-1: none).
  std::vector<int> from_a;
  if (c.op == Op::MatMul) {
    if (a.type.rank() != static_cast<int>(out.size())) return false;
    for (size_t d = 0; d + 1 < out.size(); ++d) from_a.push_back(static_cast<int>(d));
  } else {
    const auto p = std::get<ContractionParams>(loop_params(c.op, c.attrs));
    auto count = [](const std::vector<int64_t>& ids, int64_t id) { return std::count(ids.begin(), ids.end(), id); };
    const int64_t n_id = p.out.back();
    if (count(p.rhs, n_id) != 1 || count(p.lhs, n_id) != 0 || count(p.out, n_id) != 1) return false;
    for (size_t d = 0; d + 1 < p.out.size(); ++d) {
      const int64_t id = p.out[d];
      if (count(p.rhs, id) != 0 || count(p.lhs, id) != 1 || count(p.out, id) != 1) return false;
      from_a.push_back(static_cast<int>(std::find(p.lhs.begin(), p.lhs.end(), id) - p.lhs.begin()));
    }
    for (int64_t id : p.rhs)  // the other rhs id is summed, with an lhs id
      if (id != n_id && count(p.lhs, id) != 1) return false;
  }
  // The rows: dims of A in order whose strides merge into one.
  for (size_t d = 0; d + 1 < from_a.size(); ++d) {
    const int x = from_a[d], y = from_a[d + 1];
    if (y != x + 1) return false;
    if (a.type.sizes()[x] > 1 && a.layout.strides[x] != a.layout.strides[y] * a.type.sizes()[y]) return false;
  }
  return true;
}

std::optional<GemmEpilogue> match_gemm_epilogue(const Graph& g, NodeId contraction, ValueId acc_value,
                                                const std::vector<NodeId>& steps) {
  const Node& c = g.node(contraction);
  if (steps.empty() || !gemm_with_epilogue_shape(g, c)) return std::nullopt;
  const TensorType& acc = g.value(acc_value).type;
  if (acc.dtype != DType::F32 || !acc.same_shape(g.value(c.out()).type)) return std::nullopt;
  GemmEpilogue e;
  e.contraction = contraction;
  e.steps = steps;
  ValueId running = acc_value;
  // Stage: 0 before the residual, 1 after it, 2 after the bias.
  int stage = 0;
  for (size_t i = 0; i < steps.size(); ++i) {
    const Node& s = g.node(steps[i]);
    if (s.phase != c.phase || s.outputs.size() != 1) return std::nullopt;
    const TensorType& t = g.value(s.out()).type;
    if (!t.same_shape(acc)) return std::nullopt;
    if (s.op == Op::Cast) {
      if (i + 1 != steps.size() || s.in(0) != running) return std::nullopt;
      if (t.dtype != DType::BF16 && t.dtype != DType::F16) return std::nullopt;
    } else if (s.op == Op::Add && s.inputs.size() == 2 && t.dtype == DType::F32) {
      int side = s.in(0) == running ? 1 : s.in(1) == running ? 0 : -1;
      if (side < 0 || s.in(0) == s.in(1)) return std::nullopt;
      const Value& other = g.value(s.in(side));
      if (other.type.dtype != DType::F32) return std::nullopt;
      const std::vector<int64_t> sizes = other.type.sizes();
      if (other.type.same_shape(acc) && is_contiguous(other.layout, sizes) && stage == 0) {
        e.residual = s.in(side);
        stage = 1;
      } else if (sizes.size() == 1 && sizes[0] == acc.sizes().back() && is_contiguous(other.layout, sizes) && stage < 2) {
        e.bias = s.in(side);
        stage = 2;
      } else {
        return std::nullopt;
      }
    } else {
      return std::nullopt;
    }
    running = s.out();
  }
  e.result = running;
  e.out = g.value(running).type.dtype;
  // cuBLASLt's C has D's type: a residual under a narrowing cast is not the form.
  if (e.residual != kNoValue && e.out != DType::F32) return std::nullopt;
  return e;
}

}  // namespace napkin::ir
