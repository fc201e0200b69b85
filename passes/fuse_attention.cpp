#include "passes/fuse_attention.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <optional>

#include "ir/builder.h"
#include "ir/internal_check.h"
#include "ir/use_list.h"

namespace napkin::passes {

namespace {

using ir::NodeId;
using ir::Op;
using ir::ValueId;

// What a site's match found: the two einsums, the chain between them, and
// the attention's operands as axis ids of the einsums.
struct Match {
  NodeId scores = ir::kNoNode;  // einsum(q, k)
  NodeId mix = ir::kNoNode;     // einsum(att, v)
  std::vector<NodeId> chain;    // scales, the mask and the softmax, from scores to softmax
  bool causal = false;
  double scale = 1;
  int64_t head_dim = -1;   // the axis id q·kᵀ contracts (in the scores einsum's ids)
  int64_t value_dim = -1;  // v's head_dim axis id (in the mixing einsum's ids)
};

// The value of a rank-0 constant (through broadcasts of it), if `v` is one.
std::optional<double> scalar_constant(const ir::Graph& g, ValueId v) {
  for (;;) {
    NodeId p = g.value(v).producer;
    if (p == ir::kNoNode) return std::nullopt;
    const ir::Node& n = g.node(p);
    if (n.op == Op::Broadcast) {
      v = n.in(0);
      continue;
    }
    if (n.op == Op::Constant) return n.attrs.get_double("value");
    return std::nullopt;
  }
}

// "line 41" of a node, or its op's name when it has no location.
std::string where(const ir::Node& n) {
  return n.loc.known() ? fmt::format("{} at line {}", ir::op_name(n.op), n.loc.line) : std::string(ir::op_name(n.op));
}

// Whether a permutation keeps every axis in place.
bool is_identity(const std::vector<int64_t>& perm) {
  for (size_t i = 0; i < perm.size(); ++i)
    if (perm[i] != static_cast<int64_t>(i)) return false;
  return true;
}

// The position of `id` in `ids`, -1 if absent.
int position(const std::vector<int64_t>& ids, int64_t id) {
  auto it = std::find(ids.begin(), ids.end(), id);
  return it == ids.end() ? -1 : static_cast<int>(it - ids.begin());
}

class FuseAttention : public Pass {
 public:
  explicit FuseAttention(std::vector<AttentionSite>& sites) : sites_(sites) {}
  std::string_view name() const override { return "fuse_attention"; }

  bool run(ir::Graph& g, ir::Diagnostics&) override {
    const ir::UseList uses(g);
    const std::vector<NodeId> schedule = g.schedule();
    std::map<NodeId, std::vector<NodeId>> inserted;  // at a mixing einsum: the nodes that replace it
    for (NodeId id : schedule) {
      const ir::Node& n = g.node(id);
      if (n.op != Op::Softmax || n.phase != ir::Phase::Forward) continue;
      Match m;
      std::string reason;
      if (!find_site(g, n, m)) continue;  // not attention-shaped: no site
      AttentionSite site{n.loc, n.scope, false, ""};
      if (check(g, uses, n, m, reason)) {
        const int first_new = g.num_nodes();
        fuse(g, m);
        for (int k = first_new; k < g.num_nodes(); ++k) inserted[m.mix].push_back(k);
        site.fused = true;
      } else {
        site.reason = reason;
      }
      sites_.push_back(site);
    }
    if (inserted.empty()) return false;
    // The new nodes run where the mixing einsum ran: their operands (q, k,
    // v) are defined before it and its readers come after.
    g.insert_after(schedule, inserted);
    return true;
  }

 private:
  std::vector<AttentionSite>& sites_;

