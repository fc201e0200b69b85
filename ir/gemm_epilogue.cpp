#include "ir/gemm_epilogue.h"

#include <algorithm>

#include "ir/loop.h"

namespace napkin::ir {

bool gemm_with_epilogue_shape(const Graph& g, const Node& c) {
  if (c.op != Op::MatMul && c.op != Op::Einsum) return false;
  if (c.in(0) == c.in(1)) return false;  // A and B are the kernel's inputs 0 and 1
  const Value& a = g.value(c.in(0));
  const Value& b = g.value(c.in(1));
  const std::vector<int64_t> out = g.value(c.out()).type.sizes();
  if (b.type.rank() != 2 || out.size() < 2) return false;
  // For each output dim but the last, the dim of A it is; and A's summed dim, B's summed and n dims.
  std::vector<int> from_a;
  int a_k = -1, b_k = -1, b_n = -1;
  if (c.op == Op::MatMul) {
    if (a.type.rank() != static_cast<int>(out.size())) return false;
    for (size_t d = 0; d + 1 < out.size(); ++d) from_a.push_back(static_cast<int>(d));
    a_k = a.type.rank() - 1, b_k = 0, b_n = 1;
  } else {
    const auto p = std::get<ContractionParams>(loop_params(c.op, c.attrs));
    auto count = [](const std::vector<int64_t>& ids, int64_t id) { return std::count(ids.begin(), ids.end(), id); };
    auto at = [](const std::vector<int64_t>& ids, int64_t id) {
      return static_cast<int>(std::find(ids.begin(), ids.end(), id) - ids.begin());
    };
    const int64_t n_id = p.out.back();
    if (count(p.rhs, n_id) != 1 || count(p.lhs, n_id) != 0 || count(p.out, n_id) != 1) return false;
    for (size_t d = 0; d + 1 < p.out.size(); ++d) {
      const int64_t id = p.out[d];
      if (count(p.rhs, id) != 0 || count(p.lhs, id) != 1 || count(p.out, id) != 1) return false;
      from_a.push_back(at(p.lhs, id));
    }
    // A is the rows and one summed dim, which B's other dim is.
    if (p.lhs.size() != from_a.size() + 1) return false;
    const int64_t k_id = p.rhs[0] == n_id ? p.rhs[1] : p.rhs[0];
    if (k_id == n_id || count(p.lhs, k_id) != 1 || count(p.out, k_id) != 0) return false;
    a_k = at(p.lhs, k_id), b_k = at(p.rhs, k_id), b_n = at(p.rhs, n_id);
  }
  // The rows: dims of A in order whose strides merge into one.
  const std::vector<int64_t> as = a.type.sizes(), bs = b.type.sizes();
  for (size_t d = 0; d + 1 < from_a.size(); ++d) {
    const int x = from_a[d], y = from_a[d + 1];
    if (y != x + 1) return false;
    if (as[x] > 1 && a.layout.strides[x] != a.layout.strides[y] * as[y]) return false;
  }
  // A GEMM library takes A and B each with a unit stride along one of its two dims (a size-1 dim has any).
  auto unit = [](int64_t size, int64_t stride) { return size <= 1 || stride == 1; };
  const int a_rows = from_a.back();
  if (!unit(as[a_k], a.layout.strides[a_k]) && !unit(as[a_rows], a.layout.strides[a_rows])) return false;
  if (!unit(bs[b_k], b.layout.strides[b_k]) && !unit(bs[b_n], b.layout.strides[b_n])) return false;
  return true;
}

std::optional<GemmEpilogue> match_gemm_epilogue(const Graph& g, NodeId contraction, ValueId acc_value,
                                                const std::vector<NodeId>& steps) {
  const Node& c = g.node(contraction);
  if (steps.empty() || !gemm_with_epilogue_shape(g, c)) return std::nullopt;
  const TensorType& acc = g.value(acc_value).type;
  if (acc.dtype != DType::F32 || !acc.same_shape(g.value(c.out()).type)) return std::nullopt;
  const DType operands = g.value(c.in(0)).type.dtype;
  const int64_t n = acc.sizes().back();
  GemmEpilogue e;
  e.contraction = contraction;
  e.steps = steps;
  auto narrow = [](DType t) { return t == DType::BF16 || t == DType::F16; };
  auto full = [&](const Value& v) { return v.type.same_shape(acc) && is_contiguous(v.layout, v.type.sizes()); };
  auto tanh_gelu = [](const Node& s) {
    return s.attrs.has("approximate") && s.attrs.get_string("approximate") == "tanh";
  };
  ValueId running = acc_value;
  ValueId pre_activation = kNoValue;  // what the gelu reads: the aux a forward stores
  ValueId widened_aux = kNoValue;     // the aux a gelu gradient reads, widened to f32
  bool aux_before_d = false;          // the aux cast came before D's narrowing cast
  // Stage: 0 before the residual, 1 after it, 2 after the bias, 3 after the
  // activation, 4 after the final cast.
  int stage = 0;
  for (const NodeId id : steps) {
    const Node& s = g.node(id);
    if (s.phase != c.phase || s.outputs.size() != 1) return std::nullopt;
    const TensorType& t = g.value(s.out()).type;
    if (!t.same_shape(acc)) return std::nullopt;
    if (s.op == Op::Cast && s.in(0) == running && stage < 4 && narrow(t.dtype)) {
      stage = 4;  // D narrower than the sums
    } else if (s.op == Op::Cast && pre_activation != kNoValue && s.in(0) == pre_activation && e.aux == kNoValue &&
               narrow(t.dtype)) {
      e.aux = s.out();  // the forward stores the gelu's input for its gradient
      aux_before_d = stage < 4;
      continue;
    } else if (s.op == Op::Cast && stage == 0 && widened_aux == kNoValue && t.dtype == DType::F32 &&
               narrow(g.value(s.in(0)).type.dtype) && full(g.value(s.in(0))) && s.in(0) != running) {
      e.aux = s.in(0);  // the stored gelu input a gradient reads
      widened_aux = s.out();
      continue;
    } else if (s.op == Op::Add && s.inputs.size() == 2 && t.dtype == DType::F32 && stage < 2 && widened_aux == kNoValue) {
      int side = s.in(0) == running ? 1 : s.in(1) == running ? 0 : -1;
      if (side < 0 || s.in(0) == s.in(1)) return std::nullopt;
      const Value& other = g.value(s.in(side));
      if (other.type.dtype != DType::F32) return std::nullopt;
      const std::vector<int64_t> sizes = other.type.sizes();
      if (full(other) && stage == 0) {
        e.residual = s.in(side);
        stage = 1;
      } else if (sizes.size() == 1 && sizes[0] == n && is_contiguous(other.layout, sizes)) {
        e.bias = s.in(side);
        stage = 2;
      } else {
        return std::nullopt;
      }
    } else if (s.op == Op::Gelu && s.in(0) == running && stage < 3 && t.dtype == DType::F32 && tanh_gelu(s) &&
               widened_aux == kNoValue) {
      e.activation = GemmActivation::Gelu;
      pre_activation = running;
      stage = 3;
    } else if (s.op == Op::GeluGrad && stage == 0 && widened_aux != kNoValue && s.in(0) == widened_aux &&
               s.in(1) == running && t.dtype == DType::F32 && tanh_gelu(s)) {
      e.activation = GemmActivation::GeluGrad;
      stage = 3;
    } else {
      return std::nullopt;
    }
    running = s.out();
  }
  e.result = running;
  e.out = g.value(running).type.dtype;
  // D narrower than the sums only in the operands' own type (cuBLASLt: bf16 x bf16 -> bf16, f16 -> f16).
  if (e.out != DType::F32 && e.out != operands) return std::nullopt;
  // The epilogue's operands are not the product's (the CPU emitter and cuBLASLt read A and B as the GEMM's only).
  for (ValueId v : {e.residual, e.bias, e.aux})
    if (v != kNoValue && (v == c.in(0) || v == c.in(1))) return std::nullopt;
  // The kernel stores D first, then the aux (codegen/plan.h): a narrowing cast of D after the aux's is not the form.
  if (aux_before_d && e.out != DType::F32) return std::nullopt;
  // cuBLASLt's C has D's type: a residual under a narrowing cast is not the form.
  if (e.residual != kNoValue && e.out != DType::F32) return std::nullopt;
  // A widened aux that no gelu gradient read, or a gradient without its aux: not the form.
  if ((widened_aux != kNoValue) != (e.activation == GemmActivation::GeluGrad)) return std::nullopt;
  // cuBLASLt's aux: D's type, and its rows (napkin's n) a multiple of 8 apart.
  if (e.aux != kNoValue && (g.value(e.aux).type.dtype != e.out || n % 8 != 0)) return std::nullopt;
  return e;
}

std::optional<GemmBiasGrad> match_gemm_bias_grad(const Graph& g, NodeId contraction, NodeId reduction) {
  const Node& c = g.node(contraction);
  const Node& r = g.node(reduction);
  if ((c.op != Op::MatMul && c.op != Op::Einsum) || r.op != Op::ReduceSum) return std::nullopt;
  if (c.phase != r.phase || c.outputs.size() != 1 || r.outputs.size() != 1 || r.inputs.size() != 1) return std::nullopt;
  if (c.in(0) == c.in(1) || r.in(0) != c.in(1)) return std::nullopt;
  const Value& a = g.value(c.in(0));
  const Value& b = g.value(c.in(1));
  const Value& d = g.value(c.out());
  const std::vector<int64_t> ds = d.type.sizes();
  if (ds.size() != 2 || d.type.dtype != DType::F32 || !is_contiguous(d.layout, ds)) return std::nullopt;
  // The axis ids of A, B and D (matmul: [m, k] @ [k, n]).
  std::vector<int64_t> lhs{0, 2}, rhs{2, 1}, out{0, 1};
  if (c.op == Op::MatMul) {
    if (a.type.rank() != 2 || b.type.rank() != 2) return std::nullopt;
  } else {
    const auto p = std::get<ContractionParams>(loop_params(c.op, c.attrs));
    lhs = p.lhs, rhs = p.rhs, out = p.out;
  }
  auto count = [](const std::vector<int64_t>& ids, int64_t id) { return std::count(ids.begin(), ids.end(), id); };
  const int64_t m_id = out[0], n_id = out[1];
  if (m_id == n_id || count(lhs, m_id) != 1 || count(rhs, m_id) != 0 || count(rhs, n_id) != 1 || count(lhs, n_id) != 0)
    return std::nullopt;
  // The k dims: every other dim of A and of B, once each, in one order in both.
  std::vector<int64_t> ka, kb;
  std::vector<int> pos_a, pos_b;
  for (size_t i = 0; i < lhs.size(); ++i)
    if (lhs[i] != m_id) ka.push_back(lhs[i]), pos_a.push_back(static_cast<int>(i));
  for (size_t i = 0; i < rhs.size(); ++i)
    if (rhs[i] != n_id) kb.push_back(rhs[i]), pos_b.push_back(static_cast<int>(i));
  if (ka.empty() || ka != kb) return std::nullopt;
  for (int64_t id : ka)
    if (count(lhs, id) != 1 || count(rhs, id) != 1 || count(out, id) != 0) return std::nullopt;
  // They merge into one stride in each operand (size-1 dims have any stride),
  // and the operand has a unit stride along k or along its own dim.
  auto gemm_operand = [](const Value& v, const std::vector<int>& k_dims, int own) {
    const std::vector<int64_t> sizes = v.type.sizes();
    const std::vector<int64_t>& strides = v.layout.strides;
    std::vector<int> k;
    for (int dim : k_dims)
      if (sizes[dim] > 1) k.push_back(dim);
    for (size_t i = 0; i + 1 < k.size(); ++i)
      if (strides[k[i + 1]] < 1 || strides[k[i]] != strides[k[i + 1]] * sizes[k[i + 1]]) return false;
    const bool k_unit = k.empty() || strides[k.back()] == 1;
    return k_unit || sizes[own] <= 1 || strides[own] == 1;
  };
  auto at = [](const std::vector<int64_t>& ids, int64_t id) {
    return static_cast<int>(std::find(ids.begin(), ids.end(), id) - ids.begin());
  };
  if (!gemm_operand(a, pos_a, at(lhs, m_id)) || !gemm_operand(b, pos_b, at(rhs, n_id))) return std::nullopt;
  // The reduction: B over exactly its k dims, into f32 [n].
  const auto rp = std::get<ReductionParams>(loop_params(r.op, r.attrs));
  if (rp.keepdims || rp.mean || rp.combiner != Combiner::Sum) return std::nullopt;
  std::vector<int> axes;
  for (int64_t axis : rp.axes) axes.push_back(static_cast<int>(axis < 0 ? axis + b.type.rank() : axis));
  std::sort(axes.begin(), axes.end());
  if (axes != pos_b) return std::nullopt;
  const Value& sums = g.value(r.out());
  if (sums.type.dtype != DType::F32 || sums.type.sizes() != std::vector<int64_t>{ds[1]} ||
      !is_contiguous(sums.layout, sums.type.sizes()))
    return std::nullopt;
  return GemmBiasGrad{contraction, reduction, c.in(1), r.out()};
}

}  // namespace napkin::ir
