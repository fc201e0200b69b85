#include "passes/fuse_gemm_epilogues.h"

#include <algorithm>
#include <map>
#include <set>
#include <vector>

#include "ir/fusion_group.h"
#include "ir/gemm_epilogue.h"

namespace napkin::passes {

namespace {

using ir::DType;
using ir::NodeId;
using ir::Op;
using ir::ValueId;

class FuseGemmEpilogues : public Pass {
 public:
  std::string_view name() const override { return "fuse_gemm_epilogues"; }

  bool run(ir::Graph& g, ir::Diagnostics&) override {
    const ir::FusionGroups groups = ir::fusion_groups(g);
    const std::vector<bool> escaping = g.escaping_buffers();
    // Readers of each buffer, direct or through a view.
    std::vector<std::vector<NodeId>> readers(g.num_values());
    std::vector<bool> read_through_view(g.num_values(), false);
    for (NodeId id : g.schedule())
      for (ValueId v : g.node(id).inputs) {
        readers[g.value(v).storage].push_back(id);
        if (g.value(v).is_view()) read_through_view[g.value(v).storage] = true;
      }
    int next_group = static_cast<int>(groups.groups.size());

    struct Fusion {
      NodeId contraction, widening_cast, first_step;
      int group;
    };
    std::vector<Fusion> fusions;
    std::set<NodeId> claimed;  // first steps already given to a contraction
    for (NodeId id : g.schedule()) {
      const ir::Node& c = g.node(id);
      if ((c.op != Op::MatMul && c.op != Op::Einsum) || c.phase == ir::Phase::Optimizer || c.group >= 0) continue;
      const ValueId r = c.out();
      if (escaping[r] || read_through_view[r] || readers[r].size() != 1) continue;
      const ir::Node& reader = g.node(readers[r].front());
      const DType t = g.value(r).type.dtype;
      // Under bf16-mixed the result is widened first (f16 keeps AMP's rounding:
      // passes/matmul_epilogues.h says why).
      const bool widened = t == DType::BF16 && reader.op == Op::Cast && g.value(reader.out()).type.dtype == DType::F32 &&
                           !c.attrs.has("dtype");
      if (t != DType::F32 && !widened) continue;
      // The steps: the reader's group (all of it, in order), or the reader alone.
      std::vector<NodeId> nodes{reader.id};
      if (reader.group >= 0) {
        const ir::FusionGroup& fg = groups.groups[reader.group];
        if (fg.reduction != ir::kNoNode || groups.batch_of[fg.id] >= 0 || fg.outputs.size() != 1) continue;
        nodes = fg.nodes;
      }
      if (nodes.front() != reader.id) continue;
      const ValueId acc = widened ? reader.out() : r;
      std::vector<NodeId> steps(nodes.begin() + (widened ? 1 : 0), nodes.end());
      if (steps.empty() || !ir::gemm_with_epilogue_shape(g, c)) continue;
      // Only D leaves the kernel: every step's result but the last is read by the steps alone.
      bool closed = true;
      for (size_t i = 0; i + 1 < nodes.size(); ++i) {
        const ValueId v = g.node(nodes[i]).out();
        if (escaping[v] || read_through_view[v]) closed = false;
        for (NodeId user : readers[v])
          if (std::find(nodes.begin(), nodes.end(), user) == nodes.end()) closed = false;
      }
      // One GEMM per epilogue: where two products meet in an add, the first claims it (the other is its C).
      if (!closed || claimed.count(steps.front()) || !ir::match_gemm_epilogue(g, c.id, acc, steps)) continue;
      claimed.insert(steps.front());
      fusions.push_back({c.id, widened ? reader.id : ir::kNoNode, steps.front(),
                         reader.group >= 0 ? reader.group : next_group++});
    }
    if (fusions.empty()) return false;

    std::vector<NodeId> erased;
    std::vector<NodeId>& schedule = g.mutable_schedule();
    for (const Fusion& f : fusions) {
      ir::Node& c = g.node(f.contraction);
      if (f.widening_cast != ir::kNoNode) {
        // Accumulate into the f32 result directly; the cast's readers read it.
        c.attrs.set("dtype", DType::F32);
        g.value(c.out()).type.dtype = DType::F32;
        const ValueId old = g.node(f.widening_cast).out();
        g.replace_uses(old, c.out());
        if (g.value(c.out()).name.empty()) std::swap(g.value(c.out()).name, g.value(old).name);
        erased.push_back(f.widening_cast);
      }
      c.group = f.group;
      g.node(f.first_step).group = f.group;
      schedule.erase(std::find(schedule.begin(), schedule.end(), f.contraction));
      schedule.insert(std::find(schedule.begin(), schedule.end(), f.first_step), f.contraction);
    }
    g.erase_nodes(erased);
    renumber_groups(g);
    return true;
  }

 private:
  // Group ids 0 .. n-1 in schedule order (ir/fusion_group.h).
  static void renumber_groups(ir::Graph& g) {
    std::map<int, int> renamed;
    for (NodeId id : g.schedule()) {
      ir::Node& n = g.node(id);
      if (n.group < 0) continue;
      auto [it, added] = renamed.emplace(n.group, static_cast<int>(renamed.size()));
      n.group = it->second;
    }
  }
};

}  // namespace

std::unique_ptr<Pass> make_fuse_gemm_epilogues_pass() { return std::make_unique<FuseGemmEpilogues>(); }

}  // namespace napkin::passes
