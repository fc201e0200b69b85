// The mixed-precision pass: see passes/mixed_precision.h for the terms and rules.
//
// The rewrite is in place, in one walk over the forward schedule: each node's
// floating operands are replaced by casts where its rule wants another dtype
// (the casts are scheduled just before it), then its output dtype is
// recomputed by its op's shape rule from the new operands. Value ids, names,
// locations and scopes of the existing nodes do not change.
#include "passes/mixed_precision.h"

#include <fmt/format.h>

#include <map>
#include <set>

#include "ir/builder.h"
#include "ir/internal_check.h"
#include "passes/optimizer.h"

namespace napkin::passes {

std::string_view amp_rule_name(AmpRule r) {
  switch (r) {
    case AmpRule::AsWritten: return "as written";
    case AmpRule::Fp32Override: return "fp32 override";
    case AmpRule::Contraction: return "contraction";
    case AmpRule::Fp32Op: return "fp32 op";
    case AmpRule::FollowsInputs: return "follows inputs";
  }
  return "?";
}

AmpRule amp_rule(ir::Op op, bool selected) {
  const ir::OpInfo& info = ir::op_info(op);
  if (info.precision == ir::PrecisionRule::AsWritten) return AmpRule::AsWritten;
  // A view moves no data and computes nothing: it keeps its input's dtype even
  // when selected (casting its operand would make it a view of another buffer).
  if (info.op_class == ir::OpClass::View) return AmpRule::FollowsInputs;
  if (selected) return AmpRule::Fp32Override;
  switch (info.precision) {
    case ir::PrecisionRule::AsWritten: return AmpRule::AsWritten;
    case ir::PrecisionRule::Contraction: return AmpRule::Contraction;
    case ir::PrecisionRule::Fp32: return AmpRule::Fp32Op;
    case ir::PrecisionRule::FollowsInputs: return AmpRule::FollowsInputs;
  }
  NAPKIN_INTERNAL_CHECK(false, "unknown precision rule {}", static_cast<int>(info.precision));
  return AmpRule::FollowsInputs;
}

namespace {

// True when `pattern` matches `scope` or one of its dot-prefixes ("blocks.0" of "blocks.0.mlp").
bool matches_scope(const std::string& pattern, const std::string& scope) {
  if (scope.empty()) return false;
  for (size_t end = scope.find('.'); ; end = scope.find('.', end + 1)) {
    if (glob_match(pattern, std::string_view(scope).substr(0, end))) return true;
    if (end == std::string::npos) return false;
  }
}

}  // namespace

std::vector<bool> select_fp32_overrides(const ir::Graph& g, ir::Diagnostics* diag) {
  std::vector<bool> selected(g.num_nodes(), false);
  // A forward entry: the YAML line (of one file) and block instance of the nodes lowered from it.
  using Entry = std::tuple<const std::string*, int, std::string>;
  auto entry_of = [](const ir::Node& n) { return Entry{n.loc.file.get(), n.loc.line, n.scope}; };
  for (const ir::PrecisionOverride& o : g.config.precision.fp32) {
    std::set<Entry> entries;
    for (ir::NodeId id : g.schedule()) {
      const ir::Node& n = g.node(id);
      if (n.phase != ir::Phase::Forward) continue;
      for (ir::ValueId out : n.outputs) {
        const std::string& name = g.value(out).name;
        if (!name.empty() && glob_match(o.pattern, name) && n.loc.known()) entries.insert(entry_of(n));
      }
    }
    bool any = false;
    for (ir::NodeId id : g.schedule()) {
      const ir::Node& n = g.node(id);
      if (n.phase != ir::Phase::Forward) continue;
      if (matches_scope(o.pattern, n.scope) || (n.loc.known() && entries.count(entry_of(n)))) {
        selected[id] = true;
        any = true;
      }
    }
    if (!any && diag)
      diag->error(o.loc, fmt::format("precision fp32 pattern '{}' selects no op", o.pattern),
                  "a pattern matches a block (\"blocks.0\", \"blocks.*\") or the name of a value defined in forward "
                  "(\"logits\", \"blocks.1.h\"); `napkin ir MODEL.yaml` lists the names");
  }
  return selected;
}

namespace {

using ir::DType;
using ir::ValueId;

// Bytes decide the width; two different 16-bit formats meet in f32.
DType widest(DType a, DType b) {
  if (a == b) return a;
  int sa = ir::dtype_size(a), sb = ir::dtype_size(b);
  if (sa == sb) return sa < 4 ? DType::F32 : a;
  return sa > sb ? a : b;
}

class MixedPrecision : public Pass {
 public:
  std::string_view name() const override { return "mixed_precision"; }

