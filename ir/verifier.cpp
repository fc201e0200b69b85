#include "ir/verifier.h"

#include <fmt/format.h>

namespace napkin::ir {

namespace {

// Fusion groups (ir/fusion_group.h): contiguous in the schedule, one phase,
// members elementwise (or copies, or folded constants) of one output shape,
// but for a last member that reduces a member's result or a value a member
// reads (of that shape) or, in a GEMM's group, the contraction's B (its
// bias gradient: ir/gemm_epilogue.h GemmBiasGrad), and no member reads a value of its own group through a view (the kernel
// holds those in registers, one element at a time).
template <typename Fail>
void verify_fusion_groups(const Graph& g, Fail&& fail) {
  std::vector<int> last_position;
  std::vector<Phase> phase;
  std::vector<const TensorType*> shape;
  std::vector<bool> closed;  // per group: its reduction was seen
  std::vector<NodeId> head_of;  // per group: its contraction (a GEMM's group), or none
  const std::vector<NodeId>& schedule = g.schedule();
  for (int p = 0; p < static_cast<int>(schedule.size()); ++p) {
    if (schedule[p] < 0 || schedule[p] >= g.num_nodes()) continue;
    const Node& n = g.node(schedule[p]);
    if (n.group < 0) continue;
    std::string where = fmt::format("node {} ({}) of fusion group {}", n.id, op_name(n.op), n.group);
    if (n.group >= static_cast<int>(last_position.size())) {
      last_position.resize(n.group + 1, -1);
      phase.resize(n.group + 1, Phase::Forward);
      shape.resize(n.group + 1, nullptr);
      head_of.resize(n.group + 1, kNoNode);
    }
    int& last = last_position[n.group];
    const bool first_member = last < 0;
    if (last >= 0 && last != p - 1) fail(where + " is not contiguous with the group's other nodes");
    if (last >= 0 && phase[n.group] != n.phase) fail(where + " is in another phase than the group");
    last = p;
    phase[n.group] = n.phase;
    OpClass cls = op_info(n.op).op_class;
    if (n.group >= static_cast<int>(closed.size())) closed.resize(n.group + 1, false);
    if (closed[n.group]) fail(where + " comes after the group's reduction");
    if (n.op == Op::Constant) continue;
    const bool reduction = cls == OpClass::Reduction;
    // A contraction heads a GEMM epilogue group (ir/gemm_epilogue.h): its first member.
    const bool head = cls == OpClass::Contraction && first_member;
    if (cls != OpClass::Elementwise && n.op != Op::Copy && !reduction && !head) fail(where + " is not elementwise");
    if (head) head_of[n.group] = n.id;
    if (n.outputs.size() != 1) continue;
    const NodeId gemm = head_of[n.group];
    if (reduction && gemm != kNoNode && !n.inputs.empty() && g.node(gemm).inputs.size() == 2 &&
        n.in(0) == g.node(gemm).in(1)) {
      closed[n.group] = true;  // a bias gradient: the GEMM's B summed over k, any view, not of the group's shape
      continue;
    }
    if (reduction) {
      closed[n.group] = true;  // the group's last member; its input has the iteration shape
      // A member's result, or (not a view) a value of the iteration shape a member reads too.
      const Value& in = g.value(n.in(0));
      const bool member = in.producer != kNoNode && g.node(in.producer).group == n.group;
      if (in.is_view() || (!member && !shape[n.group]))
        fail(where + " does not reduce a member's result or one of its group's inputs directly");
    }
    const TensorType& t = reduction ? g.value(n.in(0)).type : g.value(n.out()).type;
    if (shape[n.group] && !shape[n.group]->same_shape(t)) fail(where + " has another output shape than the group");
    shape[n.group] = &t;
    for (ValueId in : n.inputs) {
      if (in < 0 || in >= g.num_values()) continue;
      const Value& v = g.value(in);
      NodeId maker = v.storage >= 0 ? g.value(v.storage).producer : kNoNode;
      if (v.is_view() && maker != kNoNode && g.node(maker).group == n.group)
        fail(where + fmt::format(" reads %{} of its own group through a view", v.storage));
    }
  }
}

}  // namespace

std::vector<std::string> verify(const Graph& g) {
  std::vector<std::string> problems;
  auto fail = [&](std::string msg) { problems.push_back(std::move(msg)); };
  std::vector<bool> defined(g.num_values(), false);
  for (ValueId v : g.inputs) {
    if (g.value(v).kind != ValueKind::Input) fail(fmt::format("input %{} is not of kind Input", v));
    defined[v] = true;
  }
  if (g.rng != kNoValue) {
    if (g.rng < 0 || g.rng >= g.num_values() || g.value(g.rng).kind != ValueKind::Input)
      fail(fmt::format("rng %{} is not a value of kind Input", g.rng));
    else
      defined[g.rng] = true;
  }
  for (const Param& p : g.params) {
    if (g.value(p.value).kind != ValueKind::Param) fail(fmt::format("param %{} is not of kind Param", p.value));
    defined[p.value] = true;
  }
  for (ValueId v : g.state) {
    if (g.value(v).kind != ValueKind::State) fail(fmt::format("state %{} is not of kind State", v));
    defined[v] = true;
  }
  std::vector<int> scheduled(g.num_nodes(), 0);
  Phase last_phase = Phase::Setup;
  for (NodeId id : g.schedule()) {
    if (id < 0 || id >= g.num_nodes()) {
      fail(fmt::format("schedule names node {} which does not exist", id));
      continue;
    }
    const Node& n = g.node(id);
    std::string where = fmt::format("node {} ({})", id, op_name(n.op));
    if (n.erased) fail(where + " is erased but scheduled");
    if (++scheduled[id] > 1) fail(where + " is scheduled twice");
    if (schedule_rank(n.phase) < schedule_rank(last_phase))
      fail(fmt::format("{} is in the {} phase but follows a {} node", where, phase_name(n.phase), phase_name(last_phase)));
    last_phase = n.phase;
    const OpInfo& info = op_info(n.op);
    if (info.arity >= 0 && static_cast<int>(n.inputs.size()) != info.arity)
      fail(fmt::format("{} has {} inputs, expected {}", where, n.inputs.size(), info.arity));
    std::vector<const TensorType*> types;
    bool inputs_ok = true;
    for (ValueId v : n.inputs) {
      if (v < 0 || v >= g.num_values()) {
        fail(fmt::format("{} reads value {} which does not exist", where, v));
        inputs_ok = false;
        continue;
      }
      if (!defined[v]) fail(fmt::format("{} reads %{} before it is defined", where, v));
      types.push_back(&g.value(v).type);
    }
    if (inputs_ok) {
      InferResult r = info.infer(types, n.attrs);
      if (!r.ok()) {
        fail(fmt::format("{} no longer type-checks: {}", where, r.error));
      } else if (r.outputs.size() != n.outputs.size()) {
        fail(fmt::format("{} has {} outputs, its rule gives {}", where, n.outputs.size(), r.outputs.size()));
      } else {
        for (size_t i = 0; i < n.outputs.size(); ++i) {
          const TensorType& have = g.value(n.outputs[i]).type;
          if (have.dtype != r.outputs[i].dtype || !have.same_shape(r.outputs[i]))
            fail(fmt::format("{} output {} is {} but its rule gives {}", where, i, to_string(have),
                             to_string(r.outputs[i])));
        }
      }
    }
    for (ValueId v : n.outputs) {
      const Value& value = g.value(v);
      if (value.producer != id) fail(fmt::format("%{} does not name {} as its producer", v, where));
      if (defined[v]) fail(fmt::format("%{} is defined twice", v));
      defined[v] = true;
      if (static_cast<int>(value.layout.strides.size()) != value.type.rank())
        fail(fmt::format("%{} has {} strides for rank {}", v, value.layout.strides.size(), value.type.rank()));
      bool view = info.op_class == OpClass::View;
      if (view && !n.inputs.empty() && value.storage != g.value(n.in(0)).storage)
        fail(fmt::format("view %{} does not alias its input's buffer", v));
      if (!view && value.storage != v) fail(fmt::format("%{} from a non-view op does not own its buffer", v));
      if (!view && !is_contiguous(value.layout, value.type.sizes()))
        fail(fmt::format("%{} owns its buffer but is not contiguous", v));
    }
  }
  verify_fusion_groups(g, fail);
  for (NodeId id = 0; id < g.num_nodes(); ++id)
    if (!g.node(id).erased && scheduled[id] == 0) fail(fmt::format("live node {} is not scheduled", id));
  for (const auto& [label, v] : g.outputs)
    if (v < 0 || v >= g.num_values() || !defined[v])
      fail(fmt::format("output '{}' names an undefined value", label));
  std::vector<bool> updated(g.num_values(), false);
  for (const Graph::Update& u : g.updates) {
    if (u.target < 0 || u.target >= g.num_values() || u.value < 0 || u.value >= g.num_values()) {
      fail(fmt::format("update %{} <- %{} names a value that does not exist", u.target, u.value));
      continue;
    }
    const Value &target = g.value(u.target), &value = g.value(u.value);
    if (target.kind != ValueKind::Param && target.kind != ValueKind::State)
      fail(fmt::format("update target %{} is neither a param nor optimizer state", u.target));
    if (updated[u.target]) fail(fmt::format("%{} is updated twice", u.target));
    updated[u.target] = true;
    if (!defined[u.value]) fail(fmt::format("update of %{} reads undefined %{}", u.target, u.value));
    if (target.type.dtype != value.type.dtype || !target.type.same_shape(value.type))
      fail(fmt::format("update of %{} {} from %{} {}", u.target, to_string(target.type), u.value, to_string(value.type)));
  }
  return problems;
}

}  // namespace napkin::ir
