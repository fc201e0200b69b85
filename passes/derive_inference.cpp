#include "passes/derive_inference.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "ir/builder.h"
#include "ir/internal_check.h"
#include "ir/loop.h"
#include "ir/op.h"
#include "ir/rope.h"

namespace napkin::passes {

using ir::Op;
using ir::ValueId;

namespace {

// The loss's cross_entropy node, or null: the loss itself, or the one
// cross_entropy among the terms a sum of terms adds (the language-model loss
// plus auxiliary ones: cross_entropy(logits, targets) + 0.02 * moe_load_balance()).
const ir::Node* loss_node(const ir::Graph& g) {
  ValueId loss = g.find_output("loss");
  if (loss == ir::kNoValue) return nullptr;
  const ir::Node* found = nullptr;
  int found_count = 0;
  std::vector<ValueId> terms{loss};
  while (!terms.empty()) {
    const ValueId v = terms.back();
    terms.pop_back();
    if (g.value(v).producer == ir::kNoNode) continue;
    const ir::Node& n = g.node(g.value(v).producer);
    if (n.op == Op::CrossEntropy) {
      found = &n;
      ++found_count;
    } else if (n.op == Op::Add || n.op == Op::Sub) {
      terms.insert(terms.end(), n.inputs.begin(), n.inputs.end());
    }
  }
  return found_count == 1 ? found : nullptr;
}

// The data input that is not the loss's targets: the tokens.
ValueId tokens_input(const ir::Graph& g, ValueId targets) {
  for (ValueId in : g.inputs)
    if (in != targets) return in;
  return ir::kNoValue;
}

}  // namespace

std::optional<LanguageModel> find_language_model(const ir::Graph& g, std::string* why) {
  auto fail = [&](std::string message) -> std::optional<LanguageModel> {
    if (why) *why = std::move(message);
    return std::nullopt;
  };
  const ir::Node* ce = loss_node(g);
  if (!ce) return fail("its loss is not cross_entropy(logits, targets)");
  const ValueId tokens = tokens_input(g, ce->in(1));
  if (tokens == ir::kNoValue || g.value(tokens).type.rank() != 2 || !ir::is_integer(g.value(tokens).type.dtype))
    return fail("it has no integer tokens input [batch, seq] besides the targets");
  const ir::TensorType& t = g.value(tokens).type;
  const ir::TensorType& logits = g.value(ce->in(0)).type;
  if (logits.rank() != 3 || logits.dims[0].size != t.dims[0].size || logits.dims[1].size != t.dims[1].size)
    return fail(fmt::format("its logits {} are not [batch, seq, vocab] of the tokens {}", ir::to_string(logits),
                            ir::to_string(t)));
  if (t.dims[1].name.empty()) return fail("the tokens' sequence axis has no dim name");
  LanguageModel lm;
  lm.batch_dim = t.dims[0].name;
  lm.batch = t.dims[0].size;
  lm.seq_dim = t.dims[1].name;
  lm.context = t.dims[1].size;
  lm.vocab = logits.dims[2].size;
  for (ir::NodeId id : g.schedule()) lm.layers += g.node(id).op == Op::Attention;
  return lm;
}

namespace {

// Rebuilds the forward graph's nodes that the logits need into `out`, once
// per phase, with the sequence axis at the phase's length.
class Deriver {
 public:
  Deriver(const ir::Graph& in, ir::Graph& out, ir::Diagnostics& diag, const LanguageModel& lm, ValueId tokens,
          ValueId logits)
      : in_(in), out_(out), diag_(diag), lm_(lm), tokens_(tokens), logits_(logits) {}

  bool run() {
    out_.name = in_.name;
    out_.config = in_.config;
    for (const ir::Param& p : in_.params) {
      const ir::Value& v = in_.value(p.value);
      shared_[p.value] = out_.add_param(v.name, v.type, p.init, v.loc);
    }
    needed_ = needed_nodes();
    positional_ = positional_values();
    setup();
    if (!phase(ir::Phase::Forward, "prefill", lm_.context) || !phase(ir::Phase::Decode, "decode", 1)) return false;
    // The setup's values the phases read are read again by every prefill
    // and decode step: outputs, so the memory plan keeps them to the end.
    int i = 0;
    for (ValueId v : kept_) out_.outputs.emplace_back(fmt::format("setup.{}", i++), v);
    return true;
  }

