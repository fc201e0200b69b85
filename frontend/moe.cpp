// moe(...): a mixture-of-experts layer built from the op table's ops, and the
// loss terms over its routers (moe_load_balance, moe_z_loss). The layer:
//
//   logits  = x2 @ routerᵀ                       x2 = x as [T, d], router [E, d]
//   weights, idx = routing of softmax(logits)    top_k; Mixtral's "softmax_topk"
//   pos, src, counts = moe_slots(idx)            capacity C slots per expert
//   xe      = embedding(x2, src)                 dispatch: [E, C, d], a gather
//   ye      = swiglu experts on xe               one batched GEMM per projection
//   y       = Σ_j weights·kept · ye[pos]         combine: a gather of [T, k, d]
//
// so the step holds no [T, E, C] (or [T, k, E]) routing tensor, and the
// backward of dispatch and combine is embedding's scatter-add. SPEC: docs/moe.md.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "frontend/lowering.h"
#include "ir/internal_check.h"

namespace napkin::frontend {

using ir::DType;
using ir::Op;
using ir::ValueId;

namespace {

// Builds a node that cannot fail once moe's operands are checked.
ValueId node(Lowerer& L, int offset, Op op, std::vector<ValueId> inputs, ir::Attrs attrs = {}) {
  ir::Builder& b = L.builder_at(offset);
  return b.must(b.add(op, std::move(inputs), std::move(attrs)));
}

ValueId reshape(Lowerer& L, int offset, ValueId x, std::vector<ir::Dim> dims) {
  ir::Builder& b = L.builder_at(offset);
  return b.must(b.reshape(x, std::move(dims)));
}

ValueId constant(Lowerer& L, int offset, double value, DType dtype) {
  ir::Builder& b = L.builder_at(offset);
  return b.must(b.constant(value, dtype));
}

ValueId einsum(Lowerer& L, int offset, ValueId a, ValueId b, const char* pattern) {
  Operand p;
  p.kind = Operand::Kind::String;
  p.text = pattern;
  p.offset = offset;
  Operand r = lower_einsum(L, {Operand::tensor(a, offset), Operand::tensor(b, offset)}, p, offset);
  NAPKIN_INTERNAL_CHECK(r.ok(), "moe: einsum {} failed on checked operands", pattern);
  return r.value;
}

ValueId reduce_sum(Lowerer& L, int offset, ValueId x, std::vector<int64_t> axes, bool keepdims) {
  return node(L, offset, Op::ReduceSum, {x}, {{"axes", std::move(axes)}, {"keepdims", int64_t{keepdims}}});
}

// The hint of a misshapen operand.
constexpr const char* kSignature =
    "moe(x [..., d], router [experts, d], w_gate [experts, ffn, d], w_up [experts, ffn, d], w_down [experts, d, ffn])";

// The operand `name` as a floating-point tensor of `rank` axes, in x's dtype
// `dtype` when x is known (the router and the experts compute in it);
// nullopt after reporting.
std::optional<ValueId> operand(Lowerer& L, const CallArgs& a, const std::string& name, int rank,
                               std::optional<DType> dtype) {
  const Operand* o = a.get(name);
  auto v = L.need_tensor(*o, fmt::format("moe: argument '{}'", name));
  if (!v) return std::nullopt;
  const ir::TensorType& t = L.type(*v);
  if (t.rank() != rank || !ir::is_floating(t.dtype)) {
    L.error(o->offset, fmt::format("moe: {} must be a floating-point tensor of {} axes, but it is {}", name, rank,
                                   ir::to_string(t)),
            kSignature);
    return std::nullopt;
  }
  if (dtype && t.dtype != *dtype) {
    L.error(o->offset,
            fmt::format("moe: {} is {} but x is {}: the router and the experts compute in x's dtype", name,
                        ir::dtype_name(t.dtype), ir::dtype_name(*dtype)),
            "declare them in one dtype, or cast x (a precision: policy casts both for the matmuls itself)");
    return std::nullopt;
  }
  return v;
}

// Checks that `t`'s axis `axis` has `size`; reports at the operand otherwise.
bool expect_size(Lowerer& L, const Operand& o, const std::string& name, const ir::TensorType& t, int axis,
                 int64_t size, const std::string& meaning) {
  if (t.dims[static_cast<size_t>(axis)].size == size) return true;
  L.error(o.offset,
          fmt::format("moe: {} is {}, but its axis {} must be {} ({})", name, ir::to_string(t), axis, size, meaning),
          kSignature);
  return false;
}

}  // namespace

Operand lower_moe(Lowerer& L, const CallArgs& a, const Expr& call) {
  const int at = call.offset;
  auto x = L.need_tensor(*a.get("x"), "moe: argument 'x'");
  if (x && (L.type(*x).rank() < 1 || !ir::is_floating(L.type(*x).dtype))) {
    L.error(a.get("x")->offset, fmt::format("moe: x must be a floating-point tensor [..., d], but it is {}",
                                            ir::to_string(L.type(*x))),
            "moe routes each row of x's last axis");
    x.reset();
  }
  const std::optional<DType> dtype = x ? std::optional<DType>(L.type(*x).dtype) : std::nullopt;
  auto router = operand(L, a, "router", 2, dtype);
  auto w_gate = operand(L, a, "w_gate", 3, dtype);
  auto w_up = operand(L, a, "w_up", 3, dtype);
  auto w_down = operand(L, a, "w_down", 3, dtype);
  if (!x || !router || !w_gate || !w_up || !w_down) return Operand::invalid();
  const ir::TensorType xt = L.type(*x);
  const int64_t d = xt.dims.back().size;
  const int64_t tokens = xt.numel() / d;
  const ir::TensorType rt = L.type(*router), gt = L.type(*w_gate), ut = L.type(*w_up), dt = L.type(*w_down);
  const int64_t experts = rt.dims[0].size, ffn = gt.dims[1].size;
  if (!expect_size(L, *a.get("router"), "router", rt, 1, d, "x's last axis, d") ||
      !expect_size(L, *a.get("w_gate"), "w_gate", gt, 0, experts, "the router's experts") ||
      !expect_size(L, *a.get("w_gate"), "w_gate", gt, 2, d, "x's last axis, d") ||
      !expect_size(L, *a.get("w_up"), "w_up", ut, 0, experts, "the router's experts") ||
      !expect_size(L, *a.get("w_up"), "w_up", ut, 1, ffn, "w_gate's ffn") ||
      !expect_size(L, *a.get("w_up"), "w_up", ut, 2, d, "x's last axis, d") ||
      !expect_size(L, *a.get("w_down"), "w_down", dt, 0, experts, "the router's experts") ||
      !expect_size(L, *a.get("w_down"), "w_down", dt, 1, d, "x's last axis, d") ||
      !expect_size(L, *a.get("w_down"), "w_down", dt, 2, ffn, "w_gate's ffn"))
    return Operand::invalid();

  int64_t k = 2;
  if (const Operand* ko = a.get("k")) {
    auto v = L.need_int(*ko, "moe: k");
    if (!v) return Operand::invalid();
    if (*v < 1 || *v > experts) {
      L.error(ko->offset, fmt::format("moe: k must be between 1 and the {} experts, got {}", experts, *v),
              "k is how many experts each token is routed to (Mixtral: 2 of 8)");
      return Operand::invalid();
    }
    k = *v;
  } else if (experts < 2) {
    k = experts;
  }
  // The default is dropless: E/k gives every expert room for every token.
  double capacity_factor = static_cast<double>(experts) / static_cast<double>(k);
  if (const Operand* c = a.get("capacity_factor")) {
    auto v = L.need_number(*c, "moe: capacity_factor");
    if (!v) return Operand::invalid();
    if (!(*v > 0) || !std::isfinite(*v)) {
      L.error(c->offset, fmt::format("moe: capacity_factor must be positive, got {}", *v),
              fmt::format("{} (experts / k) drops nothing; 1.25 is Switch's usual choice", capacity_factor));
      return Operand::invalid();
    }
    capacity_factor = *v;
  }
  // C = ceil(cf·T·k/E), at least one slot and never more than T (a token
  // reaches an expert at most once, so T slots already drop nothing).
  const double wanted = std::ceil(capacity_factor * static_cast<double>(tokens) * static_cast<double>(k) /
                                  static_cast<double>(experts) - 1e-9);
  const int64_t capacity = static_cast<int64_t>(std::max(1.0, std::min(static_cast<double>(tokens), wanted)));

  std::string routing = "softmax_topk";
  if (const Operand* r = a.get("routing")) {
    auto w = L.need_word(*r, "moe: routing");
    if (!w) return Operand::invalid();
    if (*w != "softmax_topk" && *w != "topk_softmax") {
      L.error(r->offset, fmt::format("moe: routing must be softmax_topk or topk_softmax, got '{}'", *w),
              "softmax_topk: top-k of the softmax over all experts (Mixtral); topk_softmax: softmax over the "
              "top-k logits");
      return Operand::invalid();
    }
    routing = *w;
  }
  bool normalize = true;
  if (const Operand* n = a.get("normalize")) {
    auto w = L.need_word(*n, "moe: normalize");
    if (!w) return Operand::invalid();
    if (*w != "true" && *w != "false") {
      L.error(n->offset, "moe: normalize must be true or false", "write normalize=true or normalize=false");
      return Operand::invalid();
    }
    if (routing == "topk_softmax") {
      L.error(n->offset, "moe: normalize applies to routing=softmax_topk only",
              "topk_softmax's weights are a softmax over the chosen k: they always sum to 1");
      return Operand::invalid();
    }
    normalize = *w == "true";
  }

  // Router: logits [T, E] and the routing weights [T, k].
  // The routing axes are named so that `napkin sample` finds them
  // (ir::kMoeTokensDim, passes/derive_inference.h).
  const ir::Dim tok{tokens, std::string(ir::kMoeTokensDim)};
  ValueId x2 = reshape(L, at, *x, {tok, xt.dims.back()});
  ValueId logits = einsum(L, at, x2, *router, "t d, e d -> t e");
  ValueId probs = node(L, at, Op::Softmax, {logits}, {{"axis", int64_t{1}}});
  ValueId weights, indices;
  {
    ValueId top = node(L, at, Op::TopK, {routing == "softmax_topk" ? probs : logits}, {{"k", k}});
    const ir::Graph& g = L.builder_at(at).graph();
    indices = g.node(g.value(top).producer).out(1);
    if (routing == "topk_softmax") {
      weights = node(L, at, Op::Softmax, {top}, {{"axis", int64_t{1}}});
    } else if (normalize) {
      weights = node(L, at, Op::Div, {top, reduce_sum(L, at, top, {1}, true)});
    } else {
      weights = top;
    }
  }

  // Slots, dispatch, the experts, combine.
  ValueId slots = node(L, at, Op::MoeSlots, {indices}, {{"experts", experts}, {"capacity", capacity}});
  ValueId pos, src, counts;
  {
    const ir::Graph& g = L.builder_at(at).graph();
    const ir::Node& s = g.node(g.value(slots).producer);
    pos = s.out(0);
    src = s.out(1);
    counts = s.out(2);
  }
  L.builder_at(at).rename_dims(src, {rt.dims[0], ir::Dim{capacity, std::string(ir::kMoeCapacityDim)}});
  ValueId xe = node(L, at, Op::Embedding, {x2, src});
  ValueId gate = einsum(L, at, xe, *w_gate, "e c d, e f d -> e c f");
  ValueId up = einsum(L, at, xe, *w_up, "e c d, e f d -> e c f");
  ValueId h = node(L, at, Op::Mul, {node(L, at, Op::Silu, {gate}), up});
  ValueId ye = einsum(L, at, h, *w_down, "e c f, e d f -> e c d");
  ValueId rows = reshape(L, at, ye, {ir::Dim{experts * capacity, std::string(ir::kMoeSlotsDim)}, xt.dims.back()});
  ValueId zero = constant(L, at, 0, DType::I32);
  ValueId chosen = node(L, at, Op::Embedding, {rows, node(L, at, Op::Maximum, {pos, zero})});  // [T, k, d]
  const DType wdtype = L.type(weights).dtype;
  ValueId kept = node(L, at, Op::Cast, {node(L, at, Op::GreaterEqual, {pos, zero})}, {{"dtype", wdtype}});
  ValueId scale = reshape(L, at, node(L, at, Op::Mul, {weights, kept}), {tok, ir::Dim{k, "k"}, ir::Dim{1, ""}});
  ValueId y2 = reduce_sum(L, at, node(L, at, Op::Mul, {chosen, scale}), {1}, false);
  ValueId y = reshape(L, at, y2, xt.dims);

  // What the loss terms and the report read.
  Lowerer::MoeRouting stats;
  stats.experts = experts;
  stats.tokens = tokens;
  stats.counts = counts;
  stats.probs_sum = reduce_sum(L, at, probs, {0}, false);
  // logsumexp of each row: logits − log_softmax(logits) at any expert.
  ValueId lse = node(L, at, Op::Select, {node(L, at, Op::Sub, {logits, node(L, at, Op::LogSoftmax, {logits},
                                                                             {{"axis", int64_t{1}}})})},
                     {{"axis", int64_t{1}}, {"index", int64_t{0}}});
  stats.lse_squared_sum = reduce_sum(L, at, node(L, at, Op::Mul, {lse, lse}), {0}, false);
  L.moe_routing().push_back(stats);

  ir::Graph& g = L.builder_at(at).graph();
  const std::string scope = L.builder_at(at).scope();
  // The (token, choice) pairs past their expert's capacity: Σ_e max(count_e − C, 0).
  ValueId over = node(L, at, Op::Maximum, {node(L, at, Op::Sub, {counts, constant(L, at, double(capacity), DType::F32)}),
                                           constant(L, at, 0, DType::F32)});
  ValueId dropped = reduce_sum(L, at, over, {0}, false);
  // Named by the layer's scope ("layers.3"), and by its index among the moe() layers where the scope has
  // another already (two in one block, or top-level ones).
  std::string key = scope;
  for (const ir::Graph::MoeLayer& earlier : g.moe_layers)
    if (earlier.scope == scope) key = fmt::format("{}{}{}", scope, scope.empty() ? "" : ".", g.moe_layers.size());
  if (key.empty()) key = fmt::format("{}", g.moe_layers.size());
  std::string output = std::string(ir::kMetricOutputPrefix) + "moe_dropped." + key;
  g.outputs.emplace_back(output, dropped);
  // The assignments each expert got (before capacity): the layer's load balance, in the trainer's metrics.
  g.outputs.emplace_back(std::string(ir::kMetricOutputPrefix) + "moe_load." + key, counts);
  ir::Graph::MoeLayer layer;
  layer.scope = scope;
  layer.experts = experts;
  layer.top_k = k;
  layer.tokens = tokens;
  layer.capacity = capacity;
  layer.capacity_factor = capacity_factor;
  layer.d_model = d;
  // The parameters themselves, or the ones a view of them reads (a fused [E·f, d] weight rearranged).
  auto param_of = [&](ValueId v) { return g.find_param(g.value(v).storage) ? g.value(v).storage : ir::kNoValue; };
  layer.router = param_of(*router);
  for (ValueId v : {*w_gate, *w_up, *w_down})
    if (const ValueId p = param_of(v);
        p != ir::kNoValue && std::find(layer.expert_params.begin(), layer.expert_params.end(), p) == layer.expert_params.end())
      layer.expert_params.push_back(p);
  layer.dropped_output = output;
  g.moe_layers.push_back(std::move(layer));
  return Operand::tensor(y, at);
}

namespace {

// The routers of the moe() layers lowered so far, or null after reporting
// that `function` has none to pool.
const std::vector<Lowerer::MoeRouting>* routers_before(Lowerer& L, const Expr& call, const char* function) {
  if (!L.moe_routing().empty()) return &L.moe_routing();
  L.error(call.offset, fmt::format("{}: there is no moe() layer before it", function),
          "it averages the routers of the moe() calls the forward made; use it in loss:");
  return nullptr;
}

// N = Σ T: the routed rows of all the layers.
double pooled_rows(const std::vector<Lowerer::MoeRouting>& layers) {
  double rows = 0;
  for (const Lowerer::MoeRouting& l : layers) rows += static_cast<double>(l.tokens);
  return rows;
}

}  // namespace

// Switch's load-balancing loss pooled over every moe layer so far, as
// transformers' load_balancing_loss_func computes it over the layers' router
// logits: E · Σ_e f_e · P_e, f_e the share of the top-k assignments routed to
// e (summing to k) and P_e the mean router probability of e, over N = Σ T
// rows. Its gradient flows through P only (f counts).
Operand lower_moe_load_balance(Lowerer& L, const CallArgs&, const Expr& call) {
  const std::vector<Lowerer::MoeRouting>* layers = routers_before(L, call, "moe_load_balance");
  if (!layers) return Operand::invalid();
  const int at = call.offset;
  const int64_t experts = layers->front().experts;
  ValueId counts = layers->front().counts, probs = layers->front().probs_sum;
  for (size_t i = 1; i < layers->size(); ++i) {
    const Lowerer::MoeRouting& l = (*layers)[i];
    if (l.experts != experts) {
      L.error(at, fmt::format("moe_load_balance: the moe layers have {} and {} experts", experts, l.experts),
              "the pooled load-balancing loss needs one number of experts");
      return Operand::invalid();
    }
    counts = node(L, at, Op::Add, {counts, l.counts});
    probs = node(L, at, Op::Add, {probs, l.probs_sum});
  }
  ValueId dot = reduce_sum(L, at, node(L, at, Op::Mul, {counts, probs}), {0}, false);
  const double rows = pooled_rows(*layers);
  double scale = static_cast<double>(experts) / (rows * rows);
  return Operand::tensor(node(L, at, Op::Mul, {dot, constant(L, at, scale, DType::F32)}), at);
}

// ST-MoE's router z-loss over every moe layer so far: the mean over the
// routed rows of logsumexp(router logits)².
Operand lower_moe_z_loss(Lowerer& L, const CallArgs&, const Expr& call) {
  const std::vector<Lowerer::MoeRouting>* layers = routers_before(L, call, "moe_z_loss");
  if (!layers) return Operand::invalid();
  const int at = call.offset;
  ValueId total = layers->front().lse_squared_sum;
  for (size_t i = 1; i < layers->size(); ++i) total = node(L, at, Op::Add, {total, (*layers)[i].lse_squared_sum});
  return Operand::tensor(node(L, at, Op::Mul, {total, constant(L, at, 1.0 / pooled_rows(*layers), DType::F32)}), at);
}

}  // namespace napkin::frontend