  // Walks from a softmax back through a causal mask and scalar scales to an
  // einsum; false when there is none (then the softmax is no site).
  static bool find_site(const ir::Graph& g, const ir::Node& softmax, Match& m) {
    ValueId x = softmax.in(0);
    m.chain = {softmax.id};
    for (;;) {
      NodeId p = g.value(x).producer;
      if (p == ir::kNoNode) return false;
      const ir::Node& n = g.node(p);
      if (n.op == Op::CausalMask && !m.causal) {
        m.causal = true;
      } else if ((n.op == Op::Mul || n.op == Op::Div) && g.value(n.out()).type.rank() == 4) {
        auto c1 = scalar_constant(g, n.in(1));
        auto c0 = n.op == Op::Mul ? scalar_constant(g, n.in(0)) : std::nullopt;
        if (c1) {
          m.scale = n.op == Op::Mul ? m.scale * *c1 : m.scale / *c1;
          m.chain.insert(m.chain.begin(), n.id);
          x = n.in(0);
          continue;
        }
        if (c0) {
          m.scale *= *c0;
          m.chain.insert(m.chain.begin(), n.id);
          x = n.in(1);
          continue;
        }
        return false;
      } else if (n.op == Op::Einsum) {
        m.scores = n.id;
        return true;
      } else {
        return false;
      }
      m.chain.insert(m.chain.begin(), n.id);
      x = n.in(0);
    }
  }

  // Whether the site can be fused; `reason` says why not.
  static bool check(const ir::Graph& g, const ir::UseList& uses, const ir::Node& softmax, Match& m, std::string& reason) {
    const ir::Node& scores = g.node(m.scores);
    const ir::TensorType& st = g.value(scores.out()).type;
    if (st.rank() != 4) {
      reason = fmt::format("the scores are rank {}, not [batch, heads, queries, keys]", st.rank());
      return false;
    }
    if (softmax.attrs.get_int("axis") != 3) {
      reason = "the softmax is not over the keys (the scores' last axis)";
      return false;
    }
    const auto &lhs = scores.attrs.get_ints("lhs"), &rhs = scores.attrs.get_ints("rhs"), &out = scores.attrs.get_ints("out");
    // out = (b, h, i, j); q has (b, h, i, d), k (b, h, j, d), in any order.
    bool qk = lhs.size() == 4 && rhs.size() == 4 && out.size() == 4;
    int64_t d = -1;
    for (int64_t id : lhs)
      if (position(out, id) < 0) d = id;
    qk = qk && d >= 0 && position(rhs, d) >= 0;
    for (int a = 0; qk && a < 3; ++a) qk = position(lhs, out[a]) >= 0 && (a == 2 || position(rhs, out[a]) >= 0);
    qk = qk && position(rhs, out[3]) >= 0 && position(lhs, out[3]) < 0 && position(rhs, out[2]) < 0;
    if (!qk) {
      reason = fmt::format("the scores einsum \"{}\" is not q·kᵀ: (b, h, i, d) by (b, h, j, d) to (b, h, i, j)",
                           scores.attrs.get_string("spec"));
      return false;
    }
    // Every score and probability is read only along the chain.
    std::vector<ValueId> inner{scores.out()};
    for (NodeId c : m.chain) inner.push_back(g.node(c).out());
    for (size_t i = 0; i + 1 < inner.size(); ++i)
      if (!uses.single(inner[i])) {
        reason = fmt::format("the scores ({}) are also read elsewhere: the fused kernel never stores them",
                             where(g.node(g.value(inner[i]).producer)));
        return false;
      }
    ValueId att = inner.back();
    const std::vector<NodeId>& readers = uses.readers(att);
    if (readers.size() + uses.escapes(att) != 1) {
      reason = "the probabilities are read by more than one op: the fused kernel never stores them";
      return false;
    }
    // The one reader: einsum(att, v) -> (b, h, i, dv).
    const ir::Node* mix = readers.empty() ? nullptr : &g.node(readers[0]);
    if (!mix || mix->op != Op::Einsum || mix->in(0) != att) {
      reason = fmt::format("the probabilities go to {}, not einsum(att, v)", mix ? where(*mix) : "a graph output");
      return false;
    }
    const auto &al = mix->attrs.get_ints("lhs"), &vr = mix->attrs.get_ints("rhs"), &mo = mix->attrs.get_ints("out");
    // al names the probabilities' axes (b, h, i, j) as the mixing einsum calls them.
    bool av = al.size() == 4 && vr.size() == 4 && mo.size() == 4 && position(mo, al[3]) < 0 && position(vr, al[3]) >= 0 &&
              position(vr, al[0]) >= 0 && position(vr, al[1]) >= 0 && position(vr, al[2]) < 0 &&
              position(mo, al[0]) >= 0 && position(mo, al[1]) >= 0 && position(mo, al[2]) >= 0;
    int64_t dv = -1;
    for (int64_t id : vr)
      if (id != al[0] && id != al[1] && id != al[3]) dv = id;
    av = av && dv >= 0 && position(mo, dv) >= 0;
    if (!av) {
      reason = fmt::format("the mixing einsum \"{}\" is not att·v: (b, h, i, j) by (b, h, j, d) to (b, h, i, d)",
                           mix->attrs.get_string("spec"));
      return false;
    }
    const ir::TensorType& vt = g.value(mix->in(1)).type;
    const ir::TensorType& qt = g.value(scores.in(0)).type;
    int64_t dk = qt.dims[position(lhs, d)].size, dvs = vt.dims[position(vr, dv)].size;
    if (dk != dvs) {
      reason = fmt::format("the values' head_dim {} differs from the keys' {}", dvs, dk);
      return false;
    }
    if (m.causal && st.dims[2].size != st.dims[3].size) {
      reason = fmt::format("causal_mask over {} queries and {} keys: the fused kernel aligns the mask to the last key",
                           st.dims[2].size, st.dims[3].size);
      return false;
    }
    if (!(m.scale > 0)) {
      reason = fmt::format("the scale {} is not positive", m.scale);
      return false;
    }
    m.mix = mix->id;
    m.head_dim = d;
    m.value_dim = dv;
    return true;
  }

