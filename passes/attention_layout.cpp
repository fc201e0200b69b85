#include "passes/attention_layout.h"

#include <algorithm>
#include <vector>

namespace napkin::passes {

namespace {

using ir::NodeId;
using ir::Op;
using ir::ValueId;

class AttentionLayout : public Pass {
 public:
  std::string_view name() const override { return "attention_layout"; }

  bool run(ir::Graph& g, ir::Diagnostics&) override {
    std::vector<std::vector<NodeId>> readers(g.num_values());
    for (NodeId id : g.schedule())
      for (ValueId v : g.node(id).inputs) readers[v].push_back(id);
    const std::vector<bool> escaping = g.escaping_buffers();
    const std::vector<int64_t> heads_first{0, 2, 1, 3};
    std::vector<NodeId> erased;
    for (NodeId id : g.schedule()) {
      const ir::Node& a = g.node(id);
      if (a.op != Op::Attention || (a.attrs.has("seq_major_out") && a.attrs.get_int("seq_major_out") != 0)) continue;
      const ValueId o = a.out(0);
      if (escaping[o]) continue;
      NodeId view = ir::kNoNode, copy = ir::kNoNode;
      std::vector<NodeId> grads;
      bool only = true;
      for (NodeId r : readers[o]) {
        const ir::Node& n = g.node(r);
        if (n.op == Op::AttentionGrad && n.in(3) == o && std::count(n.inputs.begin(), n.inputs.end(), o) == 1) {
          grads.push_back(r);
        } else if (n.op == Op::Permute && view == ir::kNoNode && n.attrs.get_ints("perm") == heads_first) {
          view = r;
        } else {
          only = false;
        }
      }
      if (!only || view == ir::kNoNode) continue;
      // Any other view of o's buffer (through the permute view too) would see the new layout.
      const ValueId p = g.node(view).out();
      if (readers[p].size() != 1 || g.node(readers[p][0]).op != Op::Copy || escaping[p]) continue;
      copy = readers[p][0];
      const ValueId y = g.node(copy).out();
      if (g.node(copy).group >= 0 || escaping[y] || !ir::is_contiguous(g.value(y).layout, g.value(y).type.sizes()))
        continue;
      // o becomes [B, T, H, D], contiguous; the permute view of it is [B, H, T, D] again, for the gradients.
      ir::Value& ov = g.value(o);
      const std::vector<ir::Dim> bhsd = ov.type.dims;
      std::swap(ov.type.dims[1], ov.type.dims[2]);
      ov.layout = ir::contiguous_layout(ov.type.sizes());
      ir::Value& pv = g.value(p);
      pv.type.dims = bhsd;
      pv.layout.strides = {ov.layout.strides[0], ov.layout.strides[2], ov.layout.strides[1], ov.layout.strides[3]};
      pv.layout.offset = 0;
      g.node(id).attrs.set("seq_major_out", int64_t{1});
      for (NodeId grad : grads)
        for (ValueId& in : g.node(grad).inputs)
          if (in == o) in = p;
      g.replace_uses(y, o);
      erased.push_back(copy);
      if (grads.empty()) erased.push_back(view);
    }
    if (erased.empty()) return false;
    g.erase_nodes(erased);
    return true;
  }
};

}  // namespace

std::unique_ptr<Pass> make_attention_layout_pass() { return std::make_unique<AttentionLayout>(); }

}  // namespace napkin::passes