 private:
  const ir::Graph& in_;
  ir::Graph& out_;
  ir::Diagnostics& diag_;
  const LanguageModel& lm_;
  ValueId tokens_, logits_;
  std::map<ValueId, ValueId> shared_;         // params, by the forward graph's id
  std::map<ir::NodeId, ValueId> key_cache_, value_cache_;  // per attention node
  std::set<ir::NodeId> needed_;
  std::set<ValueId> positional_;  // the forward graph's values that carry the tokens' sequence axis
  // The setup's values (computed from parameters and constants alone: a
  // weight's cast to the policy's dtype, rotary frequencies, ALiBi slopes),
  // by the forward graph's id, and those the two phases read.
  std::map<ValueId, ValueId> setup_;
  std::set<ValueId> kept_;

  std::set<ir::NodeId> needed_nodes() const {
    std::set<ir::NodeId> nodes;
    std::vector<ValueId> work{logits_};
    std::set<ValueId> seen{logits_};
    while (!work.empty()) {
      ValueId v = work.back();
      work.pop_back();
      ir::NodeId p = in_.value(v).producer;
      if (p == ir::kNoNode || !nodes.insert(p).second) continue;
      const ir::Node& n = in_.node(p);
      // Dropout is the identity here: its rng words are not read.
      const size_t reads = n.op == Op::Dropout ? 1 : n.inputs.size();
      for (size_t i = 0; i < reads; ++i)
        if (seen.insert(n.inputs[i]).second) work.push_back(n.inputs[i]);
    }
    return nodes;
  }

  // The forward graph's values that depend on the tokens or on arange(seq):
  // the only ones a phase computes itself (views and fills aside).
  std::set<ValueId> positional_values() const {
    std::set<ValueId> out{tokens_};
    for (ir::NodeId id : in_.schedule()) {
      if (!needed_.count(id)) continue;
      const ir::Node& n = in_.node(id);
      bool positional = n.op == Op::Iota && seq_axes(in_.value(n.out()).type).size() == 1;
      for (ValueId x : n.inputs) positional = positional || out.count(x);
      if (positional) out.insert(n.outputs.begin(), n.outputs.end());
    }
    return out;
  }

  // Builds every needed node that is not positional once, in the setup
  // phase, which runs before any prefill or decode step: whichever way a
  // prompt enters the cache, what the phases read from it is computed.
  void setup() {
    ir::Builder b(out_);
    b.set_phase(ir::Phase::Setup);
    setup_ = shared_;
    for (ir::NodeId id : in_.schedule()) {
      const ir::Node& n = in_.node(id);
      if (!needed_.count(id) || positional_.count(n.out())) continue;
      if (n.op == Op::Dropout) {  // the identity, as in evaluation
        setup_[n.out()] = setup_.at(n.in(0));
        continue;
      }
      b.set_loc(n.loc);
      b.set_scope(n.scope);
      std::vector<ValueId> inputs;
      for (ValueId x : n.inputs) {
        auto it = setup_.find(x);
        NAPKIN_INTERNAL_CHECK(it != setup_.end(), "derive_inference: %{} read before it is built", x);
        inputs.push_back(it->second);
      }
      const ValueId v = b.must(b.add(n.op, inputs, n.attrs));
      for (size_t i = 0; i < n.outputs.size(); ++i) {  // every output (top_k's values and indices)
        const ValueId made = out_.node(out_.value(v).producer).outputs[i];
        b.rename_dims(made, in_.value(n.outputs[i]).type.dims);
        setup_[n.outputs[i]] = made;
      }
    }
  }

  // The axes of t that are the sequence: the seq dim's name at its size.
  std::vector<int> seq_axes(const ir::TensorType& t) const {
    std::vector<int> axes;
    for (int i = 0; i < t.rank(); ++i)
      if (t.dims[i].name == lm_.seq_dim && t.dims[i].size == lm_.context) axes.push_back(i);
    return axes;
  }

