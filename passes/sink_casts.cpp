#include "passes/sink_casts.h"

#include <map>
#include <vector>

#include "ir/builder.h"
#include "ir/dtype.h"
#include "ir/internal_check.h"
#include "ir/use_list.h"

namespace napkin::passes {

namespace {

using ir::DType;
using ir::NodeId;
using ir::Op;
using ir::ValueId;

bool is_view(Op op) { return ir::op_info(op).op_class == ir::OpClass::View; }

// Whether every value of `from` is a value of `to` (and so survives the round
// trip from -> to -> from bit for bit).
bool exact_widening(DType from, DType to) {
  if (!ir::is_floating(from) || !ir::is_floating(to) || from == to) return false;
  const ir::FloatInfo f = ir::float_info(from), t = ir::float_info(to);
  return t.exponent_bits >= f.exponent_bits && t.mantissa_bits >= f.mantissa_bits &&
         t.smallest_subnormal <= f.smallest_subnormal;
}

// A value seen through views: `base`, then the view nodes that make the value.
struct Chain {
  ValueId base = ir::kNoValue;
  std::vector<NodeId> views;  // outermost last
};

// Walks up from v through every view producer: the value it views and the views.
Chain views_above(const ir::Graph& g, ValueId v) {
  Chain c;
  for (NodeId p = g.value(v).producer; p != ir::kNoNode && is_view(g.node(p).op); p = g.value(v).producer) {
    c.views.insert(c.views.begin(), p);
    v = g.node(p).in(0);
  }
  c.base = v;
  return c;
}

// Walks up from v through view producers, each view value read once.
Chain up_through_views(const ir::Graph& g, const ir::UseList& r, ValueId v) {
  Chain c;
  while (true) {
    NodeId p = g.value(v).producer;
    if (p == ir::kNoNode || !is_view(g.node(p).op)) break;
    if (!r.single(v)) break;
    c.views.insert(c.views.begin(), p);
    v = g.node(p).in(0);
  }
  c.base = v;
  return c;
}

class SinkCasts : public Pass {
 public:
  explicit SinkCasts(CastPlacement& placement) : count_(placement) {}
  std::string_view name() const override { return "sink_casts"; }

  bool run(ir::Graph& g, ir::Diagnostics&) override {
    bool changed = false;
    changed |= round(g, &SinkCasts::cast_after_concat, count_.concats);
    changed |= round(g, &SinkCasts::round_trip, count_.round_trips);
    changed |= round(g, &SinkCasts::cast_before_views, count_.views);
    changed |= round(g, &SinkCasts::reduce_wider, count_.reductions);
    changed |= round(g, &SinkCasts::norm_stores_cast, count_.norms);
    changed |= round(g, &SinkCasts::norm_grad_reads_narrow, count_.norm_grads);
    return changed;
  }

 private:
  using Rule = bool (SinkCasts::*)(ir::Graph&, const ir::UseList&, NodeId);

  // Applies `rule` at every scheduled node, then places the nodes it built;
  // adds the rewrites to `count`.
  bool round(ir::Graph& g, Rule rule, int& count) {
    inserted_.clear();
    const ir::UseList uses(g);  // rebuilt each round: a round reads the uses the last one left
    const std::vector<NodeId> schedule = g.schedule();
    bool changed = false;
    for (NodeId id : schedule)
      if ((this->*rule)(g, uses, id)) changed = true, ++count;
    if (!changed) return false;
    g.insert_after(schedule, inserted_);
    return true;
  }

  // A builder that makes nodes like `like` and files them after `anchor`.
  struct Site {
    ir::Builder b;
    NodeId anchor;
    int first;
  };
  Site site(ir::Graph& g, NodeId like, NodeId anchor) {
    Site s{ir::Builder(g), anchor, g.num_nodes()};
    const ir::Node& n = g.node(like);
    s.b.set_loc(n.loc);
    s.b.set_scope(n.scope);
    s.b.set_phase(n.phase);
    s.b.set_origin(n.origin);
    return s;
  }
  void file(ir::Graph& g, const Site& s) {
    for (int k = s.first; k < g.num_nodes(); ++k) inserted_[s.anchor].push_back(k);
  }

  // The views `views` (nodes of the graph) again, over `base`.
  static ValueId rebuild(ir::Graph& g, ir::Builder& b, ValueId base, const std::vector<NodeId>& views) {
    ValueId v = base;
    for (NodeId id : views) {
      const ir::Node view = g.node(id);  // a copy: building may move the node storage
      v = b.must(b.add(view.op, {v}, view.attrs));
      b.rename_dims(v, g.value(view.out()).type.dims);
    }
    return v;
  }

  // Every use of `old` becomes `now` (Graph::replace_uses); `now` takes
  // old's name where it has none.
  static void replace_uses(ir::Graph& g, ValueId old, ValueId now) {
    g.replace_uses(old, now);
    if (!g.value(old).name.empty() && g.value(now).name.empty()) std::swap(g.value(old).name, g.value(now).name);
  }

