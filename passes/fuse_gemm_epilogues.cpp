#include "passes/fuse_gemm_epilogues.h"

#include <algorithm>
#include <set>
#include <vector>

#include "ir/fusion_group.h"
#include "ir/gemm_epilogue.h"
#include "ir/use_list.h"
#include "passes/fuse_elementwise.h"
#include "passes/matmul_epilogues.h"
#include "passes/mixed_precision.h"
#include "passes/rematerialize.h"

namespace napkin::passes {

namespace {

using ir::DType;
using ir::NodeId;
using ir::Op;
using ir::ValueId;

class FuseGemmEpilogues : public Pass {
 public:
  std::string_view name() const override { return "fuse_gemm_epilogues"; }

  explicit FuseGemmEpilogues(Rematerialized& rematerialized) : rematerialized_(rematerialized) {}

  bool run(ir::Graph& g, ir::Diagnostics&) override {
    const bool gelus = store_gelu_inputs(g, rematerialized_);
    const bool epilogues = fuse(g);
    return fuse_bias_gradients(g) || epilogues || gelus;
  }

 private:
  // The gelu after a GEMM and its gradient before one (GPT's MLP), made the
  // epilogue form: the forward stores the gelu's input in D's dtype (aux)
  // where it stored the GEMM's rounded result for the backward to recompute
  // the input from (passes/rematerialize.h), and the backward reads aux;
  // the bias gradient that summed the gradient's f32 values in the same
  // kernel sums its stored bf16 values instead, a kernel of its own (as
  // PyTorch's autocast and llm.c do): then the gradient GEMM stores
  // dgelu(sums, aux) directly (cuBLASLt's GELU_AUX_BIAS and DGELU). Only
  // where every piece is as described; anything else is left as it is.
  static bool store_gelu_inputs(ir::Graph& g, Rematerialized& rematerialized) {
    const ir::FusionGroups groups = ir::fusion_groups(g);
    const ir::UseList uses(g);
    auto only_reader = [&](ValueId v, NodeId id) {
      return uses.buffer_readers(v).size() == 1 && uses.buffer_readers(v)[0] == id;
    };
    bool changed = false;
    std::vector<NodeId> erased;
    for (const ir::FusionGroup& fg : groups.groups) {
      // The forward: [cast(mm, f32), add(., b), gelu, cast(., bf16)].
      if (fg.phase != ir::Phase::Forward || fg.nodes.size() != 4) continue;
      const ir::Node &c1 = g.node(fg.nodes[0]), &pre = g.node(fg.nodes[1]), &gelu = g.node(fg.nodes[2]),
                     &m = g.node(fg.nodes[3]);
      if (c1.op != Op::Cast || pre.op != Op::Add || gelu.op != Op::Gelu || m.op != Op::Cast) continue;
      const ValueId r = c1.in(0);
      const NodeId mm = g.value(r).producer;
      if (mm == ir::kNoNode || g.value(r).is_view() || uses.escapes(r) || g.node(mm).group >= 0) continue;
      if (g.value(r).type.dtype != DType::BF16 || g.value(c1.out()).type.dtype != DType::F32) continue;
      if (pre.in(0) != c1.out() || !only_reader(pre.out(), gelu.id) || gelu.in(0) != pre.out()) continue;
      const ValueId bias = pre.in(1);
      // The backward's recomputations of the gelu input from r: cast(r, f32) + bias, read by gelu gradients only.
      std::vector<NodeId> casts, adds;
      bool recomputed = true;
      for (NodeId reader : uses.buffer_readers(r)) {
        if (reader == c1.id) continue;
        const ir::Node& c2 = g.node(reader);
        if (c2.op != Op::Cast || c2.phase != ir::Phase::Backward || uses.buffer_readers(c2.out()).size() != 1) {
          recomputed = false;
          break;
        }
        const ir::Node& add = g.node(uses.buffer_readers(c2.out())[0]);
        if (add.op != Op::Add || add.in(0) != c2.out() || add.in(1) != bias) recomputed = false;
        for (NodeId user : uses.buffer_readers(add.out()))
          if (g.node(user).op != Op::GeluGrad || g.node(user).in(0) != add.out()) recomputed = false;
        casts.push_back(c2.id);
        adds.push_back(add.id);
      }
      if (!recomputed || adds.empty()) continue;
      // The epilogue the forward becomes must be the form (with the aux it will store).
      const ir::TensorType aux_type{DType::BF16, g.value(pre.out()).type.dims};
      if (!ir::gemm_with_epilogue_shape(g, g.node(mm)) || aux_type.sizes().back() % 8 != 0 ||
          g.value(m.out()).type.dtype != DType::BF16)
        continue;
      // add_node may move the nodes: what is needed of them, first.
      const ValueId pre_out = pre.out();
      const NodeId pre_origin = pre.origin, last = fg.nodes.back();
      const ir::SourceLoc pre_loc = pre.loc;
      const std::string pre_scope = pre.scope;
      ir::Attrs narrow;
      narrow.set("dtype", DType::BF16);
      narrow.set(kAmpCastAttr, std::string(kGeluInputCastReason));  // the AMP audit lists it with its reason
      const NodeId aux = g.add_node(Op::Cast, {pre_out}, {aux_type}, narrow, pre_loc, pre_scope, ir::Phase::Forward);
      g.node(aux).group = fg.id;
      g.node(aux).origin = pre_origin;
      if (!g.value(pre_out).name.empty()) g.value(g.node(aux).out()).name = g.value(pre_out).name + ".bf16";
      move_in_schedule(g, aux, last, /*after=*/true);
      for (size_t i = 0; i < adds.size(); ++i) {
        const ir::Node add = g.node(adds[i]);  // a copy: add_node may move the nodes
        ir::Attrs widen;
        widen.set("dtype", DType::F32);
        const NodeId w = g.add_node(Op::Cast, {g.node(aux).out()}, {g.value(add.out()).type}, widen, add.loc, add.scope,
                                    ir::Phase::Backward);
        g.node(w).group = add.group;
        g.node(w).origin = add.origin;
        move_in_schedule(g, w, adds[i], /*after=*/false);
        g.replace_uses(add.out(), g.node(w).out());
        erased.push_back(adds[i]);
        erased.push_back(casts[i]);
        // The recomputation's add is gone (its cast costs no FLOPs).
        rematerialized.flops_added -= ir::op_info(add.op).cost(g, add).flops;
      }
      ++rematerialized.stored_by_epilogues;
      changed = true;
    }
    g.erase_nodes(erased);
    if (!changed) return false;
    // The gradients' groups: [cast(dm, f32), cast(aux, f32), gelu_grad, cast(., bf16), reduce_sum(gelu_grad)].
    const ir::FusionGroups after = ir::fusion_groups(g);
    for (const ir::FusionGroup& fg : after.groups) {
      if (fg.phase != ir::Phase::Backward || fg.reduction == ir::kNoNode || fg.nodes.size() != 5) continue;
      const ir::Node &c3 = g.node(fg.nodes[0]), &w = g.node(fg.nodes[1]), &gg = g.node(fg.nodes[2]),
                     &dh = g.node(fg.nodes[3]);
      ir::Node& sum = g.node(fg.nodes[4]);
      if (c3.op != Op::Cast || w.op != Op::Cast || gg.op != Op::GeluGrad || dh.op != Op::Cast) continue;
      if (sum.op != Op::ReduceSum || sum.in(0) != gg.out() || dh.in(0) != gg.out()) continue;
      const ValueId r = c3.in(0);
      const NodeId mm = g.value(r).producer;
      if (mm == ir::kNoNode || g.value(r).is_view() || g.node(mm).group >= 0 || g.value(r).type.dtype != DType::BF16)
        continue;
      if (!ir::match_gemm_epilogue(g, mm, c3.out(), {w.id, gg.id, dh.id})) continue;
      // The bias gradient sums the stored bf16 gradient, widening as it loads, in a kernel of its own.
      sum.inputs[0] = dh.out();
      sum.attrs.set("dtype", DType::F32);
      sum.group = -1;
    }
    return true;
  }