  // `dims` at a phase of `length` positions: the sequence axis at `length`;
  // a moe() layer's token axis (batch · context tokens) and slot axes
  // (ir::kMoeTokensDim, ...) at batch · length tokens, every one of them
  // routed (C = T). `phase_axes` (if given) counts the axes that change;
  // nullopt for a moe() axis of an unexpected size.
  std::optional<std::vector<ir::Dim>> at_length(std::vector<ir::Dim> dims, int64_t length, int* phase_axes) const {
    const int64_t tokens = lm_.batch * lm_.context, phase_tokens = lm_.batch * length;
    int changed = 0;
    for (ir::Dim& d : dims) {
      if (d.name == lm_.seq_dim && d.size == lm_.context) {
        d.size = length;
      } else if (d.name == ir::kMoeTokensDim) {
        if (d.size != tokens) return std::nullopt;
        d.size = phase_tokens;
      } else if (d.name == ir::kMoeCapacityDim) {
        d.size = phase_tokens;
      } else if (d.name == ir::kMoeSlotsDim) {
        // E·C slots: the layers of that many give E (layers of E·C slots alike but of other E: refused).
        int64_t experts = 0;
        for (const ir::Graph::MoeLayer& l : in_.moe_layers)
          if (l.experts * l.capacity == d.size) {
            if (experts != 0 && experts != l.experts) return std::nullopt;
            experts = l.experts;
          }
        if (experts == 0) return std::nullopt;
        d.size = experts * phase_tokens;
      } else {
        continue;
      }
      ++changed;
    }
    if (phase_axes) *phase_axes = changed;
    return dims;
  }

  bool mixes(const ir::Node& n, const std::string& what) {
    diag_.error(n.loc,
                fmt::format("napkin sample: {} ({}) {}; a decoder with a KV cache can only be derived from a model "
                            "whose ops work position by position, apart from causal attention",
                            ir::op_name(n.op), n.scope.empty() ? std::string("top level") : n.scope, what),
                "keep every activation [batch, " + lm_.seq_dim + ", ...] and mix positions only with "
                "attention(q, k, v) or softmax(causal_mask(scores)) followed by the product with v");
    return false;
  }

