#include "ir/type.h"

#include <fmt/format.h>

namespace napkin::ir {

int64_t TensorType::numel() const {
  int64_t n = 1;
  for (const Dim& d : dims) n *= d.size;
  return n;
}

double element_count(const std::vector<Dim>& dims) {
  double n = 1;
  for (const Dim& d : dims) n *= static_cast<double>(d.size);
  return n;
}

std::vector<int64_t> TensorType::sizes() const {
  std::vector<int64_t> s;
  s.reserve(dims.size());
  for (const Dim& d : dims) s.push_back(d.size);
  return s;
}

bool TensorType::same_shape(const TensorType& other) const { return sizes() == other.sizes(); }

std::string to_string(const TensorType& t) {
  std::string out = std::string(dtype_name(t.dtype)) + "[";
  for (size_t i = 0; i < t.dims.size(); ++i) {
    if (i) out += ", ";
    const Dim& d = t.dims[i];
    // A name that is just the number adds nothing.
    if (!d.name.empty() && d.name != std::to_string(d.size))
      out += fmt::format("{}={}", d.name, d.size);
    else
      out += std::to_string(d.size);
  }
  return out + "]";
}

std::string describe_dim(const Dim& d) {
  if (d.name.empty() || d.name == std::to_string(d.size)) return std::to_string(d.size);
  return fmt::format("'{}' ({})", d.name, d.size);
}

Layout contiguous_layout(const std::vector<int64_t>& sizes) {
  Layout layout;
  layout.strides.assign(sizes.size(), 1);
  int64_t stride = 1;
  for (size_t i = sizes.size(); i-- > 0;) {
    layout.strides[i] = stride;
    stride *= sizes[i];
  }
  return layout;
}

bool is_contiguous(const Layout& layout, const std::vector<int64_t>& sizes) {
  if (layout.offset != 0 || layout.strides.size() != sizes.size()) return false;
  int64_t expected = 1;
  for (size_t i = sizes.size(); i-- > 0;) {
    // A dim of size 1 may have any stride: it is never stepped over.
    if (sizes[i] != 1 && layout.strides[i] != expected) return false;
    expected *= sizes[i];
  }
  return true;
}

std::string to_string(const Layout& layout) {
  std::string out = fmt::format("strides=[{}]", fmt::join(layout.strides, ","));
  if (layout.offset) out += fmt::format(" offset={}", layout.offset);
  return out;
}

}  // namespace napkin::ir