  bool fuse(ir::Graph& g) {
    const ir::FusionGroups groups = ir::fusion_groups(g);
    const ir::UseList uses(g);
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
      if (uses.escapes(r) || uses.read_through_view(r) || uses.buffer_readers(r).size() != 1) continue;
      const ir::Node& reader = g.node(uses.buffer_readers(r).front());
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
        if (fg.reduction != ir::kNoNode || groups.batch_of[fg.id] >= 0) continue;
        nodes = fg.nodes;
      }
      if (nodes.front() != reader.id) continue;
      const ValueId acc = widened ? reader.out() : r;
      std::vector<NodeId> steps(nodes.begin() + (widened ? 1 : 0), nodes.end());
      if (steps.empty() || !ir::gemm_with_epilogue_shape(g, c)) continue;
      // One GEMM per epilogue: where two products meet in an add, the first claims it (the other is its C).
      if (claimed.count(steps.front())) continue;
      const std::optional<ir::GemmEpilogue> form = ir::match_gemm_epilogue(g, c.id, acc, steps);
      if (!form) continue;
      // Only D (and a gelu's stored input) leave the kernel: every other value the steps make is read by them alone.
      bool closed = true;
      for (NodeId step : nodes) {
        const ValueId v = g.node(step).out();
        if (v == form->result || (form->activation == ir::GemmActivation::Gelu && v == form->aux)) continue;
        if (uses.escapes(v) || uses.read_through_view(v)) closed = false;
        for (NodeId user : uses.buffer_readers(v))
          if (std::find(nodes.begin(), nodes.end(), user) == nodes.end()) closed = false;
      }
      if (!closed) continue;
      claimed.insert(steps.front());
      fusions.push_back({c.id, widened ? reader.id : ir::kNoNode, steps.front(),
                         reader.group >= 0 ? reader.group : next_group++});
    }
    if (fusions.empty()) return false;

