// The functions a model may call, one row each: the parameter names (for
// positional and keyword binding and their errors) and how it lowers to IR.
// The unary elementwise functions come from the op table (OpInfo::user_function);
// the others are written here. docs/model-language.md documents every row;
// keep them in step.
#include <fmt/format.h>

#include <cmath>
#include <functional>

#include "frontend/lowering.h"
#include "frontend/suggest.h"
#include "interp/float64_arithmetic.h"
#include "ir/rng.h"
#include "ir/rope.h"

namespace napkin::frontend {

using ir::Op;
using ir::ValueId;

namespace {

using LowerFn = std::function<Operand(Lowerer&, const CallArgs&, const Expr&)>;

struct CallSpec {
  std::string name;
  std::vector<std::string> params;  // in positional order
  size_t required;                  // the first `required` params must be given
  LowerFn lower;
  size_t variadic = 0;              // > 0: positionals after the first `variadic` go to CallArgs::rest
  bool extra_keywords = false;      // unknown keywords go to CallArgs::extra
};

// ---- helpers -----------------------------------------------------------------

std::optional<ValueId> tensor_arg(Lowerer& L, const CallArgs& a, const std::string& name, const Expr& call) {
  return L.need_tensor(*a.get(name), fmt::format("{}: argument '{}'", call.text, name));
}

// f(x) for a unary elementwise op the op table makes a function of its name:
// a number folds at compile time through the op's formula (float64, as the
// interpreter computes it), or the op is built. `integral`: the op maps
// integers to integers (neg, abs, relu), so a folded integer stays usable as
// an index or size.
LowerFn unary(Op op, bool integral) {
  return [op, integral](Lowerer& L, const CallArgs& a, const Expr& call) -> Operand {
    const Operand& x = *a.get("x");
    if (x.kind == Operand::Kind::Number)
      return Operand::num(interp::fold_unary(op, x.number), integral && x.integer, call.offset);
    auto v = tensor_arg(L, a, "x", call);
    if (!v) return Operand::invalid();
    return L.build(op, {*v}, {}, call.offset);
  };
}

// Two operands where either may be a number (it takes the tensor's dtype).
Operand binary(Lowerer& L, Op op, const Operand& x, const Operand& y, const Expr& call) {
  if (!x.ok() || !y.ok()) return Operand::invalid();
  ir::DType dtype = L.common_dtype(x, y);
  auto a = L.to_tensor(x, dtype, call.text);
  auto b = L.to_tensor(y, dtype, call.text);
  if (!a || !b) return Operand::invalid();
  return L.build(op, {*a, *b}, {}, call.offset);
}

// A true/false keyword argument `name` (`what` names it in messages); nullopt
// after reporting a value that is neither.
std::optional<bool> bool_arg(Lowerer& L, const Operand& o, const std::string& what, const std::string& name) {
  auto w = L.need_word(o, what);
  if (!w) return std::nullopt;
  if (*w != "true" && *w != "false") {
    L.error(o.offset, what + " must be true or false", fmt::format("write {0}=true or {0}=false", name));
    return std::nullopt;
  }
  return *w == "true";
}

// Reduction over `axis` (an int, a list of ints, or absent for all axes).
Operand reduce_axes(Lowerer& L, Op op, const CallArgs& a, const Expr& call) {
  auto x = tensor_arg(L, a, "x", call);
  if (!x) return Operand::invalid();
  int rank = L.type(*x).rank();
  std::vector<int64_t> axes;
  const Operand* axis = a.get("axis");
  if (!axis) {
    for (int i = 0; i < rank; ++i) axes.push_back(i);
  } else {
    std::vector<Operand> items = axis->kind == Operand::Kind::List ? axis->items : std::vector<Operand>{*axis};
    for (const Operand& item : items) {
      auto ax = L.need_axis(item, rank, fmt::format("{}: axis", call.text));
      if (!ax) return Operand::invalid();
      if (std::find(axes.begin(), axes.end(), *ax) != axes.end()) {
        L.error(item.offset, fmt::format("{}: axis {} is listed twice", call.text, *ax), "list each axis once");
        return Operand::invalid();
      }
      axes.push_back(*ax);
    }
    std::sort(axes.begin(), axes.end());
  }
  int64_t keep = 0;
  if (const Operand* k = a.get("keepdims")) {
    auto b = bool_arg(L, *k, "keepdims", "keepdims");
    if (!b) return Operand::invalid();
    keep = *b;
  }
  return L.build(op, {*x}, {{"axes", axes}, {"keepdims", keep}}, call.offset);
}

// max/min: elementwise with a second operand, a reduction with axis=.
LowerFn max_or_min(Op elementwise, Op reduction) {
  return [=](Lowerer& L, const CallArgs& a, const Expr& call) -> Operand {
    if (const Operand* y = a.get("y")) {
      if (a.get("axis") || a.get("keepdims")) {
        L.error(call.offset, fmt::format("{} takes either a second operand or axis=/keepdims=, not both", call.text),
                fmt::format("{0}(x, y) is elementwise; {0}(x, axis=a) reduces", call.text));
        return Operand::invalid();
      }
      return binary(L, elementwise, *a.get("x"), *y, call);
    }
    return reduce_axes(L, reduction, a, call);
  };
}

Operand lower_softmax_like(Lowerer& L, Op op, const CallArgs& a, const Expr& call) {
  auto x = tensor_arg(L, a, "x", call);
  if (!x) return Operand::invalid();
  int64_t axis = L.type(*x).rank() - 1;
  if (const Operand* ax = a.get("axis")) {
    auto v = L.need_axis(*ax, L.type(*x).rank(), fmt::format("{}: axis", call.text));
    if (!v) return Operand::invalid();
    axis = *v;
  }
  return L.build(op, {*x}, {{"axis", axis}}, call.offset);
}

double eps_or(Lowerer& L, const CallArgs& a, double fallback, bool& ok) {
  const Operand* e = a.get("eps");
  if (!e) return fallback;
  auto v = L.need_number(*e, "eps");
  if (!v || *v <= 0) {
    if (v) L.error(e->offset, fmt::format("eps must be positive, got {}", *v), "for example eps=1e-5");
    ok = false;
    return 0;
  }
  return *v;
}

std::optional<ir::DType> dtype_arg(Lowerer& L, const Operand& o) {
  auto w = L.need_word(o, "dtype");
  if (!w) return std::nullopt;
  auto t = ir::parse_dtype(*w);
  if (!t) L.error(o.offset, fmt::format("unknown dtype '{}'", *w), fmt::format("known dtypes: {}", ir::dtype_names_list()));
  return t;
}

// An axis of x for `what`: an integer (negative counts from the end) or the
// name of one of x's axes as its type prints it (seq_axis=seq; a dim's name
// evaluates to its size, and a bare name that is no dim to a word).
std::optional<int64_t> axis_by_index_or_name(Lowerer& L, const Operand& o, const ir::TensorType& x,
                                             const std::string& what) {
  const bool named = o.kind == Operand::Kind::Word || o.kind == Operand::Kind::String ||
                     (o.kind == Operand::Kind::Number && !o.text.empty());
  if (!named) return L.need_axis(o, x.rank(), what);
  std::vector<int64_t> found;
  std::vector<std::string> names;
  for (int i = 0; i < x.rank(); ++i) {
    if (x.dims[i].name == o.text) found.push_back(i);
    if (!x.dims[i].name.empty()) names.push_back(x.dims[i].name);
  }
  if (found.size() == 1) return found[0];
  if (found.empty())
    L.error(o.offset, fmt::format("{}: '{}' is not an axis of {}{}", what, o.text, ir::to_string(x), did_you_mean(o.text, names)),
            fmt::format("name one of its axes or give its index (-{}..{})", x.rank(), x.rank() - 1));
  else
    L.error(o.offset, fmt::format("{}: {} axes of {} are named '{}'", what, found.size(), ir::to_string(x), o.text),
            "give the axis by its index instead");
  return std::nullopt;
}

// A word argument written bare or quoted; a bare word that is also a dim's
// name (a model with a dim `half`) is still the word.
std::optional<std::string> word_arg(Lowerer& L, const Operand& o, const std::string& what) {
  if (o.kind == Operand::Kind::Number && !o.text.empty()) return o.text;
  return L.need_word(o, what);
}

// An optional argument the model may also leave out by writing None.
const Operand* given(const CallArgs& a, const std::string& name) {
  const Operand* o = a.get(name);
  return o && o->kind == Operand::Kind::Word && o->text == "None" ? nullptr : o;
}

// rope(x, theta, style, axis, seq_axis, positions, factor, low_freq_factor,
// high_freq_factor, original_context): ir/rope.h's RopeParams, each number
// checked where it is written.
Operand lower_rope(Lowerer& L, const CallArgs& a, const Expr& call) {
  auto x = tensor_arg(L, a, "x", call);
  if (!x) return Operand::invalid();
  const ir::TensorType& xt = L.type(*x);
  ir::RopeParams p;
  ir::Attrs attrs;
  if (xt.rank() < 2) {  // the op's shape rule says what is wrong
    ir::set_rope_attrs(attrs, p);
    return L.build(Op::Rope, {*x}, attrs, call.offset);
  }
  p.axis = xt.rank() - 1;
  p.seq_axis = xt.rank() - 2;
  bool ok = true;
  // A number argument `name` that must be positive (`whole`: an integer).
  auto positive = [&](const char* name, bool whole, const char* hint) -> std::optional<double> {
    const Operand* o = given(a, name);
    if (!o) return std::nullopt;
    const std::string what = fmt::format("rope: {}", name);
    std::optional<double> v;
    if (whole) {
      if (auto i = L.need_int(*o, what)) v = static_cast<double>(*i);
    } else {
      v = L.need_number(*o, what);
    }
    if (v && !(*v > 0)) {
      L.error(o->offset, fmt::format("rope: {} must be positive, got {}", name, *v), hint);
      v.reset();
    }
    if (!v) ok = false;
    return v;
  };
  if (auto v = positive("theta", false, "theta is the frequencies' base: 10000 for Llama 2, 500000 for Llama 3"))
    p.theta = *v;
  if (auto v = positive("factor", false, "factor is Llama 3.1's frequency scaling, e.g. factor=8; leave it out for none"))
    p.factor = *v;
  if (auto v = positive("low_freq_factor", false, "Llama 3.1 uses low_freq_factor=1")) p.low_freq_factor = *v;
  if (auto v = positive("high_freq_factor", false, "Llama 3.1 uses high_freq_factor=4")) p.high_freq_factor = *v;
  if (auto v = positive("original_context", true, "the context the model was trained at before scaling, e.g. 8192"))
    p.original_context = static_cast<int64_t>(*v);
  if (ok && !(p.high_freq_factor > p.low_freq_factor)) {
    const Operand* at = given(a, "high_freq_factor") ? given(a, "high_freq_factor") : given(a, "low_freq_factor");
    L.error(at ? at->offset : call.offset,
            fmt::format("rope: high_freq_factor ({}) must exceed low_freq_factor ({})", p.high_freq_factor,
                        p.low_freq_factor),
            "wavelengths between original_context / high_freq_factor and original_context / low_freq_factor are "
            "interpolated; Llama 3.1 uses 1 and 4");
    ok = false;
  }
  if (const Operand* st = a.get("style")) {
    auto w = word_arg(L, *st, "rope: style");
    if (w && *w != "half" && *w != "interleaved") {
      L.error(st->offset, fmt::format("rope: unknown style '{}'", *w),
              "style=half rotates element j with j + head_dim/2 (Hugging Face, GPT-NeoX); style=interleaved rotates "
              "2j with 2j+1 (Meta's original Llama)");
      w.reset();
    }
    if (w) p.style = *w == "interleaved" ? ir::RopeStyle::Interleaved : ir::RopeStyle::Half;
    ok = ok && w;
  }
  for (const char* name : {"axis", "seq_axis"}) {
    const Operand* o = a.get(name);
    if (!o) continue;
    auto v = axis_by_index_or_name(L, *o, xt, fmt::format("rope: {}", name));
    if (v) (std::string(name) == "axis" ? p.axis : p.seq_axis) = *v;
    ok = ok && v;
  }
  if (ok && p.axis == p.seq_axis) {
    const Operand* at = a.get("seq_axis") ? a.get("seq_axis") : a.get("axis");
    L.error(at ? at->offset : call.offset,
            fmt::format("rope: axis and seq_axis are both axis {} of {}", p.axis, ir::to_string(xt)),
            "axis= is the rotated axis (head_dim), seq_axis= the one whose index is the position (seq)");
    ok = false;
  }
  std::vector<ValueId> inputs{*x};
  if (given(a, "positions")) {
    auto pos = tensor_arg(L, a, "positions", call);
    // The kernels read the positions as one contiguous vector.
    if (pos) inputs.push_back(L.builder_at(call.offset).unit_inner_stride(*pos));
    ok = ok && pos;
    p.explicit_positions = true;
  }
  if (!ok) return Operand::invalid();
  ir::set_rope_attrs(attrs, p);
  return L.build(Op::Rope, inputs, attrs, call.offset);
}

// ---- the table ---------------------------------------------------------------

const std::vector<CallSpec>& call_table() {
  static const std::vector<CallSpec> table = [] {
    std::vector<CallSpec> t;
    auto add = [&](CallSpec s) { t.push_back(std::move(s)); };
    // Elementwise, unary: the op table's user functions, f(x) named as the op.
    for (int i = 0; i < ir::kNumOps; ++i) {
      const ir::OpInfo& info = ir::op_info(static_cast<Op>(i));
      if (info.user_function == ir::UserFunction::None) continue;
      add({std::string(info.name), {"x"}, 1, unary(info.op, info.user_function == ir::UserFunction::UnaryIntegral)});
    }
    add({"gelu", {"x", "approximate"}, 1, [](Lowerer& L, const CallArgs& a, const Expr& call) -> Operand {
           auto x = tensor_arg(L, a, "x", call);
           if (!x) return Operand::invalid();
           std::string approximate = "tanh";
           if (const Operand* ap = a.get("approximate")) {
             auto w = L.need_word(*ap, "approximate");
             if (!w) return Operand::invalid();
             if (*w != "tanh" && *w != "none") {
               L.error(ap->offset, fmt::format("gelu: approximate must be \"tanh\" or \"none\" (exact erf), got \"{}\"", *w),
                       "write approximate=\"tanh\" or approximate=\"none\"");
               return Operand::invalid();
             }
             approximate = *w;
           }
           return L.build(Op::Gelu, {*x}, {{"approximate", approximate}}, call.offset);
         }});
    add({"cast", {"x", "dtype"}, 2, [](Lowerer& L, const CallArgs& a, const Expr& call) -> Operand {
           auto x = tensor_arg(L, a, "x", call);
           auto t = dtype_arg(L, *a.get("dtype"));
           if (!x || !t) return Operand::invalid();
           return L.build(Op::Cast, {*x}, {{"dtype", *t}}, call.offset);
         }});
    // Elementwise, binary and ternary.
    add({"pow", {"x", "y"}, 2, [](Lowerer& L, const CallArgs& a, const Expr& call) {
           return binary(L, Op::Pow, *a.get("x"), *a.get("y"), call);
         }});
    add({"maximum", {"x", "y"}, 2, [](Lowerer& L, const CallArgs& a, const Expr& call) {
           return binary(L, Op::Maximum, *a.get("x"), *a.get("y"), call);
         }});
    add({"minimum", {"x", "y"}, 2, [](Lowerer& L, const CallArgs& a, const Expr& call) {
           return binary(L, Op::Minimum, *a.get("x"), *a.get("y"), call);
         }});
    add({"max", {"x", "y", "axis", "keepdims"}, 1, max_or_min(Op::Maximum, Op::ReduceMax)});
    add({"min", {"x", "y", "axis", "keepdims"}, 1, max_or_min(Op::Minimum, Op::ReduceMin)});
    add({"where", {"cond", "x", "y"}, 3, [](Lowerer& L, const CallArgs& a, const Expr& call) -> Operand {
           auto c = tensor_arg(L, a, "cond", call);
           const Operand &x = *a.get("x"), &y = *a.get("y");
           ir::DType dtype = L.common_dtype(x, y);
           auto tx = L.to_tensor(x, dtype, "where");
           auto ty = L.to_tensor(y, dtype, "where");
           if (!c || !tx || !ty) return Operand::invalid();
           return L.build(Op::Where, {*c, *tx, *ty}, {}, call.offset);
         }});
    add({"triu", {"x", "k"}, 1, [](Lowerer& L, const CallArgs& a, const Expr& call) -> Operand {
           auto x = tensor_arg(L, a, "x", call);
           int64_t k = 0;
           if (const Operand* ko = a.get("k")) {
             auto v = L.need_int(*ko, "triu: k");
             if (!v) return Operand::invalid();
             k = *v;
           }
           if (!x) return Operand::invalid();
           return L.build(Op::Triu, {*x}, {{"k", k}}, call.offset);
         }});
    add({"causal_mask", {"x"}, 1, [](Lowerer& L, const CallArgs& a, const Expr& call) -> Operand {
           auto x = tensor_arg(L, a, "x", call);
           if (!x) return Operand::invalid();
           return L.build(Op::CausalMask, {*x}, {}, call.offset);
         }});
    // dropout(x, p): ir/rng.h. p = 0 is x itself; each dropout gets its own
    // stream (the id of its node), so two dropouts never share a mask.
    add({"dropout", {"x", "p"}, 2, [](Lowerer& L, const CallArgs& a, const Expr& call) -> Operand {
           auto x = tensor_arg(L, a, "x", call);
           const Operand& po = *a.get("p");
           auto p = L.need_number(po, "dropout: p");
           if (!x || !p) return Operand::invalid();
           if (!(*p >= 0 && *p < 1)) {
             L.error(po.offset, fmt::format("dropout: p must be in [0, 1), got {}", *p),
                     "p is the probability of dropping an element, e.g. dropout(x, 0.1); 0 turns it off");
             return Operand::invalid();
           }
           if (*p == 0) return Operand::tensor(*x, call.offset);
           ir::Builder& b = L.builder_at(call.offset);
           std::vector<ValueId> inputs{*x};
           for (ValueId w : ir::rng_words(b)) inputs.push_back(w);
           int64_t stream = b.graph().num_nodes();  // the id the dropout node gets
           return L.build(Op::Dropout, inputs, {{"p", *p}, {"stream", stream}}, call.offset);
         }});
    add({"arange", {"n", "dtype"}, 1, [](Lowerer& L, const CallArgs& a, const Expr& call) -> Operand {
           const Operand& n = *a.get("n");
           auto count = L.need_int(n, "arange: n");
           ir::DType dtype = ir::DType::I32;
           if (const Operand* d = a.get("dtype")) {
             auto t = dtype_arg(L, *d);
             if (!t) return Operand::invalid();
             dtype = *t;
           }
           if (!count) return Operand::invalid();
           if (*count <= 0) {  // checked here to point at n, not at the call
             L.error(n.offset, fmt::format("arange needs a positive length, got {}", *count),
                     "arange(n) is 0, 1, ..., n-1: pass n >= 1, e.g. a dim such as arange(seq)");
             return Operand::invalid();
           }
           Operand r = L.build(Op::Iota, {}, {{"n", *count}, {"dtype", dtype}}, call.offset);
           if (r.ok() && !n.text.empty()) L.builder_at(call.offset).rename_dims(r.value, {{*count, n.text}});
           return r;
         }});
    // Reductions.
    add({"sum", {"x", "axis", "keepdims"}, 1, [](Lowerer& L, const CallArgs& a, const Expr& call) {
           return reduce_axes(L, Op::ReduceSum, a, call);
         }});
    add({"mean", {"x", "axis", "keepdims"}, 1, [](Lowerer& L, const CallArgs& a, const Expr& call) {
           return reduce_axes(L, Op::ReduceMean, a, call);
         }});
    // Contractions and einops.
    add({"matmul", {"a", "b"}, 2, [](Lowerer& L, const CallArgs& a, const Expr& call) -> Operand {
           auto x = tensor_arg(L, a, "a", call);
           auto y = tensor_arg(L, a, "b", call);
           if (!x || !y) return Operand::invalid();
           return L.build(Op::MatMul, {*x, *y}, {}, call.offset);
         }});
    // einsum(a, b, ..., pattern): the pattern is the last positional, or pattern=.
    add({"einsum", {"a", "pattern"}, 1,
         [](Lowerer& L, const CallArgs& a, const Expr& call) -> Operand {
           std::vector<Operand> operands{*a.get("a")};
           operands.insert(operands.end(), a.rest.begin(), a.rest.end());
           Operand pattern;
           if (const Operand* keyword = a.get("pattern")) {
             pattern = *keyword;
           } else {
             if (operands.size() < 2 || operands.back().kind == Operand::Kind::Tensor) {
               L.error(operands.size() < 2 ? call.offset : operands.back().offset,
                       "einsum needs a pattern string after its operands",
                       "write einsum(a, b, \"i j, j k -> i k\"): one axis list per operand, then '->' and the "
                       "result's axes");
               return Operand::invalid();
             }
             // An undefined name where the pattern goes is reported as one.
             if (operands.back().kind == Operand::Kind::Word) {
               L.need_tensor(operands.back(), "einsum: operand");
               return Operand::invalid();
             }
             pattern = operands.back();
             operands.pop_back();
           }
           for (size_t i = 0; i < operands.size(); ++i)
             if (!L.need_tensor(operands[i], fmt::format("einsum: operand {}", i + 1))) return Operand::invalid();
           return lower_einsum(L, operands, pattern, call.offset);
         },
         1});
    add({"rearrange", {"x", "pattern"}, 2,
         [](Lowerer& L, const CallArgs& a, const Expr& call) -> Operand {
           auto x = tensor_arg(L, a, "x", call);
           if (!x) return Operand::invalid();
           return lower_rearrange(L, *x, *a.get("pattern"), a.extra, call.offset);
         },
         0, true});
    add({"reduce", {"x", "pattern", "reduction"}, 3,
         [](Lowerer& L, const CallArgs& a, const Expr& call) -> Operand {
           auto x = tensor_arg(L, a, "x", call);
           auto how = L.need_word(*a.get("reduction"), "reduce: reduction");
           if (!x || !how) return Operand::invalid();
           return lower_reduce(L, *x, *a.get("pattern"), *a.get("reduction"), a.extra, call.offset);
         },
         0, true});
    add({"transpose", {"x", "dim0", "dim1"}, 1, [](Lowerer& L, const CallArgs& a, const Expr& call) -> Operand {
           auto x = tensor_arg(L, a, "x", call);
           if (!x) return Operand::invalid();
           int rank = L.type(*x).rank();
           if (rank < 2) {
             L.error(call.offset, fmt::format("transpose needs at least 2 axes, got {}", ir::to_string(L.type(*x))),
                     "a vector has nothing to transpose; use rearrange to add an axis");
             return Operand::invalid();
           }
           auto pick = [&](const char* name, int64_t fallback) -> std::optional<int64_t> {
             const Operand* o = a.get(name);
             return o ? L.need_axis(*o, rank, fmt::format("transpose: {}", name)) : std::optional<int64_t>(fallback);
           };
           auto d0 = pick("dim0", rank - 2), d1 = pick("dim1", rank - 1);
           if (!d0 || !d1) return Operand::invalid();
           std::vector<int64_t> perm(rank);
           for (int i = 0; i < rank; ++i) perm[i] = i;
           std::swap(perm[*d0], perm[*d1]);
           return L.build(Op::Permute, {*x}, {{"perm", perm}}, call.offset);
         }});
    add({"concat", {"x", "axis"}, 1,
         [](Lowerer& L, const CallArgs& a, const Expr& call) -> Operand {
           std::vector<ValueId> parts;
           auto first = tensor_arg(L, a, "x", call);
           if (!first) return Operand::invalid();
           parts.push_back(*first);
           for (const Operand& o : a.rest) {
             auto v = L.need_tensor(o, "concat: each operand");
             if (!v) return Operand::invalid();
             parts.push_back(*v);
           }
           int64_t axis = 0;
           if (const Operand* ax = a.get("axis")) {
             auto v = L.need_axis(*ax, L.type(*first).rank(), "concat: axis");
             if (!v) return Operand::invalid();
             axis = *v;
           }
           return L.build(Op::Concat, parts, {{"axis", axis}}, call.offset);
         },
         1});
    add({"split", {"x", "n", "axis"}, 2, [](Lowerer& L, const CallArgs& a, const Expr& call) -> Operand {
           auto x = tensor_arg(L, a, "x", call);
           auto n = L.need_int(*a.get("n"), "split: n");
           if (!x || !n) return Operand::invalid();
           int64_t axis = 0;
           if (const Operand* ax = a.get("axis")) {
             auto v = L.need_axis(*ax, L.type(*x).rank(), "split: axis");
             if (!v) return Operand::invalid();
             axis = *v;
           }
           if (L.type(*x).rank() == 0) {  // a scalar has no axis 0 to split
             L.error(call.offset, "split needs a tensor with at least one axis, got a scalar",
                     "split a tensor, e.g. split(x, 3, axis=-1)");
             return Operand::invalid();
           }
           int64_t size = L.type(*x).dims[axis].size;
           // Each part is a node and a value to assign to its own name: split(x, 2**40)
           // of a large axis would hang building parts that no target list can take.
           constexpr int64_t kMaxParts = 10000;
           if (*n > kMaxParts) {
             L.error(a.get("n")->offset, fmt::format("split into {} parts is too many: napkin makes a view per part, "
                                                     "at most {}", *n, kMaxParts),
                     "split gives one value per name on the left; to cut an axis into many pieces, use "
                     "rearrange(x, \"(n k) -> n k\", n=...)");
             return Operand::invalid();
           }
           if (*n <= 0 || size % *n != 0) {
             L.error(a.get("n")->offset,
                     fmt::format("split: axis {} of size {} does not split into {} equal parts", axis,
                                 ir::describe_dim(L.type(*x).dims[axis]), *n),
                     "choose a number of parts that divides the axis");
             return Operand::invalid();
           }
           Operand list;
           list.kind = Operand::Kind::List;
           list.offset = call.offset;
           int64_t part = size / *n;
           for (int64_t i = 0; i < *n; ++i) {
             Operand piece = L.build(Op::Slice, {*x},
                                     {{"axis", axis}, {"start", i * part}, {"stop", (i + 1) * part}}, call.offset);
             if (!piece.ok()) return piece;
             list.items.push_back(piece);
           }
           return list;
         }});
    // Composite ops.
    add({"softmax", {"x", "axis"}, 1, [](Lowerer& L, const CallArgs& a, const Expr& call) {
           return lower_softmax_like(L, Op::Softmax, a, call);
         }});
    add({"log_softmax", {"x", "axis"}, 1, [](Lowerer& L, const CallArgs& a, const Expr& call) {
           return lower_softmax_like(L, Op::LogSoftmax, a, call);
         }});
    add({"layernorm", {"x", "gain", "bias", "eps"}, 3, [](Lowerer& L, const CallArgs& a, const Expr& call) -> Operand {
           bool ok = true;
           double eps = eps_or(L, a, 1e-5, ok);
           auto x = tensor_arg(L, a, "x", call);
           auto g = tensor_arg(L, a, "gain", call);
           auto b = tensor_arg(L, a, "bias", call);
           if (!x || !g || !b || !ok) return Operand::invalid();
           return L.build(Op::LayerNorm, {*x, *g, *b}, {{"eps", eps}}, call.offset);
         }});
    add({"rmsnorm", {"x", "gain", "eps"}, 2, [](Lowerer& L, const CallArgs& a, const Expr& call) -> Operand {
           bool ok = true;
           double eps = eps_or(L, a, 1e-6, ok);
           auto x = tensor_arg(L, a, "x", call);
           auto g = tensor_arg(L, a, "gain", call);
           if (!x || !g || !ok) return Operand::invalid();
           return L.build(Op::RMSNorm, {*x, *g}, {{"eps", eps}}, call.offset);
         }});
    add({"embedding", {"table", "ids"}, 2, [](Lowerer& L, const CallArgs& a, const Expr& call) -> Operand {
           auto t = tensor_arg(L, a, "table", call);
           auto i = tensor_arg(L, a, "ids", call);
           if (!t || !i) return Operand::invalid();
           return L.build(Op::Embedding, {*t, *i}, {}, call.offset);
         }});
    // attention(q, k, v, causal=true, scale=1/sqrt(head_dim)): fused
    // softmax(scale q kᵀ) v that stores no scores (ir/loop.h's AttentionParams).
    add({"attention", {"q", "k", "v", "causal", "scale"}, 3,
         [](Lowerer& L, const CallArgs& a, const Expr& call) -> Operand {
           int64_t causal = 1;
           if (const Operand* c = a.get("causal")) {
             auto b = bool_arg(L, *c, "attention: causal", "causal");
             if (!b) return Operand::invalid();
             causal = *b;
           }
           std::optional<double> scale;
           if (const Operand* sc = a.get("scale")) {
             scale = L.need_number(*sc, "attention: scale");
             if (!scale) return Operand::invalid();
             if (!(*scale > 0)) {
               L.error(sc->offset, fmt::format("attention: scale must be positive, got {}", *scale),
                       "the default is 1/sqrt(head_dim)");
               return Operand::invalid();
             }
           }
           auto q = tensor_arg(L, a, "q", call);
           auto k = tensor_arg(L, a, "k", call);
           auto v = tensor_arg(L, a, "v", call);
           if (!q || !k || !v) return Operand::invalid();
           const ir::TensorType& qt = L.type(*q);
           if (!scale) scale = qt.rank() == 4 ? 1.0 / std::sqrt(static_cast<double>(qt.dims[3].size)) : 1.0;
           // The kernels load whole rows of head_dim: each operand contiguous along it.
           ir::Builder& b = L.builder_at(call.offset);
           return L.build(Op::Attention, {b.unit_inner_stride(*q), b.unit_inner_stride(*k), b.unit_inner_stride(*v)},
                          {{"causal", causal}, {"scale", *scale}}, call.offset);
         }});
    // rope(x, theta=10000, style=half, axis=-1, seq_axis=-2, positions=None,
    // factor=None, low_freq_factor=1, high_freq_factor=4, original_context=8192):
    // rotary position embeddings (ir/rope.h).
    add({"rope",
         {"x", "theta", "style", "axis", "seq_axis", "positions", "factor", "low_freq_factor", "high_freq_factor",
          "original_context"},
         1, lower_rope});
    // moe(x, router, w_gate, w_up, w_down, k=2, capacity_factor=experts/k,
    // routing=softmax_topk, normalize=true): a mixture of SwiGLU experts
    // (frontend/moe.cpp), and the loss terms over the routers of the moe()
    // layers before them.
    add({"moe", {"x", "router", "w_gate", "w_up", "w_down", "k", "capacity_factor", "routing", "normalize"}, 5,
         lower_moe});
    add({"moe_load_balance", {}, 0, lower_moe_load_balance});
    add({"moe_z_loss", {}, 0, lower_moe_z_loss});
    add({"cross_entropy", {"logits", "targets"}, 2, [](Lowerer& L, const CallArgs& a, const Expr& call) -> Operand {
           auto x = tensor_arg(L, a, "logits", call);
           auto y = tensor_arg(L, a, "targets", call);
           if (!x || !y) return Operand::invalid();
           return L.build(Op::CrossEntropy, {*x, *y}, {}, call.offset);
         }});
    add({"mse", {"prediction", "target"}, 2, [](Lowerer& L, const CallArgs& a, const Expr& call) -> Operand {
           auto x = tensor_arg(L, a, "prediction", call);
           auto y = tensor_arg(L, a, "target", call);
           if (!x || !y) return Operand::invalid();
           return L.build(Op::MSE, {*x, *y}, {}, call.offset);
         }});
    // Blocks.
    // repeat(block, n, x, ..., prefix="blocks"): the block's arguments after the
    // first are positionals past x, so prefix is a keyword.
    add({"repeat", {"block", "n", "x", "prefix"}, 3,
         [](Lowerer& L, const CallArgs& a, const Expr& call) -> Operand {
           const Operand& block = *a.get("block");
           if (!block.ok()) return Operand::invalid();
           if (block.kind != Operand::Kind::Word || !L.blocks().count(block.text)) {
             // A tensor or number operand has no name of its own: show the argument as written.
             std::string written = block.text;
             if (block.kind != Operand::Kind::Word) {
               const Expr* arg = call.args.empty() ? nullptr : call.args[0].get();
               for (const KeywordArg& k : call.kwargs)
                 if (k.name == "block") arg = k.value.get();
               written = arg ? to_string(*arg) : "?";
             }
             std::vector<std::string> names;
             for (const auto& [n, b] : L.blocks()) names.push_back(n);
             L.error(block.offset,
                     fmt::format("repeat: '{}' is not a block{}", written, did_you_mean(written, names)),
                     names.empty() ? "define it under blocks:" : fmt::format("blocks: {}", fmt::join(names, ", ")));
             return Operand::invalid();
           }
           const BlockDef& def = L.blocks().at(block.text);
           if (def.failed) return Operand::invalid();  // its error is reported
           auto n = L.need_int(*a.get("n"), "repeat: n");
           std::string prefix = "blocks";
           if (const Operand* p = a.get("prefix")) {
             auto w = L.need_word(*p, "repeat: prefix");
             if (!w) return Operand::invalid();
             prefix = *w;
           }
           std::vector<Operand> given{*a.get("x")};
           given.insert(given.end(), a.rest.begin(), a.rest.end());
           if (given.size() != def.args.size()) {
             // A string or word past the block's arguments is most likely a prefix written by position.
             bool prefix_like = given.size() > def.args.size() && (given[def.args.size()].kind == Operand::Kind::String ||
                                                                   given[def.args.size()].kind == Operand::Kind::Word);
             L.error(given.size() > def.args.size() ? given[def.args.size()].offset : call.offset,
                     fmt::format("block '{}' takes {} argument{} ({}), but repeat passes it {}", def.name,
                                 def.args.size(), def.args.size() == 1 ? "" : "s", fmt::join(def.args, ", "),
                                 given.size()),
                     prefix_like ? "give the prefix by keyword: repeat(block, n, x, prefix=\"dec\")"
                                 : fmt::format("write repeat({}, n, {}): the arguments after n are the block's",
                                               def.name, fmt::join(def.args, ", ")));
             return Operand::invalid();
           }
           std::vector<ValueId> args;
           for (size_t i = 0; i < given.size(); ++i) {
             auto v = L.need_tensor(given[i], fmt::format("repeat: argument '{}' of block '{}'", def.args[i], def.name));
             if (!v) return Operand::invalid();
             args.push_back(*v);
           }
           if (!n) return Operand::invalid();
           return L.instantiate_repeat(def, *n, std::move(args), prefix, call.offset);
         },
         3});
    return t;
  }();
  return table;
}

const CallSpec* find_call(const std::string& name) {
  for (const CallSpec& s : call_table())
    if (s.name == name) return &s;
  return nullptr;
}

std::string signature(const CallSpec& s) {
  std::vector<std::string> parts;
  for (size_t i = 0; i < s.params.size(); ++i) parts.push_back(i < s.required ? s.params[i] : s.params[i] + "=...");
  if (s.variadic) parts.insert(parts.begin() + s.variadic, "...");
  if (s.extra_keywords) parts.push_back("axis_size=...");
  return fmt::format("{}({})", s.name, fmt::join(parts, ", "));
}

}  // namespace

std::vector<std::string> known_functions() {
  std::vector<std::string> names;
  for (const CallSpec& s : call_table()) names.push_back(s.name);
  return names;
}

std::optional<CallArgs> bind_arguments(Lowerer& L, const Expr& call, const std::vector<std::string>& params,
                                       size_t required, const BindOptions& options) {
  CallArgs args;
  bool ok = true;
  auto too_many = [&](size_t i) -> std::optional<CallArgs> {
    L.error(call.args[i]->offset, options.too_many(call.args.size()), options.hint(ArgumentError::TooMany));
    return std::nullopt;
  };
  if (options.first_error_ends && !options.variadic && call.args.size() > params.size())
    return too_many(params.size());
  // Evaluates one argument; false if it failed (reported). `param` is null for
  // one bound to no parameter (a variadic's rest, an extra keyword).
  auto evaluate = [&](const std::string* param, const Expr& written, Operand& out) {
    out = L.eval(written);
    return out.ok() && (!param || !options.check || options.check(*param, written, out));
  };
  // Positional arguments fill parameters in order (a variadic call keeps the
  // first `variadic` in their slots and collects the others until the keywords).
  for (size_t i = 0; i < call.args.size(); ++i) {
    bool rest = options.variadic && i >= options.variadic;
    const std::string* param = !rest && i < params.size() ? &params[i] : nullptr;
    Operand v;
    bool good = evaluate(param, *call.args[i], v);
    if (rest) {
      args.rest.push_back(std::move(v));
    } else if (param) {
      args.named[*param] = std::move(v);
    } else {
      return too_many(i);
    }
    if (!good && options.first_error_ends) return std::nullopt;
    ok = ok && good;
  }
  for (const KeywordArg& kw : call.kwargs) {
    auto it = std::find(params.begin(), params.end(), kw.name);
    const std::string* param = it == params.end() ? nullptr : &*it;
    if (!param && !options.extra_keywords) {
      L.error(kw.offset, fmt::format("{} has no argument '{}'{}", call.text, kw.name, did_you_mean(kw.name, params)),
              options.hint(ArgumentError::Unknown));
    } else if (param && args.named.count(kw.name)) {
      L.error(kw.offset, fmt::format("{}: argument '{}' is given twice", call.text, kw.name),
              options.hint(ArgumentError::Twice));
    } else {
      Operand v;
      bool good = evaluate(param, *kw.value, v);
      (param ? args.named : args.extra)[kw.name] = std::move(v);
      if (good) continue;
    }
    if (options.first_error_ends) return std::nullopt;
    ok = false;
  }
  for (size_t i = 0; i < required; ++i)
    if (!args.named.count(params[i])) {
      L.error(call.offset, options.missing(params[i]), options.hint(ArgumentError::Missing));
      return std::nullopt;
    }
  if (!ok) return std::nullopt;
  return args;
}

namespace {

// block(x, ...): one instance of a block, its arguments bound like a function's.
Operand lower_block_call(Lowerer& L, const BlockDef& block, const Expr& call) {
  std::string takes = fmt::format("block '{}' takes {} argument{} ({})", block.name, block.args.size(),
                                  block.args.size() == 1 ? "" : "s", fmt::join(block.args, ", "));
  BindOptions options;
  options.too_many = [&](size_t positionals) { return fmt::format("{}, got {}", takes, positionals); };
  options.missing = [&](const std::string& arg) {
    return fmt::format("{}, got {}: '{}' is missing", takes, call.args.size() + call.kwargs.size(), arg);
  };
  options.hint = [&](ArgumentError) {
    return fmt::format("call it as {}({}), by position or by name", block.name, fmt::join(block.args, ", "));
  };
  std::optional<CallArgs> args = bind_arguments(L, call, block.args, block.args.size(), options);
  if (!args || block.failed) return Operand::invalid();  // a failed block's error is reported
  std::vector<ValueId> values;
  for (const std::string& name : block.args) {
    auto v = L.need_tensor(*args->get(name), fmt::format("argument '{}' of block '{}'", name, block.name));
    if (!v) return Operand::invalid();
    values.push_back(*v);
  }
  return L.instantiate_call(block, std::move(values), call.offset);
}

}  // namespace

Operand lower_call(Lowerer& L, const Expr& call) {
  const CallSpec* spec = find_call(call.text);
  auto block = L.blocks().find(call.text);
  if (spec && block != L.blocks().end()) {
    L.error(call.offset, fmt::format("'{}' is both a function and a block", call.text),
            fmt::format("rename the block; a call would be ambiguous (repeat({}, n, ...) still means the block)",
                        call.text));
    return Operand::invalid();
  }
  if (block != L.blocks().end()) return lower_block_call(L, block->second, call);
  if (!spec) {
    std::vector<std::string> callable = known_functions();
    for (const auto& [name, def] : L.blocks()) callable.push_back(name);
    L.error(call.offset, fmt::format("unknown function '{}'{}", call.text, did_you_mean(call.text, callable)),
            "see docs/model-language.md for the list of functions");
    return Operand::invalid();
  }
  BindOptions options;
  options.variadic = spec->variadic;
  options.extra_keywords = spec->extra_keywords;
  options.too_many = [&](size_t positionals) {
    return fmt::format("{} takes at most {} positional argument{}, got {}", spec->name, spec->params.size(),
                       spec->params.size() == 1 ? "" : "s", positionals);
  };
  options.missing = [&](const std::string& param) {
    return fmt::format("{} needs {} argument{}, got {}: '{}' is missing", spec->name, spec->required,
                       spec->required == 1 ? "" : "s", call.args.size() + call.kwargs.size(), param);
  };
  options.hint = [&](ArgumentError) { return fmt::format("signature: {}", signature(*spec)); };
  std::optional<CallArgs> args = bind_arguments(L, call, spec->params, spec->required, options);
  if (!args) return Operand::invalid();
  Lowerer::ArgumentScope arguments(L, *args);
  return spec->lower(L, *args, call);
}

}  // namespace napkin::frontend
