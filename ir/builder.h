// Builder: the one way to add nodes to a Graph. It runs the op's shape/dtype
// rule, gives the outputs their layouts (views alias their input's buffer with
// new strides), and stamps every node with the current source location and scope.
//
// Shape errors come back as a Built with `error` set, for the frontend to report
// at the YAML location; passes that build nodes which must type-check call
// `must()`, which turns a failure into an internal error.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "ir/graph.h"

namespace napkin::ir {

struct Built {
  ValueId value = kNoValue;
  std::string error;
  std::string hint;
  int blame = -1;  // the input at fault, as in InferResult
  bool ok() const { return error.empty(); }
};

class Builder {
 public:
  explicit Builder(Graph& g) : g_(g) {}

  void set_loc(SourceLoc loc) { loc_ = std::move(loc); }
  const SourceLoc& loc() const { return loc_; }
  void set_scope(std::string scope) { scope_ = std::move(scope); }
  const std::string& scope() const { return scope_; }
  void set_phase(Phase phase) { phase_ = phase; }
  Phase phase() const { return phase_; }
  // Backward nodes name the forward node they differentiate (Node::origin).
  void set_origin(NodeId origin) { origin_ = origin; }
  Graph& graph() { return g_; }

  // Adds one node with a single output. View ops get their strided layout.
  Built add(Op op, std::vector<ValueId> inputs, Attrs attrs = {});

  // Reshape that is a free view when the input's strides allow it, and
  // otherwise materializes a contiguous Copy first (the report shows that copy).
  Built reshape(ValueId x, std::vector<Dim> dims);
  Built permute(ValueId x, std::vector<int64_t> perm);
  Built constant(double value, DType dtype);
  // x itself when its last axis has stride 1 (or size 1), else a contiguous
  // Copy of it: what kernels that load whole rows (attention) need.
  ValueId unit_inner_stride(ValueId x);

  // Unwraps a result that cannot fail unless napkin has a bug.
  ValueId must(const Built& b) const;

  // Replaces the (cosmetic) names of a value's dims; sizes must not change.
  void rename_dims(ValueId v, const std::vector<Dim>& dims);

 private:
  Graph& g_;
  SourceLoc loc_;
  std::string scope_;
  Phase phase_ = Phase::Forward;
  NodeId origin_ = kNoNode;
};

// The layout of view op `op`'s output (sizes out_sizes) over an input of
// in_sizes laid out as in_layout: the one rule of each view op, which the
// builder stamps on a view's value and the interpreter reads elements by.
Layout view_layout(Op op, const Attrs& attrs, const std::vector<int64_t>& in_sizes, const Layout& in_layout,
                   const std::vector<int64_t>& out_sizes);

// The strides a reshape of (sizes, layout) to new_sizes would have as a view,
// or nullopt when the elements are not laid out so that a view can express it.
std::optional<Layout> reshape_view_layout(const std::vector<int64_t>& sizes, const Layout& layout,
                                          const std::vector<int64_t>& new_sizes);

}  // namespace napkin::ir