  bool run(ir::Graph& g, ir::Diagnostics& diag) override {
    if (g.config.precision.policy == ir::PrecisionPolicy::FP32) return false;
    NAPKIN_INTERNAL_CHECK(g.updates.empty(), "mixed precision runs on the forward graph, before the optimizer");
    const DType low = ir::low_precision_dtype(g.config.precision.policy);
    const std::vector<bool> selected = select_fp32_overrides(g, &diag);
    if (diag.has_errors()) return false;

    ir::Builder b(g);
    const std::vector<ir::NodeId> forward = g.schedule();
    for (ir::NodeId id : forward) {
      const ir::Node n = g.node(id);  // a copy: adding casts grows the node storage
      NAPKIN_INTERNAL_CHECK(n.phase == ir::Phase::Forward, "mixed precision runs before autodiff");
      b.set_loc(n.loc);
      b.set_scope(n.scope);
      std::vector<ValueId> inputs = n.inputs;
      switch (amp_rule(n.op, selected[id])) {
        case AmpRule::AsWritten: break;
        case AmpRule::Fp32Override:
        case AmpRule::Fp32Op:
          for (ValueId& v : inputs)
            if (floating(g, v) && dtype(g, v) != DType::F32) v = convert(b, v, DType::F32, "fp32 op input");
          break;
        case AmpRule::Contraction:
          for (ValueId& v : inputs)
            if (floating(g, v) && dtype(g, v) != low)
              v = convert(b, v, low, rooted_in_param(g, v) ? "param low-precision copy" : "matmul input");
          break;
        case AmpRule::FollowsInputs: promote(b, inputs); break;
      }
      changed_ = changed_ || inputs != n.inputs;
      g.node(id).inputs = inputs;
      retype(g, id);
      schedule_.push_back(id);
    }
    g.mutable_schedule() = schedule_;
    return changed_;
  }

 private:
  std::vector<ir::NodeId> schedule_;
  std::map<std::pair<ValueId, DType>, ValueId> converted_;
  bool changed_ = false;

  static bool floating(const ir::Graph& g, ValueId v) { return ir::is_floating(dtype(g, v)); }
  static DType dtype(const ir::Graph& g, ValueId v) { return g.value(v).type.dtype; }

  static const ir::Node* view_producer(const ir::Graph& g, ValueId v) {
    ir::NodeId p = g.value(v).producer;
    if (p == ir::kNoNode) return nullptr;
    const ir::Node& n = g.node(p);
    return ir::op_info(n.op).op_class == ir::OpClass::View ? &n : nullptr;
  }

  // A parameter, or a view (of a view ...) of one.
  static bool rooted_in_param(const ir::Graph& g, ValueId v) {
    while (const ir::Node* view = view_producer(g, v)) v = view->in(0);
    return g.value(v).kind == ir::ValueKind::Param;
  }

  // `v` in dtype `to`, built once per (value, dtype). A view of a parameter is
  // remade on the parameter's cast, so that the parameter is cast once however
  // its users view it; a scalar constant is remade in `to`.
  ValueId convert(ir::Builder& b, ValueId v, DType to, const char* why) {
    auto key = std::make_pair(v, to);
    if (auto it = converted_.find(key); it != converted_.end()) return it->second;
    ir::Graph& g = b.graph();
    ValueId result;
    const ir::Value value = g.value(v);
    const ir::Node* view = view_producer(g, v);
    if (view && rooted_in_param(g, v)) {
      const ir::Node copy = *view;
      ValueId base = convert(b, copy.in(0), to, why);
      result = emit(b, copy.op, {base}, copy.attrs);
      b.rename_dims(result, value.type.dims);
    } else if (value.producer != ir::kNoNode && g.node(value.producer).op == ir::Op::Constant) {
      result = emit(b, ir::Op::Constant, {},
                    {{"value", g.node(value.producer).attrs.get_double("value")}, {"dtype", to}});
    } else {
      result = emit(b, ir::Op::Cast, {v}, {{"dtype", to}, {kAmpCastAttr, std::string(why)}});
    }
    converted_[key] = result;
    return result;
  }

  ValueId emit(ir::Builder& b, ir::Op op, std::vector<ValueId> inputs, ir::Attrs attrs) {
    ValueId v = b.must(b.add(op, std::move(inputs), std::move(attrs)));
    schedule_.push_back(b.graph().value(v).producer);
    return v;
  }

  // "follows inputs": the widest floating dtype among tensor operands (scalars
  // when there are only scalars); every other floating operand converted to it.
  void promote(ir::Builder& b, std::vector<ValueId>& inputs) {
    const ir::Graph& g = b.graph();
    bool any_tensor = false;
    for (ValueId v : inputs) any_tensor = any_tensor || (floating(g, v) && g.value(v).type.rank() > 0);
    std::optional<DType> result;
    for (ValueId v : inputs)
      if (floating(g, v) && (g.value(v).type.rank() > 0 || !any_tensor))
        result = result ? widest(*result, dtype(g, v)) : dtype(g, v);
    if (!result) return;
    for (ValueId& v : inputs)
      if (floating(g, v) && dtype(g, v) != *result)
        v = convert(b, v, *result, g.value(v).type.rank() > 0 || !any_tensor ? "promotion" : "scalar operand");
  }

  // Recomputes a node's output dtypes from its (possibly new) operands; shapes
  // and dim names stay.
  static void retype(ir::Graph& g, ir::NodeId id) {
    const ir::Node& n = g.node(id);
    std::vector<const ir::TensorType*> types;
    for (ValueId v : n.inputs) types.push_back(&g.value(v).type);
    ir::InferResult r = ir::op_info(n.op).infer(types, n.attrs);
    NAPKIN_INTERNAL_CHECK(r.ok(), "mixed precision made {} ill-typed: {}", ir::op_name(n.op), r.error);
    for (size_t i = 0; i < n.outputs.size(); ++i) g.value(n.outputs[i]).type.dtype = r.outputs.at(i).dtype;
  }
};

}  // namespace

std::unique_ptr<Pass> make_mixed_precision_pass() { return std::make_unique<MixedPrecision>(); }

}  // namespace napkin::passes
