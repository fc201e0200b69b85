#include "passes/fuse_rope.h"

#include <algorithm>
#include <optional>

#include "ir/rope.h"
#include "ir/use_list.h"

namespace napkin::passes {

namespace {

using ir::NodeId;
using ir::Op;
using ir::ValueId;

// The rope node producing v, if it is one that rotates a [B, H, seq, D]
// value's last axis by its sequence index: the only kind the attention
// kernels apply.
std::optional<ir::RopeParams> fusable_rope(const ir::Graph& g, ValueId v) {
  const NodeId p = g.value(v).producer;
  if (p == ir::kNoNode || g.node(p).op != Op::Rope) return std::nullopt;
  const ir::Node& r = g.node(p);
  const ir::RopeParams rp = ir::rope_params(r.attrs);
  if (g.value(v).type.rank() != 4 || rp.axis != 3 || rp.seq_axis != 2 || rp.explicit_positions || rp.inverse)
    return std::nullopt;
  return rp;
}

// The parameters an attention kernel reads (ir/loop.h AttentionParams::rope):
// the pairing and the frequencies, not the op's own axes.
bool same_rotation(const ir::RopeParams& a, const ir::RopeParams& b) {
  return a.style == b.style && a.theta == b.theta && a.factor == b.factor &&
         a.low_freq_factor == b.low_freq_factor && a.high_freq_factor == b.high_freq_factor &&
         a.original_context == b.original_context;
}

class FuseRope : public Pass {
 public:
  std::string_view name() const override { return "fuse_rope"; }

  bool run(ir::Graph& g, ir::Diagnostics&) override {
    const ir::UseList uses(g);
    bool changed = false;
    for (NodeId id : g.schedule()) {
      const ir::Node& a = g.node(id);
      if (a.op != Op::Attention || ir::has_rope(a.attrs, "rope_")) continue;
      const ValueId q = a.in(0), k = a.in(1);
      const std::optional<ir::RopeParams> rq = fusable_rope(g, q), rk = fusable_rope(g, k);
      if (!rq || !rk || !same_rotation(*rq, *rk)) continue;
      if (g.value(q).type.dims[2].size != g.value(k).type.dims[2].size) continue;
      // Every reader of the rotated values is this attention, as q or k.
      auto only_qk = [&](ValueId r) {
        if (uses.escapes(r)) return false;
        const std::vector<NodeId>& readers = uses.readers(r);
        return std::all_of(readers.begin(), readers.end(), [&](NodeId n) { return n == id; }) && a.in(2) != r;
      };
      if (!only_qk(q) || !only_qk(k)) continue;
      ir::Node& attention = g.node(id);
      attention.inputs[0] = g.node(g.value(q).producer).in(0);
      attention.inputs[1] = g.node(g.value(k).producer).in(0);
      ir::set_rope_attrs(attention.attrs, *rq, "rope_");
      changed = true;
    }
    return changed;
  }
};

}  // namespace

std::unique_ptr<Pass> make_fuse_rope_pass() { return std::make_unique<FuseRope>(); }

}  // namespace napkin::passes