    std::vector<NodeId> erased;
    for (const Fusion& f : fusions) {
      if (f.widening_cast != ir::kNoNode) {
        accumulate_in_f32(g, f.contraction, f.widening_cast);  // the cast's readers read the f32 sums
        erased.push_back(f.widening_cast);
      }
      g.node(f.contraction).group = f.group;
      g.node(f.first_step).group = f.group;
      move_in_schedule(g, f.contraction, f.first_step, /*after=*/false);
    }
    g.erase_nodes(erased);
    renumber_groups(g);
    return true;
  }

  // A weight gradient's GEMM and the bias gradient that sums the same B
  // (ir/gemm_epilogue.h GemmBiasGrad) become one kernel: the reduction
  // joins the contraction in a group of two, right after it, and reads the
  // very value the contraction reads (a view of the same bytes with the
  // same layout before). Only where nothing between reads the sums early.
  static bool fuse_bias_gradients(ir::Graph& g) {
    std::vector<int> position(g.num_nodes(), -1);
    auto number = [&] {
      for (int p = 0; p < static_cast<int>(g.schedule().size()); ++p) position[g.schedule()[p]] = p;
    };
    number();
    const ir::UseList uses(g);
    std::vector<std::vector<NodeId>> gemms_of_b(g.num_values());  // ungrouped contractions, by their B's buffer
    for (NodeId id : g.schedule()) {
      const ir::Node& n = g.node(id);
      if ((n.op == Op::MatMul || n.op == Op::Einsum) && n.group < 0 && n.inputs.size() == 2)
        gemms_of_b[g.value(n.in(1)).storage].push_back(id);
    }
    auto same_view = [&](ValueId x, ValueId y) {
      const ir::Value &a = g.value(x), &b = g.value(y);
      return a.storage == b.storage && a.type.dtype == b.type.dtype && a.type.same_shape(b.type) &&
             a.layout.offset == b.layout.offset &&
             a.layout.strides == b.layout.strides;
    };
    int next_group = 0;
    for (NodeId id : g.schedule()) next_group = std::max(next_group, g.node(id).group + 1);
    std::set<NodeId> taken;
    bool changed = false;
    const std::vector<NodeId> schedule = g.schedule();
    for (NodeId rid : schedule) {
      ir::Node& r = g.node(rid);
      if (r.op != Op::ReduceSum || r.group >= 0 || r.phase == ir::Phase::Optimizer) continue;
      const ValueId x = r.in(0);
      for (NodeId cid : gemms_of_b[g.value(x).storage]) {
        const ir::Node& c = g.node(cid);
        if (taken.count(cid) || c.phase != r.phase || !same_view(x, c.in(1))) continue;
        // The sums move to right after the GEMM: nothing up to there may read them.
        bool early = false;
        for (NodeId user : uses.buffer_readers(r.out())) early = early || position[user] <= position[cid];
        if (early) continue;
        r.inputs[0] = c.in(1);
        if (!ir::match_gemm_bias_grad(g, cid, rid)) {
          r.inputs[0] = x;
          continue;
        }
        taken.insert(cid);
        g.node(cid).group = r.group = next_group++;
        move_in_schedule(g, rid, cid, /*after=*/true);
        number();
        changed = true;
        break;
      }
    }
    if (changed) renumber_groups(g);
    return changed;
  }

  Rematerialized& rematerialized_;

  // Moves `id` (a node just built, at the schedule's end, or one of the
  // schedule's) to right before `anchor`, or right after it.
  static void move_in_schedule(ir::Graph& g, NodeId id, NodeId anchor, bool after) {
    std::vector<NodeId>& schedule = g.mutable_schedule();
    schedule.erase(std::find(schedule.begin(), schedule.end(), id));
    schedule.insert(std::find(schedule.begin(), schedule.end(), anchor) + (after ? 1 : 0), id);
  }
};

}  // namespace

std::unique_ptr<Pass> make_fuse_gemm_epilogues_pass(Rematerialized& rematerialized) {
  return std::make_unique<FuseGemmEpilogues>(rematerialized);
}

}  // namespace napkin::passes