  bool phase(ir::Phase phase, const std::string& prefix, int64_t length) {
    ir::Builder b(out_);
    b.set_phase(phase);
    const ir::Value& tok = in_.value(tokens_);
    ir::TensorType tokens_type = tok.type;
    tokens_type.dims[1].size = length;
    ir::TensorType positions_type;
    positions_type.dtype = ir::DType::I32;
    positions_type.dims = {tokens_type.dims[1]};
    std::map<ValueId, ValueId> map = shared_;
    map[tokens_] = out_.add_input(prefix + ".tokens", tokens_type, tok.loc);
    const ValueId positions = out_.add_input(prefix + ".positions", positions_type, tok.loc);

    for (ir::NodeId id : in_.schedule()) {
      if (!needed_.count(id)) continue;
      const ir::Node& n = in_.node(id);
      b.set_loc(n.loc);
      b.set_scope(n.scope);
      if (n.op == Op::Dropout) {  // the identity, as in evaluation
        map[n.out()] = map.at(n.in(0));
        continue;
      }
      const ir::OpInfo& info = ir::op_info(n.op);
      if (!positional_.count(n.out()) && info.op_class != ir::OpClass::View && info.loop != ir::LoopKind::Fill) {
        map[n.out()] = setup_.at(n.out());  // a kernel on parameters and constants: the setup made it
        continue;
      }
      std::vector<ValueId> inputs;
      for (ValueId x : n.inputs) {
        auto it = map.find(x);
        NAPKIN_INTERNAL_CHECK(it != map.end(), "derive_inference: %{} read before it is built", x);
        inputs.push_back(it->second);
        const ir::NodeId producer = out_.value(it->second).producer;
        if (producer != ir::kNoNode && out_.node(producer).phase == ir::Phase::Setup) kept_.insert(it->second);
      }
      const ir::TensorType& old_out = in_.value(n.out()).type;

      if (n.op == Op::Iota && seq_axes(old_out).size() == 1) {  // arange(seq): the phase's positions
        ValueId p = positions;
        if (old_out.dtype != ir::DType::I32) p = b.must(b.add(Op::Cast, {p}, {{"dtype", old_out.dtype}}));
        map[n.out()] = p;
        continue;
      }
      if (!positional_.count(n.out())) {  // a view or a fill: free or cheap, made again where it is read
        ValueId v = b.must(b.add(n.op, inputs, n.attrs));
        b.rename_dims(v, old_out.dims);
        map[n.out()] = v;
        continue;
      }
      if (info.element_index == ir::ElementIndex::RowCol) return mixes(n, "reads each element's (row, column)");

      if (n.op == Op::Attention) {
        if (!derive_attention(b, n, inputs, positions, length, map)) return false;
        continue;
      }
      if (n.op == Op::Rope) {
        // A rope left standalone whose positions are the sequence index: at
        // the phase's positions instead (a decode step's one row is not at 0).
        ir::RopeParams p = ir::rope_params(n.attrs);
        const std::vector<int> x_seq = seq_axes(in_.value(n.in(0)).type);
        if (!p.explicit_positions && x_seq.size() == 1 && p.seq_axis == x_seq[0]) {
          p.explicit_positions = true;
          ir::Attrs attrs = n.attrs;
          ir::set_rope_attrs(attrs, p);
          const ValueId v = b.must(b.add(Op::Rope, {inputs[0], positions}, attrs));
          std::vector<ir::Dim> dims = old_out.dims;
          dims[static_cast<size_t>(x_seq[0])].size = length;
          b.rename_dims(v, dims);
          map[n.out()] = v;
          continue;
        }
      }
      if (info.loop == ir::LoopKind::Attention || info.loop == ir::LoopKind::Classifier ||
          info.loop == ir::LoopKind::CachedAttention || info.loop == ir::LoopKind::Mse || info.backward_only)
        return mixes(n, "is not a position-wise op");

      // Position-wise: the output keeps exactly one sequence axis (or a
      // moe() layer's token or slot axis), and a row op's row is not it.
      int phase_axes = 0;
      std::optional<std::vector<ir::Dim>> phase_dims = at_length(old_out.dims, length, &phase_axes);
      if (!phase_dims || phase_axes != 1)
        return mixes(n, fmt::format("makes {} from the sequence axis '{}'", ir::to_string(old_out), lm_.seq_dim));
      if (info.loop == ir::LoopKind::Rows) {
        const ir::RowParams p = std::get<ir::RowParams>(ir::loop_params(n.op, n.attrs));
        const ir::TensorType& x = in_.value(n.in(0)).type;
        int64_t axis = p.axis < 0 ? p.axis + x.rank() : p.axis;
        std::vector<int> x_seq = seq_axes(x);
        if (x_seq.size() == 1 && axis == x_seq[0]) return mixes(n, "normalizes along the sequence axis");
      }
      const std::vector<ir::Dim>& dims = *phase_dims;
      ValueId v;
      if (n.op == Op::Reshape) {
        v = b.must(b.reshape(inputs[0], dims));
      } else {
        ir::Attrs attrs = n.attrs;
        if (attrs.has("shape")) {  // broadcast
          std::vector<int64_t> shape;
          for (const ir::Dim& d : dims) shape.push_back(d.size);
          attrs.set("shape", shape);
        }
        // A moe() layer routes every token of a phase: capacity is a training device (docs/model-language.md).
        if (n.op == Op::MoeSlots) attrs.set("capacity", dims[0].size);
        ir::Built built = b.add(n.op, inputs, attrs);
        if (!built.ok()) return mixes(n, "cannot be rebuilt at one position: " + built.error);
        v = built.value;
      }
      if (out_.value(v).type.sizes() != ir::TensorType{old_out.dtype, dims}.sizes())
        return mixes(n, fmt::format("gives {} at length {}, not {}", ir::to_string(out_.value(v).type), length,
                                    ir::to_string(ir::TensorType{old_out.dtype, dims})));
      // Every output (top_k's indices, moe_slots' slots and counts) at the phase's length.
      const ir::Node& rebuilt = out_.node(out_.value(v).producer);
      NAPKIN_INTERNAL_CHECK(rebuilt.outputs.size() == n.outputs.size(), "derive_inference: {} rebuilt with {} outputs",
                            ir::op_name(n.op), rebuilt.outputs.size());
      for (size_t i = 0; i < n.outputs.size(); ++i) {
        std::optional<std::vector<ir::Dim>> out_dims = at_length(in_.value(n.outputs[i]).type.dims, length, nullptr);
        std::vector<int64_t> want;
        if (out_dims)
          for (const ir::Dim& d : *out_dims) want.push_back(d.size);
        NAPKIN_INTERNAL_CHECK(out_dims && out_.value(rebuilt.outputs[i]).type.sizes() == want,
                              "derive_inference: output {} of {} at length {}", i, ir::op_name(n.op), length);
        b.rename_dims(rebuilt.outputs[i], *out_dims);
        map[n.outputs[i]] = rebuilt.outputs[i];
      }
    }
    ValueId logits = map.at(logits_);
    out_.outputs.emplace_back(prefix + ".logits", logits);
    return true;
  }

