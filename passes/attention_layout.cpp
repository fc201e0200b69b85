#include "passes/attention_layout.h"

#include <algorithm>
#include <vector>

#include "ir/use_list.h"

namespace napkin::passes {

namespace {

using ir::NodeId;
using ir::Op;
using ir::ValueId;

class AttentionLayout : public Pass {
 public:
  std::string_view name() const override { return "attention_layout"; }

  bool run(ir::Graph& g, ir::Diagnostics&) override {
    const ir::UseList uses(g);
    const std::vector<int64_t> heads_first{0, 2, 1, 3};
    std::vector<NodeId> erased;
    for (NodeId id : g.schedule()) {
      const ir::Node& a = g.node(id);
      if (a.op != Op::Attention || (a.attrs.has("seq_major_out") && a.attrs.get_int("seq_major_out") != 0)) continue;
      const ValueId o = a.out(0);
      if (uses.escapes(o)) continue;
      NodeId view = ir::kNoNode, copy = ir::kNoNode;
      std::vector<NodeId> grads;
      bool only = true;
      for (NodeId r : uses.readers(o)) {
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
      if (!uses.single(p) || g.node(uses.readers(p)[0]).op != Op::Copy) continue;
      copy = uses.readers(p)[0];
      const ValueId y = g.node(copy).out();
      if (g.node(copy).group >= 0 || uses.escapes(y) || !ir::is_contiguous(g.value(y).layout, g.value(y).type.sizes()))
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
    pack_gradients(g, uses, erased);
    if (erased.empty()) return false;
    g.erase_nodes(erased);
    return true;
  }

 private:
  // The gradient of a fused qkv split "b s (three h hd) -> three b h s hd":
  //   g = concat(permute(reshape(dq, [1, b, h, s, hd]), [1, 3, 0, 2, 4]), ...dk, ...dv, axis=2)   [b, s, 3, h, hd]
  // attention_grad writes g itself (packed_grad=1) and the concat goes.
  static void pack_gradients(ir::Graph& g, const ir::UseList& uses, std::vector<NodeId>& erased) {
    const std::vector<int64_t> to_rows{1, 3, 0, 2, 4};
    for (NodeId id : g.schedule()) {
      const ir::Node& a = g.node(id);
      if (a.op != Op::AttentionGrad || a.outputs.size() != 3) continue;
      // Each gradient: one reshape to [1, B, H, T, D], read by one permute to [B, T, 1, H, D], read by one concat.
      std::vector<NodeId> views;
      NodeId concat = ir::kNoNode;
      bool ok = true;
      for (int i = 0; i < 3 && ok; ++i) {
        const ValueId d = a.out(i);
        ok = uses.single(d) && g.value(d).type.same_shape(g.value(a.out(0)).type);
        if (!ok) break;
        const ir::Node& r = g.node(uses.readers(d)[0]);
        std::vector<int64_t> one_more{1};  // [1, B, H, T, D]
        for (int64_t size : g.value(d).type.sizes()) one_more.push_back(size);
        ok = r.op == Op::Reshape && g.value(r.out()).type.sizes() == one_more &&
             uses.readers(r.out()).size() == 1;
        if (!ok) break;
        const ir::Node& p = g.node(uses.readers(r.out())[0]);
        ok = p.op == Op::Permute && p.attrs.get_ints("perm") == to_rows && uses.readers(p.out()).size() == 1;
        if (!ok) break;
        const ir::Node& c = g.node(uses.readers(p.out())[0]);
        ok = c.op == Op::Concat && c.attrs.get_int("axis") == 2 && c.inputs.size() == 3 && c.in(i) == p.out() &&
             (concat == ir::kNoNode || concat == c.id);
        concat = c.id;
        views.push_back(r.id);
        views.push_back(p.id);
      }
      if (!ok || concat == ir::kNoNode || g.node(concat).group >= 0) continue;
      const ValueId packed = g.node(concat).out();
      if (!ir::is_contiguous(g.value(packed).layout, g.value(packed).type.sizes())) continue;
      // attention_grad makes the concat's value: [B, T, 3, H, D].
      ir::Node& grad = g.node(id);
      grad.attrs.set("packed_grad", int64_t{1});
      grad.outputs = {packed};
      g.value(packed).producer = id;
      erased.push_back(concat);
      erased.insert(erased.end(), views.begin(), views.end());
    }
  }
};

}  // namespace

std::unique_ptr<Pass> make_attention_layout_pass() { return std::make_unique<AttentionLayout>(); }

}  // namespace napkin::passes