  // Rule 2: concat(view_i(cast(a_i, T))) -> cast(concat(view_i(a_i)), T).
  bool cast_after_concat(ir::Graph& g, const ir::UseList& r, NodeId id) {
    const ir::Node& n = g.node(id);
    if (n.op != Op::Concat || n.inputs.empty()) return false;
    const DType t = g.value(n.out()).type.dtype;
    DType s = t;
    NodeId first_cast = ir::kNoNode;
    std::vector<Chain> chains;
    for (ValueId x : n.inputs) {
      if (!r.single(x)) return false;
      Chain c = up_through_views(g, r, x);
      const NodeId p = g.value(c.base).producer;
      if (p == ir::kNoNode || g.node(p).op != Op::Cast || !r.single(c.base)) return false;
      const DType from = g.value(g.node(p).in(0)).type.dtype;
      if (first_cast == ir::kNoNode) s = from, first_cast = p;
      if (from != s || from == t) return false;
      c.base = g.node(p).in(0);
      chains.push_back(std::move(c));
    }
    const ir::Node concat = n;  // a copy: building moves the node storage
    Site at = site(g, id, id);
    std::vector<ValueId> parts;
    for (const Chain& c : chains) parts.push_back(rebuild(g, at.b, c.base, c.views));
    const ValueId narrow = at.b.must(at.b.add(Op::Concat, parts, concat.attrs));
    const ValueId cast = at.b.must(at.b.add(Op::Cast, {narrow}, g.node(first_cast).attrs));
    at.b.rename_dims(narrow, g.value(concat.out()).type.dims);
    at.b.rename_dims(cast, g.value(concat.out()).type.dims);
    replace_uses(g, concat.out(), cast);
    file(g, at);
    return true;
  }

  // Rule 3: cast(view(cast(x, T)), dtype(x)) -> view(x) for an exact widening.
  bool round_trip(ir::Graph& g, const ir::UseList& r, NodeId id) {
    const ir::Node& n = g.node(id);
    if (n.op != Op::Cast) return false;
    const DType to = g.value(n.out()).type.dtype;
    // Views here may be read by others too: rebuilding them costs nothing.
    const Chain c = views_above(g, n.in(0));
    const ValueId v = c.base;
    const NodeId inner = g.value(v).producer;
    if (inner == ir::kNoNode || g.node(inner).op != Op::Cast) return false;
    const ValueId x = g.node(inner).in(0);
    if (g.value(x).type.dtype != to || !exact_widening(to, g.value(v).type.dtype)) return false;
    for (NodeId reader : r.readers(n.out()))  // x seen through the views is a view: nothing may view the cast
      if (is_view(g.node(reader).op)) return false;
    const ValueId out = n.out();
    Site at = site(g, id, id);
    const ValueId same = rebuild(g, at.b, x, c.views);
    replace_uses(g, out, same);
    file(g, at);
    return true;
  }

  // Rule 1: every reader of v is cast(view_i(v), T) -> c = cast(v, T); view_i(c).
  bool cast_before_views(ir::Graph& g, const ir::UseList& r, NodeId id) {
    const ir::Node& producer = g.node(id);
    if (is_view(producer.op) || producer.outputs.size() != 1) return false;
    const ValueId v = producer.out();
    if (r.escapes(v) || !ir::is_floating(g.value(v).type.dtype)) return false;
    struct Reader {
      std::vector<NodeId> views;  // from v to the cast's input
      NodeId cast = ir::kNoNode;
    };
    struct Pending {
      std::vector<NodeId> views;  // from v to `value`
      ValueId value;
    };
    std::vector<Reader> readers;
    bool through_view = false;
    // Depth-first over the views of v: every leaf must be a cast to one dtype.
    std::vector<Pending> stack{{{}, v}};
    DType t = g.value(v).type.dtype;
    NodeId first_cast = ir::kNoNode;
    while (!stack.empty()) {
      const Pending at = stack.back();
      stack.pop_back();
      if (r.escapes(at.value) || r.readers(at.value).empty()) return false;
      for (NodeId reader : r.readers(at.value)) {
        const ir::Node& rn = g.node(reader);
        if (is_view(rn.op)) {
          Pending next{at.views, rn.out()};
          next.views.push_back(reader);
          through_view = true;
          stack.push_back(std::move(next));
          continue;
        }
        if (rn.op != Op::Cast) return false;
        const DType to = g.value(rn.out()).type.dtype;
        if (first_cast == ir::kNoNode) t = to, first_cast = reader;
        if (to != t || to == g.value(v).type.dtype) return false;
        // What reads the cast must take strided operands.
        for (NodeId user : r.readers(rn.out())) {
          const ir::OpClass cls = ir::op_info(g.node(user).op).op_class;
          if (cls != ir::OpClass::Attention && cls != ir::OpClass::Contraction && cls != ir::OpClass::Elementwise)
            return false;
        }
        if (r.escapes(rn.out())) return false;
        readers.push_back({at.views, reader});
      }
    }
    if (!through_view) return false;  // a direct cast is fusion's to merge
    Site at = site(g, first_cast, id);
    at.b.set_phase(g.node(id).phase);  // with its producer: fusion can then merge the two
    at.b.set_scope(g.node(id).scope);
    const ValueId c = at.b.must(at.b.add(Op::Cast, {v}, g.node(first_cast).attrs));
    at.b.rename_dims(c, g.value(v).type.dims);
    for (const Reader& rd : readers) {
      const ValueId old = g.node(rd.cast).out();
      replace_uses(g, old, rebuild(g, at.b, c, rd.views));
    }
    file(g, at);
    return true;
  }

