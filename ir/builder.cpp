#include "ir/builder.h"

#include <fmt/format.h>

#include "ir/internal_check.h"

namespace napkin::ir {

Built Builder::add(Op op, std::vector<ValueId> inputs, Attrs attrs) {
  const OpInfo& info = op_info(op);
  NAPKIN_INTERNAL_CHECK(info.arity < 0 || static_cast<int>(inputs.size()) == info.arity,
                        "{} takes {} inputs, got {}", info.name, info.arity, inputs.size());
  std::vector<const TensorType*> types;
  for (ValueId v : inputs) types.push_back(&g_.value(v).type);
  InferResult r = info.infer(types, attrs);
  if (!r.ok()) return {kNoValue, r.error, r.hint, r.blame};
  for (const TensorType& t : r.outputs) {
    // An absurd shape is an error here, before anything counts it in int64.
    double elements = element_count(t.dims);
    if (elements > kMaxElements)
      return {kNoValue,
              fmt::format("{}: the result {} would have {:.3g} elements, more than napkin's limit of 2^50",
                          info.name, to_string(t), elements),
              "check the dims: this is far beyond any device's memory"};
  }
  NodeId id = g_.add_node(op, std::move(inputs), std::move(r.outputs), std::move(attrs), loc_, scope_, phase_);
  g_.node(id).origin = origin_;
  const Node& n = g_.node(id);
  if (info.op_class == OpClass::View) {
    const Value& in = g_.value(n.in(0));
    Value& out = g_.value(n.out());
    out.layout = view_layout(op, n.attrs, in.type.sizes(), in.layout, out.type.sizes());
    out.storage = in.storage;
  }
  return {n.out(), "", ""};
}

Layout view_layout(Op op, const Attrs& attrs, const std::vector<int64_t>& in_sizes, const Layout& src,
                   const std::vector<int64_t>& out_sizes) {
  Layout dst;
  dst.offset = src.offset;
  switch (op) {
    case Op::Permute:
      for (int64_t p : attrs.get_ints("perm")) dst.strides.push_back(src.strides[p]);
      break;
    case Op::Broadcast: {
      int extra = static_cast<int>(out_sizes.size() - in_sizes.size());
      dst.strides.assign(extra, 0);  // new leading axes repeat the data
      for (size_t i = 0; i < in_sizes.size(); ++i)
        dst.strides.push_back(in_sizes[i] == out_sizes[extra + i] ? src.strides[i] : 0);
      break;
    }
    case Op::Slice: {
      int64_t axis = attrs.get_int("axis");
      dst.strides = src.strides;
      dst.offset += attrs.get_int("start") * src.strides[axis];
      break;
    }
    case Op::Select: {
      int64_t axis = attrs.get_int("axis");
      dst.strides = src.strides;
      dst.offset += attrs.get_int("index") * src.strides[axis];
      dst.strides.erase(dst.strides.begin() + axis);
      break;
    }
    case Op::Reshape: {
      auto view = reshape_view_layout(in_sizes, src, out_sizes);
      NAPKIN_INTERNAL_CHECK(view.has_value(), "reshape of a non-viewable layout must go through Builder::reshape");
      dst = *view;
      break;
    }
    default:
      NAPKIN_INTERNAL_CHECK(false, "{} is not a view op", op_name(op));
  }
  return dst;
}

ValueId Builder::unit_inner_stride(ValueId x) {
  const Value& v = g_.value(x);
  if (v.type.rank() == 0 || v.type.dims.back().size == 1 || v.layout.strides.back() == 1) return x;
  return must(add(Op::Copy, {x}));
}

Built Builder::reshape(ValueId x, std::vector<Dim> dims) {
  std::vector<int64_t> sizes;
  for (const Dim& d : dims) sizes.push_back(d.size);
  const Value& in = g_.value(x);
  if (in.type.sizes() == sizes) return {x, "", ""};  // nothing to do; x keeps its own dim names
  ValueId source = x;
  if (in.type.numel() == [&] { int64_t n = 1; for (auto s : sizes) n *= s; return n; }() &&
      !reshape_view_layout(in.type.sizes(), in.layout, sizes)) {
    Built copy = add(Op::Copy, {x});
    if (!copy.ok()) return copy;
    source = copy.value;
  }
  Built b = add(Op::Reshape, {source}, {{"shape", sizes}});
  if (b.ok()) rename_dims(b.value, dims);
  return b;
}

Built Builder::permute(ValueId x, std::vector<int64_t> perm) {
  bool identity = true;
  for (size_t i = 0; i < perm.size(); ++i) identity = identity && perm[i] == static_cast<int64_t>(i);
  if (identity && static_cast<int>(perm.size()) == g_.value(x).type.rank()) return {x, "", ""};
  return add(Op::Permute, {x}, {{"perm", perm}});
}

Built Builder::constant(double value, DType dtype) {
  return add(Op::Constant, {}, {{"value", value}, {"dtype", dtype}});
}

ValueId Builder::must(const Built& b) const {
  NAPKIN_INTERNAL_CHECK(b.ok(), "building a node failed: {}", b.error);
  return b.value;
}

void Builder::rename_dims(ValueId v, const std::vector<Dim>& dims) {
  TensorType& t = g_.value(v).type;
  NAPKIN_INTERNAL_CHECK(static_cast<int>(dims.size()) == t.rank(), "rename_dims: rank differs");
  for (size_t i = 0; i < dims.size(); ++i) {
    NAPKIN_INTERNAL_CHECK(dims[i].size == t.dims[i].size, "rename_dims: size differs at axis {}", i);
    if (!dims[i].name.empty()) t.dims[i].name = dims[i].name;
  }
}

// PyTorch's view rule (computeStride): walk the old axes from the right in
// chunks whose elements are contiguous with each other; each chunk must map
// onto a run of new axes with the same element count.
std::optional<Layout> reshape_view_layout(const std::vector<int64_t>& sizes, const Layout& layout,
                                          const std::vector<int64_t>& new_sizes) {
  Layout out;
  out.offset = layout.offset;
  out.strides.assign(new_sizes.size(), 1);
  if (sizes.empty()) {
    for (int64_t s : new_sizes)
      if (s != 1) return std::nullopt;
    return out;
  }
  int view_d = static_cast<int>(new_sizes.size()) - 1;
  int64_t chunk_base_stride = layout.strides.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int tensor_d = static_cast<int>(sizes.size()) - 1; tensor_d >= 0; --tensor_d) {
    tensor_numel *= sizes[tensor_d];
    bool chunk_ends = tensor_d == 0 || (sizes[tensor_d - 1] != 1 &&
                                        layout.strides[tensor_d - 1] != tensor_numel * chunk_base_stride);
    if (!chunk_ends) continue;
    while (view_d >= 0 && (view_numel < tensor_numel || new_sizes[view_d] == 1)) {
      out.strides[view_d] = view_numel * chunk_base_stride;
      view_numel *= new_sizes[view_d];
      --view_d;
    }
    if (view_numel != tensor_numel) return std::nullopt;
    if (tensor_d > 0) {
      chunk_base_stride = layout.strides[tensor_d - 1];
      tensor_numel = 1;
      view_numel = 1;
    }
  }
  if (view_d != -1) return std::nullopt;
  return out;
}

}  // namespace napkin::ir