  // Builds attention(q, k, v) in the mixing einsum's place and points its readers at it.
  void fuse(ir::Graph& g, const Match& m) {
    const ir::Node scores = g.node(m.scores);  // copies: building nodes may move the node storage
    const ir::Node mix = g.node(m.mix);
    const ir::Node softmax = g.node(m.chain.back());
    ir::Builder b(g);
    b.set_loc(softmax.loc);
    b.set_scope(softmax.scope);
    const auto &lhs = scores.attrs.get_ints("lhs"), &rhs = scores.attrs.get_ints("rhs"), &out = scores.attrs.get_ints("out");
    const auto &al = mix.attrs.get_ints("lhs"), &vr = mix.attrs.get_ints("rhs"), &mo = mix.attrs.get_ints("out");
    const int64_t d = m.head_dim, dv = m.value_dim;
    // An operand viewed with its axes in `order` (ids), then contiguous along the last.
    auto arrange = [&](ValueId v, const std::vector<int64_t>& ids, const std::vector<int64_t>& order) {
      std::vector<int64_t> perm;
      for (int64_t id : order) perm.push_back(position(ids, id));
      if (!is_identity(perm)) v = b.must(b.permute(v, perm));
      return b.unit_inner_stride(v);
    };
    ValueId q = arrange(scores.in(0), lhs, {out[0], out[1], out[2], d});
    ValueId k = arrange(scores.in(1), rhs, {out[0], out[1], out[3], d});
    ValueId v = arrange(mix.in(1), vr, {al[0], al[1], al[3], dv});
    ValueId o = b.must(b.add(Op::Attention, {q, k, v}, {{"causal", int64_t{m.causal}}, {"scale", m.scale}}));
    // o is (b, h, i, d) in the mixing einsum's names; its output may order them otherwise.
    std::vector<int64_t> o_ids{al[0], al[1], al[2], dv}, perm;
    for (int64_t id : mo) perm.push_back(position(o_ids, id));
    // A contiguous value of the einsum's own shape and layout, so views of the
    // old result stay valid views of the new one.
    ValueId result = is_identity(perm) ? o : b.must(b.add(Op::Copy, {b.must(b.permute(o, perm))}));
    b.rename_dims(result, g.value(mix.out()).type.dims);
    g.value(result).name = g.value(mix.out()).name;
    g.value(mix.out()).name.clear();
    g.replace_uses(mix.out(), result);
  }
};

}  // namespace

std::unique_ptr<Pass> make_fuse_attention_pass(std::vector<AttentionSite>& sites) {
  return std::make_unique<FuseAttention>(sites);
}

}  // namespace napkin::passes