  // Rule 4: reduce(view(cast(y, T))) -> reduce(view(y), dtype=T) for an
  // exact widening into a type computed in the same registers (bf16, f16,
  // fp8 into f32): the reduction widens each element as it loads it.
  bool reduce_wider(ir::Graph& g, const ir::UseList& r, NodeId id) {
    (void)r;
    const ir::Node& n = g.node(id);
    if (ir::op_info(n.op).op_class != ir::OpClass::Reduction || n.inputs.size() != 1 || n.attrs.has("dtype")) return false;
    const Chain c = views_above(g, n.in(0));
    const ValueId v = c.base;
    const NodeId cast = g.value(v).producer;
    if (cast == ir::kNoNode || g.node(cast).op != Op::Cast) return false;
    const ValueId y = g.node(cast).in(0);
    const DType from = g.value(y).type.dtype, to = g.value(v).type.dtype;
    if (to != DType::F32 || from == DType::F64 || !exact_widening(from, to)) return false;
    const ir::Node reduce = n;  // a copy: building moves the node storage
    Site at = site(g, id, id);
    const ValueId narrow = rebuild(g, at.b, y, c.views);
    ir::Attrs attrs = reduce.attrs;
    attrs.set("dtype", to);
    const ValueId out = at.b.must(at.b.add(reduce.op, {narrow}, attrs));
    at.b.rename_dims(out, g.value(reduce.out()).type.dims);
    replace_uses(g, reduce.out(), out);
    file(g, at);
    return true;
  }

  // Rule 5: cast(norm(x, ...), T), the cast the norm's only reader ->
  // norm(x, ..., dtype=T): the norm rounds its f32 result to T on store.
  bool norm_stores_cast(ir::Graph& g, const ir::UseList& r, NodeId id) {
    const ir::Node& n = g.node(id);
    if (n.op != Op::Cast) return false;
    const ValueId x = n.in(0);
    const NodeId p = g.value(x).producer;
    if (p == ir::kNoNode || g.value(x).is_view() || !r.single(x)) return false;
    const Op op = g.node(p).op;
    if ((op != Op::LayerNorm && op != Op::RMSNorm) || g.node(p).attrs.has("dtype")) return false;
    const DType to = g.value(n.out()).type.dtype;
    if (!ir::is_floating(to)) return false;
    const ir::Node norm = g.node(p);  // a copy: building moves the node storage
    const ValueId out = n.out();
    Site at = site(g, p, id);
    ir::Attrs attrs = norm.attrs;
    attrs.set("dtype", to);
    const ValueId stored = at.b.must(at.b.add(norm.op, norm.inputs, attrs));
    at.b.rename_dims(stored, g.value(out).type.dims);
    replace_uses(g, out, stored);
    file(g, at);
    return true;
  }

  // Rule 6: norm_grad(x, g, cast(y, f32)[, r]) -> norm_grad(x, g, y[, r]) for
  // an exact widening of bf16 or f16: the kernel widens dy as it loads it.
  // The cast is left to its other readers, if any.
  bool norm_grad_reads_narrow(ir::Graph& g, const ir::UseList& r, NodeId id) {
    (void)r;
    ir::Node& n = g.node(id);
    if ((n.op != Op::LayerNormGrad && n.op != Op::RMSNormGrad) || n.inputs.size() < 3) return false;
    const ValueId dy = n.in(2);
    const NodeId cast = g.value(dy).producer;
    if (cast == ir::kNoNode || g.value(dy).is_view() || g.node(cast).op != Op::Cast) return false;
    const ValueId y = g.node(cast).in(0);
    const DType from = g.value(y).type.dtype, to = g.value(dy).type.dtype;
    if (to != DType::F32 || g.value(n.in(0)).type.dtype != DType::F32 || (from != DType::BF16 && from != DType::F16) ||
        !g.value(y).type.same_shape(g.value(dy).type))
      return false;
    n.inputs[2] = y;
    return true;
  }

  CastPlacement& count_;
  std::map<NodeId, std::vector<NodeId>> inserted_;  // per anchor: the nodes built to follow it
};

}  // namespace

std::unique_ptr<Pass> make_sink_casts_pass(CastPlacement& placement) { return std::make_unique<SinkCasts>(placement); }

}  // namespace napkin::passes
