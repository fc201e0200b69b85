#include "passes/fold_concat_copy.h"

#include <algorithm>
#include <map>
#include <vector>

#include "ir/builder.h"
#include "ir/internal_check.h"
#include "ir/use_list.h"

namespace napkin::passes {

namespace {

using ir::NodeId;
using ir::Op;
using ir::ValueId;

class FoldConcatCopy : public Pass {
 public:
  std::string_view name() const override { return "fold_concat_copy"; }

  bool run(ir::Graph& g, ir::Diagnostics&) override {
    const ir::UseList uses(g);
    // The nodes that read v's buffer, directly or through views, not counting the views.
    auto non_view_readers = [&](ValueId v) {
      return std::ranges::count_if(uses.buffer_readers(v),
                                   [&](NodeId r) { return ir::op_info(g.node(r).op).op_class != ir::OpClass::View; });
    };

    const std::vector<NodeId> schedule = g.schedule();
    std::map<NodeId, std::vector<NodeId>> inserted;  // at a folded copy: the nodes that replace it
    for (NodeId id : schedule) {
      const ir::Node& copy = g.node(id);
      if (copy.op != Op::Copy) continue;
      const NodeId p = g.value(copy.in(0)).producer;
      if (p == ir::kNoNode || g.node(p).op != Op::Permute) continue;
      const ValueId concat_out = g.node(p).in(0);
      const NodeId c = g.value(concat_out).producer;
      if (c == ir::kNoNode || g.node(c).op != Op::Concat || g.value(concat_out).is_view()) continue;
      if (non_view_readers(concat_out) != 1 || uses.escapes(concat_out) || g.node(c).phase != copy.phase) continue;
      const int first_new = g.num_nodes();
      fold(g, id, p, c);
      for (int k = first_new; k < g.num_nodes(); ++k) inserted[id].push_back(k);
    }
    if (inserted.empty()) return false;
    g.insert_after(schedule, inserted);
    return true;
  }

 private:
  static void fold(ir::Graph& g, NodeId copy_id, NodeId permute_id, NodeId concat_id) {
    const ir::Node copy = g.node(copy_id);  // copies: building nodes may move the node storage
    const ir::Node concat = g.node(concat_id);
    const std::vector<int64_t> perm = g.node(permute_id).attrs.get_ints("perm");
    ir::Builder b(g);
    b.set_loc(copy.loc);
    b.set_scope(copy.scope);
    b.set_phase(copy.phase);
    b.set_origin(copy.origin);
    const int64_t axis = concat.attrs.get_int("axis");
    int64_t moved = -1;
    for (size_t j = 0; j < perm.size(); ++j)
      if (perm[j] == axis) moved = static_cast<int64_t>(j);
    NAPKIN_INTERNAL_CHECK(moved >= 0, "fold_concat_copy: the concat axis is not in the permutation");
    std::vector<ValueId> inputs;
    for (ValueId x : concat.inputs) inputs.push_back(b.must(b.permute(x, perm)));
    ir::Attrs attrs = concat.attrs;
    attrs.set("axis", moved);
    const ValueId result = b.must(b.add(Op::Concat, inputs, attrs));
    b.rename_dims(result, g.value(copy.out()).type.dims);
    g.value(result).name = g.value(copy.out()).name;
    g.value(copy.out()).name.clear();
    g.replace_uses(copy.out(), result);
  }
};

}  // namespace

std::unique_ptr<Pass> make_fold_concat_copy_pass() { return std::make_unique<FoldConcatCopy>(); }

}  // namespace napkin::passes