  // attention(q, k, v) -> cached_attention(q, k, v, caches, positions).
  bool derive_attention(ir::Builder& b, const ir::Node& n, const std::vector<ValueId>& inputs, ValueId positions,
                        int64_t length, std::map<ValueId, ValueId>& map) {
    const ir::TensorType& q = in_.value(n.in(0)).type;
    const ir::TensorType& k = in_.value(n.in(1)).type;
    auto is_seq = [&](const ir::Dim& d) { return d.name == lm_.seq_dim && d.size == lm_.context; };
    if (n.attrs.get_int("causal") == 0) return mixes(n, "is attention without a causal mask");
    if (!is_seq(q.dims[2]) || !is_seq(k.dims[2])) return mixes(n, "attends over an axis that is not the sequence");
    const ir::AttentionParams p = std::get<ir::AttentionParams>(ir::loop_params(n.op, n.attrs));
    if (p.seq_major_out) return mixes(n, "stores its output sequence-major");
    if (!key_cache_.count(n.id)) {
      const int layer = static_cast<int>(key_cache_.size());
      const std::string where = n.scope.empty() ? fmt::format("{}", layer) : n.scope;
      key_cache_[n.id] = out_.add_state("kv_cache." + where + ".k", k, n.loc);
      value_cache_[n.id] = out_.add_state("kv_cache." + where + ".v", k, n.loc);
    }
    ir::Attrs attrs{{"scale", p.scale}};
    if (p.rope) ir::set_rope_attrs(attrs, *p.rope, "rope_");  // q and the new k rotated at the rows' positions
    ValueId o = b.must(b.add(Op::CachedAttention,
                             {inputs[0], inputs[1], inputs[2], key_cache_[n.id], value_cache_[n.id], positions},
                             attrs));
    std::vector<ir::Dim> dims = q.dims;
    dims[2].size = length;
    b.rename_dims(o, dims);
    map[n.out(0)] = o;
    return true;
  }
};

class DeriveInference : public Pass {
 public:
  std::string_view name() const override { return "derive_inference"; }

  bool run(ir::Graph& g, ir::Diagnostics& diag) override {
    std::string why;
    std::optional<LanguageModel> lm = find_language_model(g, &why);
    if (!lm) {
      ValueId loss = g.find_output("loss");
      diag.error(loss != ir::kNoValue ? g.value(loss).loc : ir::SourceLoc{},
                 fmt::format("napkin sample: model '{}' is not a language model: {}", g.name, why),
                 "sampling needs tokens [batch, seq] in and cross_entropy(logits [batch, seq, vocab], targets) as the loss");
      return false;
    }
    const ir::Node* ce = loss_node(g);
    ir::Graph inference;
    Deriver d(g, inference, diag, *lm, tokens_input(g, ce->in(1)), ce->in(0));
    if (!d.run()) return false;  // with the error in diag: the pass manager stops
    g = std::move(inference);
    return true;
  }
};

}  // namespace

std::unique_ptr<Pass> make_derive_inference_pass() { return std::make_unique<DeriveInference>(); }

}  // namespace napkin::passes
