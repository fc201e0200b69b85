#include "passes/fuse_classifier.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "ir/builder.h"
#include "ir/internal_check.h"
#include "ir/use_list.h"

namespace napkin::passes {

namespace {

using ir::NodeId;
using ir::Op;
using ir::ValueId;

// What a site's match found: the contraction, the optional promotion cast,
// and the fused op's operands as the contraction reads them.
struct Match {
  NodeId matmul = ir::kNoNode;
  NodeId cast = ir::kNoNode;  // between the contraction and the loss; kNoNode when none
  ValueId x = ir::kNoValue, w = ir::kNoValue;
  bool w_transposed = false;  // w is [d, V]: the op reads it through a permute view
};

class FuseClassifier : public Pass {
 public:
  explicit FuseClassifier(std::vector<ClassifierSite>& sites) : sites_(sites) {}
  std::string_view name() const override { return "fuse_classifier"; }

  bool run(ir::Graph& g, ir::Diagnostics&) override {
    const ir::UseList uses(g);
    const std::vector<NodeId> schedule = g.schedule();
    std::map<NodeId, std::vector<NodeId>> inserted;  // at a cross_entropy: the nodes that replace it
    for (NodeId id : schedule) {
      const ir::Node& n = g.node(id);
      if (n.op != Op::CrossEntropy || n.phase != ir::Phase::Forward) continue;
      ClassifierSite site{n.loc, n.scope, false, ""};
      Match m;
      site.reason = check(g, uses, n, m);
      if (site.reason.empty()) {
        const int first_new = g.num_nodes();
        fuse(g, n.id, m);
        for (int k = first_new; k < g.num_nodes(); ++k) inserted[id].push_back(k);
        site.fused = true;
      }
      sites_.push_back(site);
    }
    if (inserted.empty()) return false;
    // The new nodes run where the cross_entropy ran: x, w and the targets are
    // defined before it and the loss's readers come after.
    g.insert_after(schedule, inserted);
    return true;
  }

 private:
  std::vector<ClassifierSite>& sites_;

  // "" when the site fuses; otherwise why not, for the report.
  static std::string check(const ir::Graph& g, const ir::UseList& uses, const ir::Node& loss, Match& m) {
    ValueId logits = loss.in(0);
    if (g.value(logits).is_view()) return "the logits are a view of another value";
    NodeId p = g.value(logits).producer;
    if (p != ir::kNoNode && g.node(p).op == Op::Cast) {
      if (!uses.single_buffer(logits)) return "the logits are read by another op";
      m.cast = p;
      logits = g.node(p).in(0);
      if (g.value(logits).is_view()) return "the logits are a view of another value";
      p = g.value(logits).producer;
    }
    if (p == ir::kNoNode || (g.node(p).op != Op::Einsum && g.node(p).op != Op::MatMul))
      return "the logits are not made by a matmul or einsum";
    if (!uses.single_buffer(logits)) return "the logits are read by another op";
    m.matmul = p;
    const ir::Node& mm = g.node(p);
    const ir::TensorType& out = g.value(logits).type;
    if (mm.op == Op::MatMul) {
      // x [..., d] @ w [d, V]: only a 2-D right operand is a classifier's weight.
      if (g.value(mm.in(1)).type.rank() != 2) return "the matmul's weight is not 2-D";
      if (g.value(mm.in(0)).type.rank() != out.rank()) return "the matmul broadcasts its left operand";
      m.x = mm.in(0);
      m.w = mm.in(1);
      m.w_transposed = true;
    } else {
      const auto &lhs = mm.attrs.get_ints("lhs"), &rhs = mm.attrs.get_ints("rhs"), &ids = mm.attrs.get_ints("out");
      const int64_t vocab = ids.back();
      const bool w_right = std::find(rhs.begin(), rhs.end(), vocab) != rhs.end();
      const auto& x_ids = w_right ? lhs : rhs;
      const auto& w_ids = w_right ? rhs : lhs;
      m.x = w_right ? mm.in(0) : mm.in(1);
      m.w = w_right ? mm.in(1) : mm.in(0);
      if (w_ids.size() != 2) return "the classes' operand is not a 2-D weight [V, d]";
      const int64_t d = w_ids[0] == vocab ? w_ids[1] : w_ids[0];
      m.w_transposed = w_ids[0] != vocab;
      // x must be [rows..., d] with the rows in the logits' order: its ids are the output's leading ids, then d.
      std::vector<int64_t> want(ids.begin(), ids.end() - 1);
      want.push_back(d);
      if (x_ids != want) return "the activations are not laid out [..., d] in the logits' order";
    }
    const ir::DType dt = g.value(m.x).type.dtype;
    if (g.value(m.w).type.dtype != dt || out.dtype != dt) return "the contraction mixes dtypes";
    if (g.value(loss.out()).type.dtype != ir::classifier_loss_dtype(dt))
      return fmt::format("the loss is computed in {}, not {}", ir::dtype_name(g.value(loss.out()).type.dtype),
                         ir::dtype_name(ir::classifier_loss_dtype(dt)));
    return "";
  }

  void fuse(ir::Graph& g, NodeId loss_id, const Match& m) {
    const ir::Node loss = g.node(loss_id);  // a copy: building nodes may move the node storage
    ir::Builder b(g);
    b.set_loc(loss.loc);
    b.set_scope(loss.scope);
    ValueId x = m.x;
    if (!ir::is_contiguous(g.value(x).layout, g.value(x).type.sizes())) x = b.must(b.add(Op::Copy, {x}));
    ValueId w = m.w_transposed ? b.must(b.permute(m.w, {1, 0})) : m.w;
    ValueId result = b.must(b.add(Op::LinearCrossEntropy, {x, w, loss.in(1)}));
    g.value(result).name = g.value(loss.out()).name;
    g.value(loss.out()).name.clear();
    g.replace_uses(loss.out(), result);
  }
};

}  // namespace

std::unique_ptr<Pass> make_fuse_classifier_pass(std::vector<ClassifierSite>& sites) {
  return std::make_unique<FuseClassifier>(sites);
}

}  // namespace napkin::passes
