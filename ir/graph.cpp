#include "ir/graph.h"

#include <fmt/format.h>

#include "ir/internal_check.h"

namespace napkin::ir {

std::string to_string(const InitSpec& init) {
  switch (init.kind) {
    case InitSpec::Kind::Zeros: return "zeros";
    case InitSpec::Kind::Ones: return "ones";
    case InitSpec::Kind::Constant: return fmt::format("constant({})", init.value);
    case InitSpec::Kind::Normal: return fmt::format("normal(std={})", init.std);
    case InitSpec::Kind::TruncNormal:
      return fmt::format("trunc_normal(std={}, a={}, b={})", init.std, init.lo, init.hi);
    case InitSpec::Kind::Xavier:
      return fmt::format("xavier(fan_in={}, std={:.6g}, a={:.6g}, b={:.6g})", init.fan_in, init.std,
                         init.lo, init.hi);
  }
  return "?";
}

std::string_view phase_name(Phase p) {
  switch (p) {
    case Phase::Forward: return "forward";
    case Phase::Backward: return "backward";
    case Phase::Optimizer: return "optimizer";
    case Phase::Decode: return "decode";
    case Phase::Setup: return "setup";
  }
  return "?";
}

int schedule_rank(Phase p) { return p == Phase::Setup ? -1 : static_cast<int>(p); }

ValueId Graph::new_value(std::string name, ValueKind kind, TensorType type, SourceLoc loc) {
  Value v;
  v.id = static_cast<ValueId>(values_.size());
  v.name = std::move(name);
  v.kind = kind;
  v.layout = contiguous_layout(type.sizes());
  v.type = std::move(type);
  v.storage = v.id;
  v.loc = std::move(loc);
  values_.push_back(std::move(v));
  return values_.back().id;
}

ValueId Graph::add_input(std::string name, TensorType type, SourceLoc loc) {
  ValueId id = new_value(std::move(name), ValueKind::Input, std::move(type), std::move(loc));
  inputs.push_back(id);
  return id;
}

ValueId Graph::add_param(std::string name, TensorType type, InitSpec init, SourceLoc loc) {
  ValueId id = new_value(std::move(name), ValueKind::Param, std::move(type), std::move(loc));
  params.push_back({id, init});
  return id;
}

ValueId Graph::add_state(std::string name, TensorType type, SourceLoc loc) {
  ValueId id = new_value(std::move(name), ValueKind::State, std::move(type), std::move(loc));
  state.push_back(id);
  return id;
}

ValueId Graph::add_rng(TensorType type, SourceLoc loc) {
  NAPKIN_INTERNAL_CHECK(rng == kNoValue, "the graph already has an rng tensor");
  rng = new_value("rng", ValueKind::Input, std::move(type), std::move(loc));
  return rng;
}

NodeId Graph::add_node(Op op, std::vector<ValueId> ins, std::vector<TensorType> output_types,
                       Attrs attrs, SourceLoc loc, std::string scope, Phase phase) {
  for (ValueId v : ins)
    NAPKIN_INTERNAL_CHECK(v >= 0 && v < num_values(), "{} input {} out of range", op_name(op), v);
  Node n;
  n.id = static_cast<NodeId>(nodes_.size());
  n.op = op;
  n.inputs = std::move(ins);
  n.attrs = std::move(attrs);
  n.loc = loc;
  n.scope = std::move(scope);
  n.phase = phase;
  for (TensorType& t : output_types) {
    ValueId out = new_value("", ValueKind::Result, std::move(t), loc);
    values_[out].producer = n.id;
    n.outputs.push_back(out);
  }
  nodes_.push_back(std::move(n));
  schedule_.push_back(nodes_.back().id);
  return nodes_.back().id;
}

void Graph::replace_uses(ValueId old, ValueId now) {
  for (NodeId id : schedule_)
    for (ValueId& in : nodes_[id].inputs)
      if (in == old) in = now;
  for (auto& [label, value] : outputs)
    if (value == old) value = now;
  for (Update& u : updates)
    if (u.value == old) u.value = now;
  for (Value& v : values_)
    if (v.storage == old && v.id != old) {
      NAPKIN_INTERNAL_CHECK(!value(now).is_view(), "views of %{} moved onto the view %{}", old, now);
      v.storage = now;
    }
}

void Graph::insert_after(const std::vector<NodeId>& base, const std::map<NodeId, std::vector<NodeId>>& after) {
  std::vector<NodeId> order;
  for (NodeId id : base) {
    order.push_back(id);
    if (auto it = after.find(id); it != after.end()) order.insert(order.end(), it->second.begin(), it->second.end());
  }
  schedule_ = std::move(order);
}

void Graph::erase_nodes(const std::vector<NodeId>& ids) {
  for (NodeId id : ids) {
    Node& n = node(id);
    NAPKIN_INTERNAL_CHECK(!n.erased, "node {} erased twice", id);
    n.erased = true;
  }
  std::erase_if(schedule_, [&](NodeId id) { return nodes_[id].erased; });
}

const Value& Graph::value(ValueId id) const {
  NAPKIN_INTERNAL_CHECK(id >= 0 && id < num_values(), "value id {} out of range", id);
  return values_[id];
}
Value& Graph::value(ValueId id) {
  NAPKIN_INTERNAL_CHECK(id >= 0 && id < num_values(), "value id {} out of range", id);
  return values_[id];
}
const Node& Graph::node(NodeId id) const {
  NAPKIN_INTERNAL_CHECK(id >= 0 && id < num_nodes(), "node id {} out of range", id);
  return nodes_[id];
}
Node& Graph::node(NodeId id) {
  NAPKIN_INTERNAL_CHECK(id >= 0 && id < num_nodes(), "node id {} out of range", id);
  return nodes_[id];
}

ValueId Graph::find_output(const std::string& output_name) const {
  for (const auto& [n, v] : outputs)
    if (n == output_name) return v;
  return kNoValue;
}

const Param* Graph::find_param(ValueId v) const {
  for (const Param& p : params)
    if (p.value == v) return &p;
  return nullptr;
}

int64_t Graph::param_count() const {
  int64_t total = 0;
  for (const Param& p : params) total += value(p.value).type.numel();
  return total;
}

}  // namespace napkin::ir
