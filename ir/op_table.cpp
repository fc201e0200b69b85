// The op table: one row per op in ops.def with its shape/dtype rule and cost rule.
// Shape rules return user-facing errors (the frontend attaches the YAML location);
// they name both dims and their sizes so the user can find the mismatch.
#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <map>
#include <numeric>

#include "ir/graph.h"
#include "ir/internal_check.h"
#include "ir/op.h"
#include "ir/rng.h"
#include "ir/rope.h"
#include "ir/vjp.h"

namespace napkin::ir {

namespace {

using Inputs = std::vector<const TensorType*>;

// ---- shape rules -------------------------------------------------------------

// numpy broadcasting of any number of shapes, right-aligned. The result keeps
// the first non-empty name among the inputs' dims of the winning size.
InferResult broadcast_shapes(std::string_view op, const Inputs& in, DType out_dtype) {
  int rank = 0;
  for (const TensorType* t : in) rank = std::max(rank, t->rank());
  TensorType out;
  out.dtype = out_dtype;
  out.dims.resize(rank);
  for (int axis = 0; axis < rank; ++axis) {
    const Dim* chosen = nullptr;
    size_t chosen_input = 0;
    for (size_t i = 0; i < in.size(); ++i) {
      int pos = axis - (rank - in[i]->rank());
      if (pos < 0) continue;
      const Dim& d = in[i]->dims[pos];
      bool better = !chosen || (chosen->size == 1 && d.size != 1) ||
                    (chosen->name.empty() && d.size == chosen->size);
      if (chosen && d.size != 1 && chosen->size != 1 && d.size != chosen->size)
        return InferResult::fail(
            fmt::format("{}: shapes {} and {} do not broadcast: {} vs {} at axis {}", op,
                        to_string(*in[chosen_input]), to_string(*in[i]), describe_dim(*chosen),
                        describe_dim(d), axis - rank),
            "sizes must be equal or 1 when aligned from the right; rearrange or reduce one side");
      if (better) {
        chosen = &d;
        chosen_input = i;
      }
    }
    out.dims[axis] = *chosen;
  }
  return InferResult::of(out);
}

InferResult require_same_dtype(std::string_view op, const Inputs& in) {
  for (size_t i = 1; i < in.size(); ++i)
    if (in[i]->dtype != in[0]->dtype)
      return InferResult::fail(
          fmt::format("{}: dtype mismatch: {} vs {}", op, dtype_name(in[0]->dtype),
                      dtype_name(in[i]->dtype)),
          fmt::format("convert one side with cast(x, {})", dtype_name(in[0]->dtype)));
  return {};
}

InferResult require_float(std::string_view op, const TensorType& t, std::string_view what = "input") {
  if (!is_floating(t.dtype))
    return InferResult::fail(
        fmt::format("{} needs a floating-point {}, got {}", op, what, dtype_name(t.dtype)),
        "convert it with cast(x, f32)");
  return {};
}

template <Op kOp>
InferResult infer_float_unary(const Inputs& in, const Attrs&) {
  if (auto r = require_float(op_name(kOp), *in[0]); !r.ok()) return r;
  return InferResult::of(*in[0]);
}

template <Op kOp>
InferResult infer_numeric_unary(const Inputs& in, const Attrs&) {
  if (in[0]->dtype == DType::Bool)
    return InferResult::fail(fmt::format("{} is not defined for bool", op_name(kOp)),
                             "convert it with cast(x, f32)");
  return InferResult::of(*in[0]);
}

InferResult infer_cast(const Inputs& in, const Attrs& a) {
  TensorType t = *in[0];
  t.dtype = a.get_dtype("dtype");
  return InferResult::of(t);
}

InferResult infer_last_two(std::string_view op, const Inputs& in) {
  if (in[0]->rank() < 2)
    return InferResult::fail(
        fmt::format("{} needs at least 2 axes (rows, columns), got {}", op, to_string(*in[0])),
        "apply it to a matrix or a batch of matrices, e.g. attention scores [b, h, i, j]");
  return InferResult::of(*in[0]);
}
InferResult infer_triu(const Inputs& in, const Attrs&) { return infer_last_two("triu", in); }
InferResult infer_causal_mask(const Inputs& in, const Attrs&) {
  if (auto r = require_float("causal_mask", *in[0]); !r.ok()) return r;
  return infer_last_two("causal_mask", in);
}

// dropout(x, seed_lo, seed_hi, step, training) {p, stream}: see ir/rng.h.
InferResult infer_dropout(const Inputs& in, const Attrs& a) {
  if (auto r = require_float("dropout", *in[0]); !r.ok()) return r;
  for (size_t i = 1; i < in.size(); ++i)
    if (in[i]->dtype != DType::I64 || in[i]->rank() != 0)
      return InferResult::fail(fmt::format("dropout: operand {} is {}, not an i64 word of the rng tensor", i, to_string(*in[i])),
                               "the frontend builds these operands; this is a compiler bug");
  double p = a.get_double("p");
  if (!(p >= 0 && p < 1))
    return InferResult::fail(fmt::format("dropout: p must be in [0, 1), got {}", p),
                             "p is the probability of dropping an element, e.g. dropout(x, 0.1)");
  if (in[0]->numel() > kDropoutMaxElements)
    return InferResult::fail(fmt::format("dropout of {} ({} elements): napkin's dropout takes at most 2^32 elements",
                                         to_string(*in[0]), in[0]->numel()),
                             "apply dropout to smaller tensors, e.g. per block, or split the tensor first");
  return InferResult::of(*in[0]);
}

template <Op kOp>
InferResult infer_arith_binary(const Inputs& in, const Attrs&) {
  if (auto r = require_same_dtype(op_name(kOp), in); !r.ok()) return r;
  if (in[0]->dtype == DType::Bool)
    return InferResult::fail(fmt::format("{} is not defined for bool", op_name(kOp)),
                             "convert it with cast(x, f32), or select with where(cond, a, b)");
  if (kOp == Op::Pow)
    if (auto r = require_float("pow", *in[0]); !r.ok()) return r;
  return broadcast_shapes(op_name(kOp), in, in[0]->dtype);
}

template <Op kOp>
InferResult infer_compare(const Inputs& in, const Attrs&) {
  if (auto r = require_same_dtype(op_name(kOp), in); !r.ok()) return r;
  return broadcast_shapes(op_name(kOp), in, DType::Bool);
}

InferResult infer_where(const Inputs& in, const Attrs&) {
  if (in[0]->dtype != DType::Bool)
    return InferResult::fail(
        fmt::format("where: the condition must be bool, got {}", dtype_name(in[0]->dtype)),
        "make it with a comparison such as x > 0").blaming(0);
  if (auto r = require_same_dtype("where", {in[1], in[2]}); !r.ok()) return r;
  return broadcast_shapes("where", in, in[1]->dtype);
}

InferResult infer_constant(const Inputs&, const Attrs& a) {
  TensorType t;
  t.dtype = a.get_dtype("dtype");
  return InferResult::of(t);
}

InferResult infer_iota(const Inputs&, const Attrs& a) {
  int64_t n = a.get_int("n");
  if (n <= 0) return InferResult::fail(fmt::format("arange needs a positive length, got {}", n), "use a dim or a positive integer");
  TensorType t;
  t.dtype = a.get_dtype("dtype");
  t.dims.push_back({n, ""});
  return InferResult::of(t);
}

// Axes attributes are normalized by the builder: in range, sorted, unique.
InferResult check_axes(std::string_view op, const TensorType& t, const std::vector<int64_t>& axes) {
  for (int64_t a : axes)
    if (a < 0 || a >= t.rank())
      return InferResult::fail(fmt::format("{}: axis {} is out of range for {}", op, a, to_string(t)),
                               fmt::format("axes run from 0 to {}", t.rank() - 1));
  return {};
}

template <Op kOp>
InferResult infer_reduce(const Inputs& in, const Attrs& a) {
  const auto& axes = a.get_ints("axes");
  if (auto r = check_axes(op_name(kOp), *in[0], axes); !r.ok()) return r;
  if (kOp == Op::ReduceMean)
    if (auto r = require_float("reduce mean", *in[0]); !r.ok()) return r;
  bool keep = a.get_int("keepdims") != 0;
  TensorType t;
  t.dtype = in[0]->dtype;
  // dtype= (set by passes/sink_casts, not the model language): a wider float
  // to reduce into, as if the input had been cast to it first.
  if (a.has("dtype")) {
    t.dtype = a.get_dtype("dtype");
    if (!is_floating(in[0]->dtype) || !is_floating(t.dtype) || dtype_size(t.dtype) < dtype_size(in[0]->dtype))
      return InferResult::fail(fmt::format("{}: cannot reduce {} into {}", op_name(kOp), dtype_name(in[0]->dtype),
                                           dtype_name(t.dtype)),
                               "dtype= widens a float input");
  }
  for (int i = 0; i < in[0]->rank(); ++i) {
    bool reduced = std::find(axes.begin(), axes.end(), i) != axes.end();
    if (!reduced)
      t.dims.push_back(in[0]->dims[i]);
    else if (keep)
      t.dims.push_back({1, ""});
  }
  return InferResult::of(t);
}

// A contraction's result type: its operands' dtype, or with dtype= (set by
// passes/matmul_epilogues, not the model language) f32 from bf16 or f16
// operands: the f32 sums stored as they are, without the rounding to the
// operands' type (the GEMM libraries' mixed output).
InferResult contraction_result(std::string_view op, TensorType out, DType operands, const Attrs& a) {
  out.dtype = operands;
  if (a.has("dtype")) {
    const DType want = a.get_dtype("dtype");
    if (want != operands && !(want == DType::F32 && (operands == DType::BF16 || operands == DType::F16)))
      return InferResult::fail(fmt::format("{}: no {} result from {} operands", op, dtype_name(want), dtype_name(operands)),
                               "dtype= widens a bf16 or f16 contraction's result to f32");
    out.dtype = want;
  }
  return InferResult::of(out);
}

InferResult infer_matmul(const Inputs& in, const Attrs& attrs) {
  const TensorType &a = *in[0], &b = *in[1];
  if (a.rank() < 2 || b.rank() < 2)
    return InferResult::fail(
        fmt::format("matmul needs operands with at least 2 axes, got {} and {}", to_string(a),
                    to_string(b)),
        "for vectors use einsum, e.g. einsum(x, w, \"d, d e -> e\")");
  if (auto r = require_same_dtype("matmul", in); !r.ok()) return r;
  if (auto r = require_float("matmul", a, "operand"); !r.ok()) return r;
  const Dim& ka = a.dims.back();
  const Dim& kb = b.dims[b.rank() - 2];
  if (ka.size != kb.size)
    return InferResult::fail(
        fmt::format("matmul: inner dims differ: {} vs {}", describe_dim(ka), describe_dim(kb)),
        fmt::format("the last axis of the left operand {} must equal the second-to-last of the "
                    "right operand {}; transpose or rearrange one of them",
                    to_string(a), to_string(b)));
  TensorType batch_a, batch_b;
  batch_a.dims.assign(a.dims.begin(), a.dims.end() - 2);
  batch_b.dims.assign(b.dims.begin(), b.dims.end() - 2);
  InferResult batch = broadcast_shapes("matmul (batch axes)", {&batch_a, &batch_b}, a.dtype);
  if (!batch.ok()) return batch;
  TensorType out = batch.outputs[0];
  out.dims.push_back(a.dims[a.rank() - 2]);
  out.dims.push_back(b.dims.back());
  return contraction_result("matmul", out, a.dtype, attrs);
}

// Einsum attrs: lhs, rhs, out are axis ids; axis_names is a space-separated list
// naming each id (for messages); spec is the pattern as the user wrote it.
//
// The name of axis `id` in axis_names for a message, or the id if unnamed. Only
// the error paths split the list: the verifier re-runs inference after every pass.
std::string einsum_axis_name(const std::string& axis_names, int64_t id) {
  std::vector<std::string> names;
  std::string cur;
  for (char c : axis_names + " ") {
    if (c == ' ') {
      if (!cur.empty()) names.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  return id >= 0 && id < static_cast<int64_t>(names.size()) ? names[id] : std::to_string(id);
}

InferResult infer_einsum(const Inputs& in, const Attrs& a) {
  if (auto r = require_same_dtype("einsum", in); !r.ok()) return r;
  if (auto r = require_float("einsum", *in[0], "operand"); !r.ok()) return r;
  const std::string& axis_names = a.get_string("axis_names");
  std::map<int64_t, Dim> size_of;
  std::map<int64_t, int> defined_by;
  const std::vector<int64_t>* operands[2] = {&a.get_ints("lhs"), &a.get_ints("rhs")};
  for (int k = 0; k < 2; ++k) {
    const auto& ids = *operands[k];
    if (static_cast<int>(ids.size()) != in[k]->rank())
      return InferResult::fail(
          fmt::format("einsum: operand {} has {} axes {} but the pattern names {}", k + 1,
                      in[k]->rank(), to_string(*in[k]), ids.size()),
          "write one axis name per dimension of the operand").blaming(k);
    for (size_t i = 0; i < ids.size(); ++i) {
      const Dim& d = in[k]->dims[i];
      auto it = size_of.find(ids[i]);
      if (it == size_of.end()) {
        size_of[ids[i]] = d;
        defined_by[ids[i]] = k;
      } else if (it->second.size != d.size) {
        return InferResult::fail(
            fmt::format("einsum: axis '{}' is {} in operand {} but {} in operand {}",
                        einsum_axis_name(axis_names, ids[i]), describe_dim(it->second),
                        defined_by[ids[i]] + 1, describe_dim(d), k + 1),
            "the same axis name must have the same size everywhere in the pattern").blaming(k);
      }
    }
  }
  TensorType out;
  out.dtype = in[0]->dtype;
  for (int64_t id : a.get_ints("out")) {
    auto it = size_of.find(id);
    if (it == size_of.end())
      return InferResult::fail(
          fmt::format("einsum: output axis '{}' does not appear in any operand",
                      einsum_axis_name(axis_names, id)),
          "every output axis must come from an operand");
    out.dims.push_back(it->second);
  }
  return contraction_result("einsum", out, in[0]->dtype, a);
}

InferResult infer_reshape(const Inputs& in, const Attrs& a) {
  const auto& shape = a.get_ints("shape");
  TensorType t;
  t.dtype = in[0]->dtype;
  int64_t n = 1;
  for (int64_t s : shape) {
    t.dims.push_back({s, ""});
    n *= s;
  }
  if (n != in[0]->numel())
    return InferResult::fail(fmt::format("reshape: {} has {} elements but the new shape has {}",
                                         to_string(*in[0]), in[0]->numel(), n),
                             "the product of the new sizes must equal the element count");
  return InferResult::of(t);
}

InferResult infer_permute(const Inputs& in, const Attrs& a) {
  const auto& perm = a.get_ints("perm");
  std::vector<int64_t> sorted = perm;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> expected(in[0]->rank());
  std::iota(expected.begin(), expected.end(), 0);
  if (sorted != expected)
    return InferResult::fail(
        fmt::format("transpose: the permutation must list each of the {} axes of {} once",
                    in[0]->rank(), to_string(*in[0])),
        fmt::format("use a permutation of 0..{}", in[0]->rank() - 1));
  TensorType t;
  t.dtype = in[0]->dtype;
  for (int64_t p : perm) t.dims.push_back(in[0]->dims[p]);
  return InferResult::of(t);
}

InferResult infer_broadcast(const Inputs& in, const Attrs& a) {
  const auto& shape = a.get_ints("shape");
  const TensorType& x = *in[0];
  int rank = static_cast<int>(shape.size());
  if (x.rank() > rank)
    return InferResult::fail(fmt::format("cannot broadcast {} to fewer axes", to_string(x)), "reduce or index it instead");
  TensorType t;
  t.dtype = x.dtype;
  for (int i = 0; i < rank; ++i) {
    int pos = i - (rank - x.rank());
    if (pos >= 0 && x.dims[pos].size == shape[i]) {
      t.dims.push_back(x.dims[pos]);
    } else if (pos < 0 || x.dims[pos].size == 1) {
      t.dims.push_back({shape[i], ""});
    } else {
      return InferResult::fail(fmt::format("cannot broadcast {} to size {} at axis {}",
                                           to_string(x), shape[i], i),
                               "only axes of size 1 can be broadcast");
    }
  }
  return InferResult::of(t);
}

InferResult infer_slice(const Inputs& in, const Attrs& a) {
  int64_t axis = a.get_int("axis"), start = a.get_int("start"), stop = a.get_int("stop");
  const TensorType& x = *in[0];
  if (axis < 0 || axis >= x.rank())
    return InferResult::fail(fmt::format("slice: axis {} out of range for {}", axis, to_string(x)), "index fewer axes");
  int64_t size = x.dims[axis].size;
  if (start < 0 || stop > size || start >= stop)
    return InferResult::fail(
        fmt::format("slice {}:{} is empty or out of range for axis {} of size {}", start, stop,
                    axis, describe_dim(x.dims[axis])),
        fmt::format("use 0 <= start < stop <= {}", size));
  TensorType t = x;
  t.dims[axis] = {stop - start, ""};
  return InferResult::of(t);
}

InferResult infer_select(const Inputs& in, const Attrs& a) {
  int64_t axis = a.get_int("axis"), index = a.get_int("index");
  const TensorType& x = *in[0];
  if (axis < 0 || axis >= x.rank())
    return InferResult::fail(fmt::format("index: axis {} out of range for {}", axis, to_string(x)), "index fewer axes");
  if (index < 0 || index >= x.dims[axis].size)
    return InferResult::fail(fmt::format("index {} is out of range for axis {} of size {}", index,
                                         axis, describe_dim(x.dims[axis])),
                             fmt::format("use 0..{} (or negative from the end)", x.dims[axis].size - 1));
  TensorType t = x;
  t.dims.erase(t.dims.begin() + axis);
  return InferResult::of(t);
}

InferResult infer_copy(const Inputs& in, const Attrs&) { return InferResult::of(*in[0]); }

InferResult infer_concat(const Inputs& in, const Attrs& a) {
  if (in.empty()) return InferResult::fail("concat needs at least one input", "pass the tensors to join");
  int64_t axis = a.get_int("axis");
  const TensorType& first = *in[0];
  if (axis < 0 || axis >= first.rank())
    return InferResult::fail(fmt::format("concat: axis {} out of range for {}", axis, to_string(first)),
                             fmt::format("axes run from 0 to {}", first.rank() - 1));
  if (auto r = require_same_dtype("concat", in); !r.ok()) return r;
  TensorType out = first;
  int64_t total = 0;
  for (size_t k = 0; k < in.size(); ++k) {
    const TensorType& t = *in[k];
    if (t.rank() != first.rank())
      return InferResult::fail(fmt::format("concat: input {} {} has a different rank than {}", k + 1,
                                           to_string(t), to_string(first)),
                               "concatenated tensors need the same number of axes");
    for (int i = 0; i < t.rank(); ++i)
      if (i != axis && t.dims[i].size != first.dims[i].size)
        return InferResult::fail(fmt::format("concat: axis {} differs: {} vs {}", i,
                                             describe_dim(first.dims[i]), describe_dim(t.dims[i])),
                                 "all axes but the concatenated one must match");
    total += t.dims[axis].size;
  }
  out.dims[axis] = {total, ""};
  return InferResult::of(out);
}

InferResult infer_embedding(const Inputs& in, const Attrs&) {
  const TensorType &table = *in[0], &ids = *in[1];
  if (table.rank() < 1) return InferResult::fail("embedding: the table must have at least one axis", "declare the table as [vocab, d]");
  if (!is_integer(ids.dtype))
    return InferResult::fail(
        fmt::format("embedding: ids must be i32 or i64, got {}", dtype_name(ids.dtype)),
        "declare the token input with dtype: i32").blaming(1);
  if (auto r = require_float("embedding", table, "table"); !r.ok()) return r.blaming(0);
  TensorType out;
  out.dtype = table.dtype;
  out.dims = ids.dims;
  out.dims.insert(out.dims.end(), table.dims.begin() + 1, table.dims.end());
  return InferResult::of(out);
}

template <Op kOp>
InferResult infer_softmax(const Inputs& in, const Attrs& a) {
  if (auto r = require_float(op_name(kOp), *in[0]); !r.ok()) return r;
  if (auto r = check_axes(op_name(kOp), *in[0], {a.get_int("axis")}); !r.ok()) return r;
  return InferResult::of(*in[0]);
}

InferResult check_norm_param(std::string_view op, std::string_view role, const TensorType& x,
                             const TensorType& p) {
  if (x.rank() < 1)
    return InferResult::fail(fmt::format("{} needs at least one axis", op), "it normalizes over the last axis");
  const Dim& last = x.dims.back();
  if (p.rank() != 1 || p.dims[0].size != last.size)
    return InferResult::fail(
        fmt::format("{}: {} has shape {} but the last axis of the input is {}", op, role,
                    to_string(p), describe_dim(last)),
        fmt::format("declare the {} with shape [{}]", role, last.name.empty() ? std::to_string(last.size) : last.name));
  if (p.dtype != x.dtype)
    return InferResult::fail(fmt::format("{}: {} is {} but the input is {}", op, role,
                                         dtype_name(p.dtype), dtype_name(x.dtype)),
                             fmt::format("declare the {} with dtype {}", role, dtype_name(x.dtype)));
  return {};
}

// A norm's result: x's type, or with dtype= (set by passes/sink_casts, not
// the model language) stored as another float type: computed as before and
// rounded once on store, as a cast of the result would round it.
InferResult norm_result(std::string_view op, const TensorType& x, const Attrs& a) {
  TensorType t = x;
  if (a.has("dtype")) {
    t.dtype = a.get_dtype("dtype");
    if (!is_floating(t.dtype))
      return InferResult::fail(fmt::format("{}: cannot store its result as {}", op, dtype_name(t.dtype)),
                               "dtype= names a float type");
  }
  return InferResult::of(t);
}

InferResult infer_layernorm(const Inputs& in, const Attrs& a) {
  if (auto r = require_float("layernorm", *in[0]); !r.ok()) return r;
  if (auto r = check_norm_param("layernorm", "gain", *in[0], *in[1]); !r.ok()) return r.blaming(1);
  if (auto r = check_norm_param("layernorm", "bias", *in[0], *in[2]); !r.ok()) return r.blaming(2);
  return norm_result("layernorm", *in[0], a);
}

InferResult infer_rmsnorm(const Inputs& in, const Attrs& a) {
  if (auto r = require_float("rmsnorm", *in[0]); !r.ok()) return r;
  if (auto r = check_norm_param("rmsnorm", "gain", *in[0], *in[1]); !r.ok()) return r.blaming(1);
  return norm_result("rmsnorm", *in[0], a);
}

InferResult infer_cross_entropy(const Inputs& in, const Attrs&) {
  const TensorType &logits = *in[0], &targets = *in[1];
  if (auto r = require_float("cross_entropy", logits, "logits"); !r.ok()) return r.blaming(0);
  if (!is_integer(targets.dtype))
    return InferResult::fail(
        fmt::format("cross_entropy: targets must be integer class ids (i32 or i64), got {}",
                    dtype_name(targets.dtype)),
        "targets are class ids: an i32/i64 input, or cast(t, i32)").blaming(1);
  if (logits.rank() != targets.rank() + 1)
    return InferResult::fail(
        fmt::format("cross_entropy: logits {} must have one more axis (the classes) than targets {}",
                    to_string(logits), to_string(targets)),
        "logits are [..., classes] and targets [...]: one class id per row of logits");
  for (int i = 0; i < targets.rank(); ++i)
    if (logits.dims[i].size != targets.dims[i].size)
      return InferResult::fail(fmt::format("cross_entropy: axis {} differs: logits {} vs targets {}",
                                           i, describe_dim(logits.dims[i]),
                                           describe_dim(targets.dims[i])),
                               "logits [..., classes] and targets [...] must agree on every axis but the last");
  TensorType out;
  out.dtype = logits.dtype;
  return InferResult::of(out);
}

InferResult infer_mse(const Inputs& in, const Attrs&) {
  if (auto r = require_float("mse", *in[0]); !r.ok()) return r;
  if (auto r = require_same_dtype("mse", in); !r.ok()) return r;
  if (!in[0]->same_shape(*in[1]))
    return InferResult::fail(fmt::format("mse: shapes differ: {} vs {}", to_string(*in[0]),
                                         to_string(*in[1])),
                             "prediction and target must have the same shape; rearrange one of them");
  TensorType out;
  out.dtype = in[0]->dtype;
  return InferResult::of(out);
}

InferResult infer_pad(const Inputs& in, const Attrs& a) {
  int64_t axis = a.get_int("axis"), before = a.get_int("before"), after = a.get_int("after");
  if (auto r = check_axes("pad", *in[0], {axis}); !r.ok()) return r;
  if (before < 0 || after < 0)
    return InferResult::fail(fmt::format("pad: negative padding {}, {}", before, after), "pad by zero or more elements");
  TensorType t = *in[0];
  t.dims[axis] = {t.dims[axis].size + before + after, ""};
  return InferResult::of(t);
}

// A backward rule's incoming gradient must have the type of the output it is
// the gradient of; `like` is that output's type.
InferResult require_like(std::string_view op, const TensorType& grad, const TensorType& like) {
  if (grad.dtype != like.dtype || !grad.same_shape(like))
    return InferResult::fail(fmt::format("{}: gradient {} does not match {}", op, to_string(grad), to_string(like)),
                             "autodiff builds these nodes; this is a compiler bug");
  return {};
}

InferResult infer_softmax_grad(const Inputs& in, const Attrs& a) {
  if (auto r = infer_softmax<Op::Softmax>({in[0]}, a); !r.ok()) return r;
  if (auto r = require_like("softmax_grad", *in[1], *in[0]); !r.ok()) return r;
  return InferResult::of(*in[0]);
}

// (x, gain, dy) -> dx; with gains=1 (the norm's VJP) also the gain's
// gradient [d], and for layernorm the bias's, from the same pass over the rows.
template <Op kOp>
InferResult infer_norm_grad(const Inputs& in, const Attrs& a) {
  if (in.size() != 3 && in.size() != 4)
    return InferResult::fail(fmt::format("{} takes (x, gain, dy) or (x, gain, dy, residual), got {} inputs", op_name(kOp), in.size()),
                             "autodiff builds these nodes; this is a compiler bug");
  if (in.size() == 4)
    if (auto r = require_like(op_name(kOp), *in[3], *in[0]); !r.ok()) return r;
  if (auto r = require_float(op_name(kOp), *in[0]); !r.ok()) return r;
  if (auto r = check_norm_param(op_name(kOp), "gain", *in[0], *in[1]); !r.ok()) return r;
  // dy: x's type, or a narrower float of x's shape that the kernel widens as it loads (passes/sink_casts.h).
  const bool narrow_dy = in[0]->dtype == DType::F32 && (in[2]->dtype == DType::BF16 || in[2]->dtype == DType::F16) &&
                         in[2]->same_shape(*in[0]);
  if (!narrow_dy)
    if (auto r = require_like(op_name(kOp), *in[2], *in[0]); !r.ok()) return r;
  InferResult r = InferResult::of(*in[0]);
  if (a.has("gains") && a.get_int("gains") != 0) {
    TensorType t;
    t.dtype = in[0]->dtype;
    t.dims.push_back(in[0]->dims.back());
    r.outputs.push_back(t);
    if (kOp == Op::LayerNormGrad) r.outputs.push_back(t);
  }
  return r;
}

InferResult infer_gelu_grad(const Inputs& in, const Attrs&) {
  if (auto r = require_float("gelu_grad", *in[0]); !r.ok()) return r;
  if (auto r = require_like("gelu_grad", *in[1], *in[0]); !r.ok()) return r;
  return InferResult::of(*in[0]);
}

InferResult infer_cross_entropy_grad(const Inputs& in, const Attrs& a) {
  if (auto r = infer_cross_entropy({in[0], in[1]}, a); !r.ok()) return r;
  TensorType scalar;
  scalar.dtype = in[0]->dtype;
  if (auto r = require_like("cross_entropy_grad", *in[2], scalar); !r.ok()) return r;
  return InferResult::of(*in[0]);
}

InferResult infer_embedding_grad(const Inputs& in, const Attrs& a) {
  if (in.size() != 2 && in.size() != 3)
    return InferResult::fail("embedding_grad takes (dy, ids) or (dy, ids, base)", "autodiff builds these nodes; this is a compiler bug");
  const TensorType &dy = *in[0], &ids = *in[1];
  int64_t vocab = a.get_int("vocab");
  if (!is_integer(ids.dtype) || dy.rank() < ids.rank() || vocab <= 0)
    return InferResult::fail(fmt::format("embedding_grad: bad operands {} and {}", to_string(dy), to_string(ids)),
                             "autodiff builds these nodes; this is a compiler bug");
  for (int i = 0; i < ids.rank(); ++i)
    if (dy.dims[i].size != ids.dims[i].size)
      return InferResult::fail(fmt::format("embedding_grad: {} does not start with the ids' shape {}", to_string(dy),
                                           to_string(ids)),
                               "autodiff builds these nodes; this is a compiler bug");
  TensorType t;
  t.dtype = dy.dtype;
  t.dims.push_back({vocab, ""});
  t.dims.insert(t.dims.end(), dy.dims.begin() + ids.rank(), dy.dims.end());
  if (in.size() == 3 && (in[2]->dtype != t.dtype || !in[2]->same_shape(t)))
    return InferResult::fail(fmt::format("embedding_grad: the base {} is not the gradient's {}", to_string(*in[2]), to_string(t)),
                             "passes/embedding_grad_into builds these nodes; this is a compiler bug");
  return InferResult::of(t);
}

// attention(q [B, Hq, T, D], k [B, Hk, S, D], v [B, Hk, S, D]) -> (o, lse):
// ir/loop.h's AttentionParams. The names in messages are the model's dims.
InferResult check_attention_operands(const Inputs& in, const Attrs& a) {
  const TensorType &q = *in[0], &k = *in[1], &v = *in[2];
  for (int i = 0; i < 3; ++i) {
    if (in[i]->rank() != 4)
      return InferResult::fail(fmt::format("attention: {} is {}, not [batch, heads, seq, head_dim]",
                                           "qkv"[i], to_string(*in[i])),
                               "rearrange it to 4 axes first, e.g. \"b s (h hd) -> b h s hd\"").blaming(i);
    if (auto r = require_float("attention", *in[i], std::string(1, "qkv"[i])); !r.ok()) return r.blaming(i);
  }
  if (k.dtype != q.dtype || v.dtype != q.dtype)
    return InferResult::fail(fmt::format("attention: q is {} but k is {} and v is {}", dtype_name(q.dtype),
                                         dtype_name(k.dtype), dtype_name(v.dtype)),
                             "cast them to one dtype");
  if (!k.same_shape(v))
    return InferResult::fail(fmt::format("attention: k {} and v {} differ", to_string(k), to_string(v)),
                             "keys and values need the same shape (value head_dim other than the key's is not supported)")
        .blaming(2);
  auto size = [](const TensorType& t, int i) { return t.dims[i].size; };
  if (size(k, 0) != size(q, 0))
    return InferResult::fail(fmt::format("attention: batch {} of q differs from {} of k", describe_dim(q.dims[0]),
                                         describe_dim(k.dims[0]))).blaming(1);
  if (size(k, 3) != size(q, 3))
    return InferResult::fail(fmt::format("attention: head_dim {} of q differs from {} of k", describe_dim(q.dims[3]),
                                         describe_dim(k.dims[3]))).blaming(1);
  if (size(q, 1) % size(k, 1) != 0)
    return InferResult::fail(fmt::format("attention: {} query heads do not group evenly over {} kv heads",
                                         describe_dim(q.dims[1]), describe_dim(k.dims[1])),
                             "the query heads must be a multiple of the key/value heads").blaming(1);
  if (a.get_int("causal") != 0 && size(q, 2) > size(k, 2))
    return InferResult::fail(fmt::format("attention: causal with more queries {} than keys {}",
                                         describe_dim(q.dims[2]), describe_dim(k.dims[2])),
                             "the causal mask is aligned to the last key: it needs seq(q) <= seq(k)").blaming(0);
  return {};
}

// lse: f32 [batch, heads, seq] of q.
TensorType attention_lse(const TensorType& q) {
  TensorType lse;
  lse.dtype = DType::F32;
  lse.dims.assign(q.dims.begin(), q.dims.begin() + 3);
  return lse;
}

InferResult infer_attention(const Inputs& in, const Attrs& a) {
  if (auto r = check_attention_operands(in, a); !r.ok()) return r;
  TensorType o = *in[0];
  if (a.has("seq_major_out") && a.get_int("seq_major_out") != 0) std::swap(o.dims[1], o.dims[2]);  // [B, T, Hq, D]
  InferResult r = InferResult::of(o);
  r.outputs.push_back(attention_lse(*in[0]));
  return r;
}

// cached_attention(q [B, Hq, n, D], k [B, Hk, n, D], v, k_cache [B, Hk, S, D],
// v_cache, positions [n] int) -> o [B, Hq, n, D]: ir/loop.h's
// CachedAttentionParams. k and v are checked as attention's keys against q
// (no causal alignment: the positions say what each query sees).
InferResult infer_cached_attention(const Inputs& in, const Attrs&) {
  Attrs plain;
  plain.set("causal", int64_t{0});
  if (auto r = check_attention_operands(in, plain); !r.ok()) return r;
  const TensorType &k = *in[1], &kc = *in[3], &vc = *in[4], &pos = *in[5];
  if (kc.rank() != 4 || !vc.same_shape(kc) || kc.dtype != k.dtype || vc.dtype != k.dtype)
    return InferResult::fail(fmt::format("cached_attention: the caches {} and {} are not [batch, kv_heads, context, "
                                         "head_dim] of k's dtype", to_string(kc), to_string(vc))).blaming(3);
  for (int i : {0, 1, 3})
    if (kc.dims[i].size != k.dims[i].size)
      return InferResult::fail(fmt::format("cached_attention: cache {} does not hold k {}", to_string(kc), to_string(k)))
          .blaming(3);
  if (k.dims[2].size > kc.dims[2].size)
    return InferResult::fail(fmt::format("cached_attention: {} new rows do not fit a cache of {}", k.dims[2].size,
                                         kc.dims[2].size)).blaming(1);
  if (pos.rank() != 1 || pos.dims[0].size != k.dims[2].size || !is_integer(pos.dtype))
    return InferResult::fail(fmt::format("cached_attention: positions {} are not one integer per new row",
                                         to_string(pos))).blaming(5);
  return InferResult::of(*in[0]);
}

// attention_grad(q, k, v, o, lse, do) -> (dq, dk, dv).
InferResult infer_attention_grad(const Inputs& in, const Attrs& a) {
  if (auto r = check_attention_operands(in, a); !r.ok()) return r;
  const TensorType lse = attention_lse(*in[0]);
  if (!in[3]->same_shape(*in[0]) || !in[5]->same_shape(*in[0]) || !in[4]->same_shape(lse) ||
      in[4]->dtype != DType::F32 || in[3]->dtype != in[0]->dtype || in[5]->dtype != in[0]->dtype)
    return InferResult::fail("attention_grad: o, lse or do does not match q");
  InferResult r;
  if (a.has("packed_grad") && a.get_int("packed_grad") != 0) {  // [B, T, 3, H, D]
    if (!in[1]->same_shape(*in[0]))
      return InferResult::fail("attention_grad: packed gradients need as many kv heads as query heads");
    TensorType g = *in[0];
    g.dims = {in[0]->dims[0], in[0]->dims[2], Dim{3, ""}, in[0]->dims[1], in[0]->dims[3]};
    r.outputs = {g};
    return r;
  }
  r.outputs = {*in[0], *in[1], *in[2]};
  return r;
}

// linear_cross_entropy(x [..., d], w [V, d], targets [...]) -> (loss, lse [...]):
// ir/loop.h's ClassifierParams. The fused-classifier pass builds these nodes
// from a matmul and a cross_entropy the model wrote, so a mismatch is a compiler bug.
InferResult check_classifier_operands(const Inputs& in) {
  const TensorType &x = *in[0], &w = *in[1], &t = *in[2];
  if (!is_floating(x.dtype) || w.dtype != x.dtype || x.rank() < 1 || w.rank() != 2 || !is_integer(t.dtype) ||
      t.rank() != x.rank() - 1 || w.dims[1].size != x.dims.back().size)
    return InferResult::fail(fmt::format("linear_cross_entropy: bad operands x {}, w {}, targets {}", to_string(x),
                                         to_string(w), to_string(t)),
                             "the fused-classifier pass builds these nodes; this is a compiler bug");
  for (int i = 0; i < t.rank(); ++i)
    if (t.dims[i].size != x.dims[i].size)
      return InferResult::fail(fmt::format("linear_cross_entropy: targets {} do not match the rows of x {}",
                                           to_string(t), to_string(x)));
  return {};
}

// lse: [...] of the targets' shape, in the loss dtype.
TensorType classifier_lse(const TensorType& x, const TensorType& targets) {
  TensorType lse = targets;
  lse.dtype = classifier_loss_dtype(x.dtype);
  return lse;
}

InferResult infer_linear_cross_entropy(const Inputs& in, const Attrs&) {
  if (auto r = check_classifier_operands(in); !r.ok()) return r;
  TensorType loss;
  loss.dtype = classifier_loss_dtype(in[0]->dtype);
  InferResult r = InferResult::of(loss);
  r.outputs.push_back(classifier_lse(*in[0], *in[2]));
  return r;
}

// linear_cross_entropy_grad(x, w, targets, lse, dloss) -> (dx, dw).
InferResult infer_linear_cross_entropy_grad(const Inputs& in, const Attrs&) {
  if (auto r = check_classifier_operands(in); !r.ok()) return r;
  const TensorType lse = classifier_lse(*in[0], *in[2]);
  if (in[3]->dtype != lse.dtype || !in[3]->same_shape(lse) || in[4]->dtype != lse.dtype || in[4]->rank() != 0)
    return InferResult::fail("linear_cross_entropy_grad: lse or dloss does not match x",
                             "autodiff builds these nodes; this is a compiler bug");
  InferResult r;
  r.outputs = {*in[0], *in[1]};
  return r;
}

// rope(x[, positions]) -> x's type: ir/rope.h's RopeParams. x is floating with
// at least two axes (the rotated one and the positions' one, distinct); the
// rotated axis turns in pairs, so its size is even; explicit positions are one
// i32/i64 per index of the positions' axis. The frontend checks the axes and
// the numbers (theta, the scaling factors) where the user wrote them.
InferResult infer_rope(const Inputs& in, const Attrs& a) {
  const TensorType& x = *in[0];
  if (auto r = require_float("rope", x); !r.ok()) return r.blaming(0);
  if (x.rank() < 2)
    return InferResult::fail(fmt::format("rope needs at least 2 axes (the positions' and the rotated one), got {}",
                                         to_string(x)),
                             "apply it to q or k, e.g. [batch, heads, seq, head_dim]").blaming(0);
  const RopeParams p = rope_params(a);
  // The frontend checks the axes where the user wrote them.
  NAPKIN_INTERNAL_CHECK(p.axis >= 0 && p.axis < x.rank() && p.seq_axis >= 0 && p.seq_axis < x.rank() &&
                            p.axis != p.seq_axis,
                        "rope: axes {} and {} of {}", p.axis, p.seq_axis, to_string(x));
  if (x.dims[p.axis].size % 2 != 0)
    return InferResult::fail(fmt::format("rope: the rotated axis {} of {} has odd size {}: its elements turn in pairs",
                                         p.axis, to_string(x), x.dims[p.axis].size),
                             "rotate an axis of even size, e.g. head_dim; axis= picks it").blaming(0);
  NAPKIN_INTERNAL_CHECK(in.size() == (p.explicit_positions ? 2u : 1u), "rope: {} operands, explicit_positions {}",
                        in.size(), p.explicit_positions);
  if (p.explicit_positions) {
    const TensorType& pos = *in[1];
    const Dim& d = x.dims[p.seq_axis];
    const std::string seq = d.name.empty() ? std::to_string(d.size) : d.name;
    if (pos.rank() != 1 || pos.dims[0].size != x.dims[p.seq_axis].size ||
        (pos.dtype != DType::I32 && pos.dtype != DType::I64))
      return InferResult::fail(fmt::format("rope: positions {} are not one i32 or i64 per index of seq_axis {} ({})",
                                           to_string(pos), p.seq_axis, describe_dim(x.dims[p.seq_axis])),
                               fmt::format("give positions of shape [{0}], e.g. arange({0})", seq)).blaming(1);
  }
  return InferResult::of(x);
}

// all_reduce_sum(x) -> x's type. Only passes make it (the optimizer's global
// norm, loss scaling's overflow probe), of an f32 sum: anything else is a
// compiler bug.
InferResult infer_all_reduce_sum(const Inputs& in, const Attrs&) {
  NAPKIN_INTERNAL_CHECK(in.size() == 1 && in[0]->dtype == DType::F32, "all_reduce_sum of {} operands, the first {}",
                        in.size(), in.empty() ? std::string("none") : to_string(*in[0]));
  return InferResult::of(*in[0]);
}

// all_gather(p), reduce_scatter(g) -> the operand's type: only
// passes/shard_parameters makes them, of a parameter and of its gradient.
InferResult infer_parameter_collective(const Inputs& in, const Attrs&) {
  NAPKIN_INTERNAL_CHECK(in.size() == 1, "a parameter collective of {} operands", in.size());
  return InferResult::of(*in[0]);
}

// top_k(x [..., n]) {k} -> (values [..., k] in x's dtype, indices i32 [..., k]):
// ir/loop.h's TopKParams, along the last axis.
InferResult infer_top_k(const Inputs& in, const Attrs& a) {
  const TensorType& x = *in[0];
  if (auto r = require_float("top_k", x); !r.ok()) return r.blaming(0);
  if (x.rank() < 1)
    return InferResult::fail("top_k needs at least one axis: it picks along the last one, got a scalar",
                             "apply it to a vector or to rows, e.g. router logits [tokens, experts]").blaming(0);
  const Dim& last = x.dims.back();
  const int64_t k = a.get_int("k");
  if (k < 1 || k > last.size)
    return InferResult::fail(fmt::format("top_k: k = {} is outside [1, {}], the size of the last axis of {}", k,
                                         last.size, to_string(x)),
                             fmt::format("k counts the values picked from each row along {}: 1 to {}",
                                         describe_dim(last), last.size));
  if (last.size > std::numeric_limits<int32_t>::max())
    return InferResult::fail(fmt::format("top_k: the last axis of {} is too long for i32 indices", to_string(x)),
                             "pick along a shorter axis").blaming(0);
  TensorType values = x;
  values.dims.back() = {k, ""};
  TensorType indices = values;
  indices.dtype = DType::I32;
  InferResult r = InferResult::of(values);
  r.outputs.push_back(indices);
  return r;
}

// moe_slots(indices i32 [T, k]) {experts E, capacity C} -> (pos i32 [T, k],
// src i32 [E, C], counts f32 [E]): ir/loop.h's MoeSlotsParams. The frontend's
// moe() makes it from top_k's indices and checks E and C where the user wrote them.
InferResult infer_moe_slots(const Inputs& in, const Attrs& a) {
  const TensorType& indices = *in[0];
  if (indices.dtype != DType::I32 || indices.rank() != 2)
    return InferResult::fail(fmt::format("moe_slots takes i32 expert indices [tokens, k], got {}", to_string(indices)),
                             "give it top_k's indices of the router's rows").blaming(0);
  const int64_t experts = a.get_int("experts"), capacity = a.get_int("capacity");
  if (experts < 1 || capacity < 1)
    return InferResult::fail(fmt::format("moe_slots needs at least one expert and one slot each, got {} experts of "
                                         "capacity {}", experts, capacity),
                             "a positive number of experts and a positive capacity factor");
  if (experts > std::numeric_limits<int32_t>::max() / capacity)
    return InferResult::fail(fmt::format("moe_slots: {} experts of {} slots are too many slots for i32 positions",
                                         experts, capacity),
                             "lower the capacity factor or the number of tokens per step");
  // counts holds whole numbers of assignments, exact in f32 up to 2^24.
  if (indices.numel() > (int64_t{1} << 24))
    return InferResult::fail(fmt::format("moe_slots: {} routed assignments are more than f32 counts exactly (2^24)",
                                         indices.numel()),
                             "route fewer tokens per step: a smaller micro-batch").blaming(0);
  TensorType pos = indices;
  TensorType src;
  src.dtype = DType::I32;
  src.dims = {{experts, ""}, {capacity, ""}};
  TensorType counts;
  counts.dtype = DType::F32;
  counts.dims = {{experts, ""}};
  InferResult r = InferResult::of(pos);
  r.outputs.push_back(src);
  r.outputs.push_back(counts);
  return r;
}

// ---- cost rules --------------------------------------------------------------

// Bytes of the distinct elements a value reads from its buffer: a broadcast
// (stride-0) axis is read once, not once per repetition. Every value has one
// stride per axis (the verifier checks it).
}  // namespace

double distinct_bytes(const Graph& g, ValueId id) {
  const Value& v = g.value(id);
  double n = 1;
  for (int i = 0; i < v.type.rank(); ++i)
    if (v.layout.strides[i] != 0) n *= v.type.dims[i].size;
  return n * dtype_size(v.type.dtype);
}

double transcendentals(const Graph& g, const Node& n) {
  const OpInfo& info = op_info(n.op);
  if (info.transcendentals_per_element == 0) return 0;
  if (info.op_class == OpClass::Attention) {  // one exp per visible score
    AttentionDims a = attention_dims(g, n);
    return info.transcendentals_per_element * a.batch * a.heads * a.pairs;
  }
  if (info.op_class == OpClass::Classifier) {  // one exp per logit
    ClassifierDims c = classifier_dims(g, n);
    return info.transcendentals_per_element * c.rows * c.vocab;
  }
  bool rows = info.op_class == OpClass::Normalization || info.op_class == OpClass::Loss;
  double elements = rows ? static_cast<double>(g.value(n.in(0)).type.numel()) : static_cast<double>(g.value(n.out()).type.numel());
  return info.transcendentals_per_element * elements;
}

AttentionDims attention_dims(const Graph& g, const Node& n) {
  NAPKIN_INTERNAL_CHECK(op_info(n.op).op_class == OpClass::Attention, "attention_dims of {}", op_name(n.op));
  const TensorType& q = g.value(n.in(0)).type;
  // cached_attention's keys are its cache's rows, counted at the cache's whole
  // length: the cost of the query at the last position (docs/report.md, "Inference").
  const bool cached = n.op == Op::CachedAttention;
  const TensorType& k = g.value(n.in(cached ? 3 : 1)).type;
  AttentionDims a;
  a.batch = static_cast<double>(q.dims[0].size);
  a.heads = static_cast<double>(q.dims[1].size);
  a.kv_heads = static_cast<double>(k.dims[1].size);
  a.q_len = static_cast<double>(q.dims[2].size);
  a.kv_len = static_cast<double>(k.dims[2].size);
  a.head_dim = static_cast<double>(q.dims[3].size);
  a.causal = !cached && n.attrs.get_int("causal") != 0;
  // Query i sees keys 0 .. i + S - T: (S - T + 1) + ... + S keys over the T rows.
  a.pairs = a.causal ? a.q_len * (a.kv_len - a.q_len + 1) + a.q_len * (a.q_len - 1) / 2 : a.q_len * a.kv_len;
  return a;
}

ClassifierDims classifier_dims(const Graph& g, const Node& n) {
  NAPKIN_INTERNAL_CHECK(op_info(n.op).op_class == OpClass::Classifier, "classifier_dims of {}", op_name(n.op));
  const TensorType& x = g.value(n.in(0)).type;
  ClassifierDims c;
  c.d = static_cast<double>(x.dims.back().size);
  c.rows = static_cast<double>(x.numel()) / c.d;
  c.vocab = static_cast<double>(g.value(n.in(1)).type.dims[0].size);
  return c;
}

DType classifier_loss_dtype(DType x) { return x == DType::F64 ? DType::F64 : DType::F32; }

double ContractionDims::narrowest() const { return std::min({m, n, k}); }

ContractionDims contraction_dims(const Graph& g, const Node& n) {
  ContractionDims d;
  const TensorType& a = g.value(n.in(0)).type;
  const TensorType& b = g.value(n.in(1)).type;
  if (n.op == Op::MatMul) {
    d.m = static_cast<double>(a.dims[a.rank() - 2].size);
    d.k = static_cast<double>(a.dims.back().size);
    d.n = static_cast<double>(b.dims.back().size);
    const TensorType& c = g.value(n.out()).type;
    int batch_rank = c.rank() - 2;
    for (int i = 0; i < batch_rank; ++i) {
      // Batch axes align on the right; a missing or size-1 axis broadcasts.
      auto size_in = [&](const TensorType& t) {
        int j = i - (batch_rank - (t.rank() - 2));
        return j >= 0 ? t.dims[j].size : int64_t{1};
      };
      double size = static_cast<double>(c.dims[i].size);
      bool in_a = size_in(a) > 1, in_b = size_in(b) > 1;
      if (in_a && in_b) d.batch *= size;
      else if (in_a) d.m *= size;
      else if (in_b) d.n *= size;
    }
    return d;
  }
  NAPKIN_INTERNAL_CHECK(n.op == Op::Einsum, "contraction_dims of a non-contraction");
  const auto& lhs = n.attrs.get_ints("lhs");
  const auto& rhs = n.attrs.get_ints("rhs");
  const auto& out = n.attrs.get_ints("out");
  std::map<int64_t, int64_t> sizes;
  for (size_t i = 0; i < lhs.size(); ++i) sizes[lhs[i]] = a.dims[i].size;
  for (size_t i = 0; i < rhs.size(); ++i) sizes[rhs[i]] = b.dims[i].size;
  auto has = [](const std::vector<int64_t>& ids, int64_t id) { return std::find(ids.begin(), ids.end(), id) != ids.end(); };
  for (const auto& [id, size] : sizes) {
    bool l = has(lhs, id), r = has(rhs, id), o = has(out, id);
    double s = static_cast<double>(size);
    if (l && r && o) d.batch *= s;
    else if (l && o) d.m *= s;
    else if (r && o) d.n *= s;
    else if (l && r) d.k *= s;
    // An axis in one operand only is summed there: it adds work, not a GEMM dim.
  }
  return d;
}

namespace {

double read_all(const Graph& g, const Node& n) {
  double bytes = 0;
  for (ValueId v : n.inputs) bytes += distinct_bytes(g, v);
  return bytes;
}

double written(const Graph& g, const Node& n) {
  double bytes = 0;
  for (ValueId v : n.outputs) bytes += g.value(v).type.bytes();
  return bytes;
}

double out_numel(const Graph& g, const Node& n) { return g.value(n.out()).type.numel(); }

// Fused attention (docs/report.md, "attention"). Per visible (query, key)
// pair and head: forward q·k (2D), p·v (2D) and the softmax's scale, max,
// subtract, exp and sum (5); backward the gradient's dv, dp, dq and dk
// products (8D) and ds = p (dp - D) (2), plus, as recompute, the scores and
// probabilities again (2D + 3: q·k, scale, subtract lse, exp). The D_i = do_i·o_i
// row dots are 2D per query row.
// A fused rope (rope_* attrs, passes/fuse_rope.h) rotates every element of q
// and of k (cached: of the new rows of k) as they are loaded, 3 FLOPs each
// (a pair: 4 multiplies, 2 adds) from a cos / sin table built once per
// program, so no transcendentals and no bytes; the backward rotates q and k
// again (recompute) and rotates dq and dk back (3 FLOPs an element each).
OpCost cost_attention(const Graph& g, const Node& n) {
  AttentionDims a = attention_dims(g, n);
  double pairs = a.batch * a.heads * a.pairs;
  OpCost c{0, read_all(g, n), written(g, n)};
  const double rotated = has_rope(n.attrs, "rope_") ? 3.0 * static_cast<double>(g.value(n.in(0)).type.numel() +
                                                                                g.value(n.in(1)).type.numel())
                                                    : 0.0;
  if (n.op == Op::Attention || n.op == Op::CachedAttention) {
    c.activation_matmul_flops = pairs * 4 * a.head_dim;
    c.flops = c.activation_matmul_flops + pairs * 5 + rotated;
  } else {
    c.activation_matmul_flops = pairs * 8 * a.head_dim;
    c.flops = c.activation_matmul_flops + pairs * 2 + a.batch * a.heads * a.q_len * 2 * a.head_dim + rotated;
    c.recompute_flops = pairs * (2 * a.head_dim + 3) + rotated;
  }
  return c;
}

// The fused classifier (docs/report.md, "Classifier"): the products with w
// are weight-matmul FLOPs, 2·rows·V·d forward and 4·rows·V·d backward (dx
// and dw), as the matmuls it replaced; per logit the forward's online
// log-sum-exp is 5 (max, sub, exp, sum, rescale), the backward's gradient 4
// (sub lse, exp, sub the one-hot, scale). The backward recomputes the logits
// (2·rows·V·d): recompute, as fused attention's scores. Bytes: the operands
// and results only; a chunk's logits stay in the workspace (ir/loop.h).
OpCost cost_classifier(const Graph& g, const Node& n) {
  ClassifierDims c = classifier_dims(g, n);
  double logits = c.rows * c.vocab;
  OpCost cost{0, read_all(g, n), written(g, n)};
  if (n.op == Op::LinearCrossEntropy) {
    cost.param_matmul_flops = 2 * logits * c.d;
    cost.flops = cost.param_matmul_flops + 5 * logits;
  } else {
    cost.param_matmul_flops = 4 * logits * c.d;
    cost.flops = cost.param_matmul_flops + 4 * logits;
    cost.recompute_flops = 2 * logits * c.d;
  }
  return cost;
}

OpCost cost_elementwise(const Graph& g, const Node& n) {
  return {op_info(n.op).flops_per_element * out_numel(g, n), read_all(g, n), written(g, n)};
}

// gelu's tanh form is 9 steps per element (x³ is 2 muls, ·0.044715, +x, ·√(2/π),
// tanh, +1, ·x, ·0.5); the exact form 0.5·x·(1 + erf(x/√2)) is 5.
OpCost cost_gelu(const Graph& g, const Node& n) {
  double per_element = n.attrs.get_string("approximate") == "none" ? 5 : op_info(n.op).flops_per_element;
  return {per_element * out_numel(g, n), read_all(g, n), written(g, n)};
}

OpCost cost_source(const Graph& g, const Node& n) { return {0, 0, written(g, n)}; }

OpCost cost_reduce(const Graph& g, const Node& n) {
  double in = g.value(n.in(0)).type.numel();
  // One op per input element folded in; a mean adds one division per output.
  double flops = in + (n.op == Op::ReduceMean ? out_numel(g, n) : 0);
  return {flops, read_all(g, n), written(g, n)};
}

OpCost cost_matmul(const Graph& g, const Node& n) {
  const TensorType& a = g.value(n.in(0)).type;
  double k = a.dims.back().size;
  return {2 * out_numel(g, n) * k, read_all(g, n), written(g, n)};
}

OpCost cost_einsum(const Graph& g, const Node& n) {
  // 2 FLOPs per multiply-add over the product of every distinct axis.
  std::map<int64_t, int64_t> sizes;
  const auto& lhs = n.attrs.get_ints("lhs");
  const auto& rhs = n.attrs.get_ints("rhs");
  const TensorType& a = g.value(n.in(0)).type;
  const TensorType& b = g.value(n.in(1)).type;
  for (size_t i = 0; i < lhs.size(); ++i) sizes[lhs[i]] = a.dims[i].size;
  for (size_t i = 0; i < rhs.size(); ++i) sizes[rhs[i]] = b.dims[i].size;
  double product = 1;
  for (const auto& [id, s] : sizes) product *= s;
  return {2 * product, read_all(g, n), written(g, n)};
}

OpCost cost_view(const Graph&, const Node&) { return {}; }

OpCost cost_copy(const Graph& g, const Node& n) { return {0, read_all(g, n), written(g, n)}; }

OpCost cost_embedding(const Graph& g, const Node& n) {
  // Reads the ids and one table row per id; no arithmetic.
  double rows = out_numel(g, n) * dtype_size(g.value(n.in(0)).type.dtype);
  return {0, distinct_bytes(g, n.in(1)) + rows, written(g, n)};
}

OpCost cost_per_input_element(const Graph& g, const Node& n) {
  double in = g.value(n.in(0)).type.numel();
  return {op_info(n.op).flops_per_element * in, read_all(g, n), written(g, n)};
}

// dx as cost_per_input_element; with the gains' gradients, dy * x_hat
// summed (2) and, for layernorm, dy summed (1) per element: x_hat is the
// one dx already computed.
OpCost cost_norm_grad(const Graph& g, const Node& n) {
  OpCost c = cost_per_input_element(g, n);
  const double gains = n.outputs.size() > 1 ? 2 : 0, bias = n.outputs.size() > 2 ? 1 : 0;
  const double residual = n.inputs.size() > 3 ? 1 : 0;  // dx + residual
  c.flops += (gains + bias + residual) * g.value(n.in(0)).type.numel();
  return c;
}

// gelu'(x)·dy. tanh form: u = √(2/π)(x + 0.044715x³) (4), t = tanh(u) (1),
// 0.5(1 + t) (2), 1 − t² (2), √(2/π)(1 + 3·0.044715x²) (3), products and sum (3),
// times dy (1) = 16. Exact form: Φ(x) via erf (3), x·φ(x) via exp(−x²/2) (4),
// sum and times dy (2) = 9.
OpCost cost_gelu_grad(const Graph& g, const Node& n) {
  double per_element = n.attrs.get_string("approximate") == "none" ? 9 : op_info(n.op).flops_per_element;
  return {per_element * out_numel(g, n), read_all(g, n), written(g, n)};
}

// One FLOP per element of dy. The table is zeroed, then each position's row of dy is added to the row
// its id picks (read and written: at most one row per position). With a
// base the kernel adds into it in place (passes/embedding_grad_into makes
// the base a value nothing else reads, so the memory plan hands its buffer
// over, analysis/in_place_reuse.h): only the rows the ids pick move.
OpCost cost_embedding_grad(const Graph& g, const Node& n) {
  double dy = g.value(n.in(0)).type.numel();
  double row_bytes = dy * dtype_size(g.value(n.out()).type.dtype);
  const double flops = op_info(n.op).flops_per_element * dy;
  if (n.inputs.size() == 3) return {flops, distinct_bytes(g, n.in(0)) + distinct_bytes(g, n.in(1)) + row_bytes, row_bytes};
  return {flops, read_all(g, n) + row_bytes, written(g, n) + row_bytes};
}

// A row: the op, the loop it runs as, its shape rule, cost rule, FLOPs per
// element, transcendental functions per element, precision rule and user
// function (ir/op.h, OpInfo).
#define ROW(E, loop, infer, cost, fpe, tpe, precision, function)                                                        \
  OpInfo {                                                                                                              \
    Op::E, "", 0, OpClass::Source, LoopKind::loop, infer, cost, fpe, nullptr, tpe, PrecisionRule::precision,            \
        UserFunction::function, false, ElementIndex::None                                                               \
  }
// An elementwise op that reads its element's position (`at`, an ElementIndex).
#define ROWI(E, at, infer, cost, fpe, tpe, precision, function)                                                         \
  OpInfo {                                                                                                              \
    Op::E, "", 0, OpClass::Source, LoopKind::Elementwise, infer, cost, fpe, nullptr, tpe, PrecisionRule::precision,     \
        UserFunction::function, false, ElementIndex::at                                                                 \
  }
// A backward-only op's row. A pass (autodiff, the optimizer's) emits it after
// the mixed-precision pass has run, so no precision rule applies: it says
// FollowsInputs, the rule of an op that computes in its operands' dtype,
// which is what it does.
#define BACKWARD_ROW(E, loop, infer, cost, fpe, tpe)                                                                   \
  OpInfo {                                                                                                              \
    Op::E, "", 0, OpClass::Source, LoopKind::loop, infer, cost, fpe, nullptr, tpe, PrecisionRule::FollowsInputs,        \
        UserFunction::None, true, ElementIndex::None                                                                    \
  }

// FLOPs per element follow "one per arithmetic step of the textbook formula"
// (docs/report.md lists each): e.g. sigmoid = 1/(1+exp(-x)) is neg, exp, add, div = 4.
const OpInfo kRows[] = {
    ROW(Constant, Fill, infer_constant, cost_source, 0, 0, AsWritten, None),
    ROW(Iota, Fill, infer_iota, cost_source, 0, 0, AsWritten, None),
    ROW(Neg, Elementwise, infer_numeric_unary<Op::Neg>, cost_elementwise, 1, 0, FollowsInputs, UnaryIntegral),
    ROW(Exp, Elementwise, infer_float_unary<Op::Exp>, cost_elementwise, 1, 1, Fp32, Unary),
    ROW(Log, Elementwise, infer_float_unary<Op::Log>, cost_elementwise, 1, 1, Fp32, Unary),
    ROW(Sqrt, Elementwise, infer_float_unary<Op::Sqrt>, cost_elementwise, 1, 0, FollowsInputs, Unary),
    ROW(Rsqrt, Elementwise, infer_float_unary<Op::Rsqrt>, cost_elementwise, 2, 0, FollowsInputs, Unary),
    ROW(Abs, Elementwise, infer_numeric_unary<Op::Abs>, cost_elementwise, 1, 0, FollowsInputs, UnaryIntegral),
    ROW(Tanh, Elementwise, infer_float_unary<Op::Tanh>, cost_elementwise, 1, 1, FollowsInputs, Unary),
    ROW(Relu, Elementwise, infer_numeric_unary<Op::Relu>, cost_elementwise, 1, 0, FollowsInputs, UnaryIntegral),
    ROW(Gelu, Elementwise, infer_float_unary<Op::Gelu>, cost_gelu, 9, 1, FollowsInputs, None),  // tanh form; see cost_gelu
    ROW(Sigmoid, Elementwise, infer_float_unary<Op::Sigmoid>, cost_elementwise, 4, 1, FollowsInputs, Unary),
    ROW(Silu, Elementwise, infer_float_unary<Op::Silu>, cost_elementwise, 5, 1, FollowsInputs, Unary),
    // softplus: log(1 + exp(x)) is exp, add, log = 3 (the stable form's extra steps are not counted);
    // f32 under mixed precision, as exp and log (and torch autocast) are.
    ROW(Softplus, Elementwise, infer_float_unary<Op::Softplus>, cost_elementwise, 3, 2, Fp32, Unary),
    ROW(Sin, Elementwise, infer_float_unary<Op::Sin>, cost_elementwise, 1, 1, FollowsInputs, Unary),
    ROW(Cos, Elementwise, infer_float_unary<Op::Cos>, cost_elementwise, 1, 1, FollowsInputs, Unary),
    ROW(Cast, Elementwise, infer_cast, cost_elementwise, 0, 0, AsWritten, None),
    ROWI(Triu, RowCol, infer_triu, cost_elementwise, 1, 0, FollowsInputs, None),
    ROWI(CausalMask, RowCol, infer_causal_mask, cost_elementwise, 1, 0, FollowsInputs, None),
    // dropout: the keep test's select and the scale (the Philox words are integer work, not FLOPs).
    ROWI(Dropout, Flat, infer_dropout, cost_elementwise, 2, 0, FollowsInputs, None),
    ROW(Add, Elementwise, infer_arith_binary<Op::Add>, cost_elementwise, 1, 0, FollowsInputs, None),
    ROW(Sub, Elementwise, infer_arith_binary<Op::Sub>, cost_elementwise, 1, 0, FollowsInputs, None),
    ROW(Mul, Elementwise, infer_arith_binary<Op::Mul>, cost_elementwise, 1, 0, FollowsInputs, None),
    ROW(Div, Elementwise, infer_arith_binary<Op::Div>, cost_elementwise, 1, 0, FollowsInputs, None),
    ROW(Pow, Elementwise, infer_arith_binary<Op::Pow>, cost_elementwise, 1, 1, FollowsInputs, None),
    ROW(Maximum, Elementwise, infer_arith_binary<Op::Maximum>, cost_elementwise, 1, 0, FollowsInputs, None),
    ROW(Minimum, Elementwise, infer_arith_binary<Op::Minimum>, cost_elementwise, 1, 0, FollowsInputs, None),
    ROW(Less, Elementwise, infer_compare<Op::Less>, cost_elementwise, 1, 0, FollowsInputs, None),
    ROW(LessEqual, Elementwise, infer_compare<Op::LessEqual>, cost_elementwise, 1, 0, FollowsInputs, None),
    ROW(Greater, Elementwise, infer_compare<Op::Greater>, cost_elementwise, 1, 0, FollowsInputs, None),
    ROW(GreaterEqual, Elementwise, infer_compare<Op::GreaterEqual>, cost_elementwise, 1, 0, FollowsInputs, None),
    ROW(Equal, Elementwise, infer_compare<Op::Equal>, cost_elementwise, 1, 0, FollowsInputs, None),
    ROW(NotEqual, Elementwise, infer_compare<Op::NotEqual>, cost_elementwise, 1, 0, FollowsInputs, None),
    ROW(Where, Elementwise, infer_where, cost_elementwise, 1, 0, FollowsInputs, None),
    ROW(ReduceSum, Reduction, infer_reduce<Op::ReduceSum>, cost_reduce, 1, 0, Fp32, None),
    ROW(ReduceMean, Reduction, infer_reduce<Op::ReduceMean>, cost_reduce, 1, 0, Fp32, None),
    ROW(ReduceMax, Reduction, infer_reduce<Op::ReduceMax>, cost_reduce, 1, 0, Fp32, None),
    ROW(ReduceMin, Reduction, infer_reduce<Op::ReduceMin>, cost_reduce, 1, 0, Fp32, None),
    ROW(MatMul, Contraction, infer_matmul, cost_matmul, 0, 0, Contraction, None),
    ROW(Einsum, Contraction, infer_einsum, cost_einsum, 0, 0, Contraction, None),
    ROW(Reshape, View, infer_reshape, cost_view, 0, 0, FollowsInputs, None),
    ROW(Permute, View, infer_permute, cost_view, 0, 0, FollowsInputs, None),
    ROW(Broadcast, View, infer_broadcast, cost_view, 0, 0, FollowsInputs, None),
    ROW(Slice, View, infer_slice, cost_view, 0, 0, FollowsInputs, None),
    ROW(Select, View, infer_select, cost_view, 0, 0, FollowsInputs, None),
    ROW(Copy, Elementwise, infer_copy, cost_copy, 0, 0, FollowsInputs, None),
    ROW(Concat, Concat, infer_concat, cost_copy, 0, 0, FollowsInputs, None),
    ROW(Embedding, Gather, infer_embedding, cost_embedding, 0, 0, FollowsInputs, None),
    ROW(Pad, Concat, infer_pad, cost_copy, 0, 0, FollowsInputs, None),
    // softmax: max, sub, exp, sum, div; log_softmax: max, sub, exp, sum, sub (log per row).
    ROW(Softmax, Rows, infer_softmax<Op::Softmax>, cost_per_input_element, 5, 1, Fp32, None),
    ROW(LogSoftmax, Rows, infer_softmax<Op::LogSoftmax>, cost_per_input_element, 5, 1, Fp32, None),
    // layernorm: mean, sub, square, sum, scale by rstd, gain, bias; rmsnorm drops mean, sub, bias.
    ROW(LayerNorm, Rows, infer_layernorm, cost_per_input_element, 7, 0, Fp32, None),
    ROW(RMSNorm, Rows, infer_rmsnorm, cost_per_input_element, 4, 0, Fp32, None),
    // cross_entropy: log_softmax (5) per logit; picking the target and the mean are per row.
    ROW(CrossEntropy, Rows, infer_cross_entropy, cost_per_input_element, 5, 1, Fp32, None),
    // mse: sub, square, sum.
    ROW(MSE, Mse, infer_mse, cost_per_input_element, 3, 0, Fp32, None),
    // attention: bf16/f16 operands under mixed precision, softmax and sums in f32, as a matmul; see cost_attention.
    ROW(Attention, Attention, infer_attention, cost_attention, 0, 1, Contraction, None),
    // linear_cross_entropy: built after the precision policy (operands as the matmul had them); see cost_classifier.
    ROW(LinearCrossEntropy, Classifier, infer_linear_cross_entropy, cost_classifier, 0, 1, AsWritten, None),
    // rope: per rotated pair 4 multiplies and 2 adds, 3 per element; its
    // angles come from a table made once per program, so no transcendental
    // per element (docs/report.md, "rope"). In its operand's dtype, as
    // transformers' rotation of bf16 q and k under autocast.
    ROW(Rope, Rope, infer_rope, cost_elementwise, 3, 0, FollowsInputs, None),
    // top_k and moe_slots compare and count: no FLOPs (docs/report.md,
    // "Routing"); they read their operand and write their results once.
    // top_k picks in its operand's dtype; moe_slots' operand is integer.
    ROW(TopK, TopK, infer_top_k, cost_copy, 0, 0, FollowsInputs, None),
    ROW(MoeSlots, MoeSlots, infer_moe_slots, cost_copy, 0, 0, FollowsInputs, None),
    // Backward rules, counted the same way (docs/report.md derives each):
    // softmax_grad: dy*y, row sum, sub, mul.
    BACKWARD_ROW(SoftmaxGrad, Rows, infer_softmax_grad, cost_per_input_element, 4, 0),
    // layernorm_grad: x_hat again (5), g*dy, two row sums (3), combine (4).
    BACKWARD_ROW(LayerNormGrad, Rows, infer_norm_grad<Op::LayerNormGrad>, cost_norm_grad, 13, 0),
    // rmsnorm_grad: x_hat again (3), g*dy, one row sum (2), combine (3).
    BACKWARD_ROW(RMSNormGrad, Rows, infer_norm_grad<Op::RMSNormGrad>, cost_norm_grad, 9, 0),
    BACKWARD_ROW(GeluGrad, Elementwise, infer_gelu_grad, cost_gelu_grad, 16, 1),  // tanh form; see cost_gelu_grad
    // cross_entropy_grad: softmax (5) and the scale by dloss / rows, per logit.
    BACKWARD_ROW(CrossEntropyGrad, Rows, infer_cross_entropy_grad, cost_per_input_element, 6, 1),
    BACKWARD_ROW(EmbeddingGrad, ScatterAdd, infer_embedding_grad, cost_embedding_grad, 1, 0),
    BACKWARD_ROW(AttentionGrad, Attention, infer_attention_grad, cost_attention, 0, 1),
    BACKWARD_ROW(LinearCrossEntropyGrad, Classifier, infer_linear_cross_entropy_grad, cost_classifier, 0, 1),
    // Inference only (no VJP, not callable): counted as attention's forward over the whole cache.
    BACKWARD_ROW(CachedAttention, CachedAttention, infer_cached_attention, cost_attention, 0, 1),
    // all_reduce_sum: no arithmetic of its own (the ranks' adds are the
    // runtime's, not the step's); it reads and writes the value once.
    BACKWARD_ROW(AllReduceSum, Collective, infer_all_reduce_sum, cost_copy, 0, 0),
    // ZeRO-3's: the same convention (the bytes a rank sends and receives are
    // the distributed report's, analysis/distributed.h).
    BACKWARD_ROW(AllGather, Collective, infer_parameter_collective, cost_copy, 0, 0),
    BACKWARD_ROW(ReduceScatter, Collective, infer_parameter_collective, cost_copy, 0, 0),
};
#undef ROW
#undef ROWI
#undef BACKWARD_ROW

static_assert(sizeof(kRows) / sizeof(kRows[0]) == kNumOps,
              "ir/op_table.cpp needs exactly one row per op in ir/ops.def");

struct OpMeta {
  std::string_view name;
  int arity;
  OpClass cls;
};
constexpr OpMeta kMeta[] = {
#define OP(Enum, name, arity, cls) {name, arity, OpClass::cls},
#include "ir/ops.def"
#undef OP
};

// Joins the table rows with the names, arities and classes from ops.def.
std::vector<OpInfo> build_table() {
  std::vector<OpInfo> table(std::begin(kRows), std::end(kRows));
  for (int i = 0; i < kNumOps; ++i) {
    NAPKIN_INTERNAL_CHECK(static_cast<int>(table[i].op) == i,
                          "op table row {} is out of order with ops.def", i);
    table[i].name = kMeta[i].name;
    table[i].arity = kMeta[i].arity;
    table[i].op_class = kMeta[i].cls;
    table[i].vjp = vjp_rule(static_cast<Op>(i));
  }
  return table;
}

const std::vector<OpInfo>& table() {
  static const std::vector<OpInfo> t = build_table();
  return t;
}

}  // namespace

const OpInfo& op_info(Op op) { return table()[static_cast<int>(op)]; }
std::string_view op_name(Op op) { return kMeta[static_cast<int>(op)].name; }

std::optional<Op> find_op(std::string_view name) {
  for (int i = 0; i < kNumOps; ++i)
    if (kMeta[i].name == name) return static_cast<Op>(i);
  return std::nullopt;
}

std::string_view op_class_name(OpClass c) {
  switch (c) {
    case OpClass::Source: return "source";
    case OpClass::Elementwise: return "elementwise";
    case OpClass::Reduction: return "reduction";
    case OpClass::Contraction: return "contraction";
    case OpClass::View: return "view";
    case OpClass::Copy: return "copy";
    case OpClass::Gather: return "gather";
    case OpClass::Normalization: return "normalization";
    case OpClass::Loss: return "loss";
    case OpClass::Attention: return "attention";
    case OpClass::Classifier: return "classifier";
    case OpClass::Rotary: return "rotary";
    case OpClass::Routing: return "routing";
    case OpClass::Collective: return "collective";
  }
  return "?";
}

}  // namespace napkin::ir
