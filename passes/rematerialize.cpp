#include "passes/rematerialize.h"

#include <functional>
#include <set>
#include <vector>

#include "ir/use_list.h"
#include "passes/recompute.h"

namespace napkin::passes {

namespace {

using ir::NodeId;
using ir::ValueId;

// A chain longer than this is left alone: the backward kernel would redo
// more work than a load saves.
constexpr int kMaxChain = 8;

bool elementwise(const ir::Node& n) {
  return ir::op_info(n.op).op_class == ir::OpClass::Elementwise && n.outputs.size() == 1;
}

class Rematerialize : public Pass {
 public:
  explicit Rematerialize(Rematerialized& report) : report_(report) {}
  std::string_view name() const override { return "rematerialize"; }

  bool run(ir::Graph& g, ir::Diagnostics&) override {
    const ir::UseList uses(g);
    // Per buffer: read by a backward node (saved), and whether every such
    // read could take the recomputation into its kernel.
    std::vector<bool> saved(g.num_values(), false), fusible_reads(g.num_values(), true), read_late(g.num_values(), false);
    for (NodeId id : g.schedule()) {
      const ir::Node& n = g.node(id);
      if (n.phase == ir::Phase::Forward) continue;
      for (ValueId in : n.inputs) {
        const ir::Value& v = g.value(in);
        const ValueId s = v.storage;
        const ir::Value& buffer = g.value(s);
        if (buffer.kind != ir::ValueKind::Result || g.node(buffer.producer).phase != ir::Phase::Forward) continue;
        if (n.phase == ir::Phase::Optimizer) {
          read_late[s] = true;
          continue;
        }
        saved[s] = true;
        const bool direct = in == s && elementwise(n) && g.value(n.out()).type.same_shape(buffer.type);
        fusible_reads[s] = fusible_reads[s] && direct;
      }
    }
    std::set<ValueId> recomputed;
    Rematerialized did;
    for (NodeId id : g.schedule()) {
      const ir::Node& p = g.node(id);
      if (p.phase != ir::Phase::Forward || !elementwise(p)) continue;
      const ValueId v = p.out();
      if (!saved[v] || !fusible_reads[v] || uses.escapes(v) || read_late[v] || g.value(v).storage != v) continue;
      std::set<ValueId> chain{v}, leaves;
      bool too_long = false;
      std::function<void(const ir::Node&)> walk = [&](const ir::Node& n) {
        for (ValueId in : n.inputs) {
          const ir::Value& x = g.value(in);
          if (x.kind != ir::ValueKind::Result) continue;  // params, data, state: resident
          const ir::Node& q = g.node(x.producer);
          if (q.op == ir::Op::Constant) continue;  // a scalar the kernel inlines (fuse_elementwise)
          const bool joins = !x.is_view() && q.phase == ir::Phase::Forward && elementwise(q) && !saved[in] && !uses.escapes(in);
          if (!joins) {
            leaves.insert(x.storage);
            continue;
          }
          if (!chain.insert(in).second) continue;
          if (static_cast<int>(chain.size()) > kMaxChain) {
            too_long = true;
            return;
          }
          walk(q);
        }
      };
      walk(p);
      if (too_long) continue;
      int64_t added = 0;
      for (ValueId leaf : leaves)
        if (!saved[leaf]) added += g.value(leaf).type.bytes();
      const int64_t bytes = g.value(v).type.bytes();
      if (added > bytes) continue;
      recomputed.insert(chain.begin(), chain.end());
      saved[v] = false;
      for (ValueId leaf : leaves) saved[leaf] = true;
      ++did.values;
      did.bytes_before += bytes;
      did.bytes_after += added;
    }
    report_ = did;
    if (recomputed.empty()) return false;
    g = with_recompute(g, recomputed, did.flops_added);
    report_.flops_added = did.flops_added;
    return true;
  }

 private:
  Rematerialized& report_;
};

}  // namespace

std::unique_ptr<Pass> make_rematerialize_pass(Rematerialized& report) { return std::make_unique<Rematerialize>(report); }

}  // namespace napkin::passes
