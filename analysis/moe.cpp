#include "analysis/moe.h"

#include <set>

namespace napkin::analysis {

namespace {

// The names a layer gives its axes: the experts axis (the first of its
// router and expert parameters) and the feature axes (every other named axis
// of them), analysis/moe.h.
struct AxisNames {
  std::set<std::string> experts, features;
};
AxisNames axis_names(const ir::Graph& g, const ir::Graph::MoeLayer& layer) {
  AxisNames names;
  std::vector<ir::ValueId> params = layer.expert_params;
  if (layer.router != ir::kNoValue) params.push_back(layer.router);
  for (ir::ValueId p : params) {
    const std::vector<ir::Dim>& dims = g.value(p).type.dims;
    for (size_t i = 0; i < dims.size(); ++i)
      if (!dims[i].name.empty()) (i == 0 ? names.experts : names.features).insert(dims[i].name);
  }
  return names;
}

// The routing elements of `t` for a layer (its product over non-feature
// axes), or 0 when `t` is not a routing value of it: no experts axis (size
// E, unnamed or named as the layer's experts axis) and another axis of size
// C among its non-feature axes.
int64_t routing_elements(const ir::TensorType& t, const MoeLayerFigures& layer, const AxisNames& names) {
  std::vector<const ir::Dim*> axes;
  for (const ir::Dim& d : t.dims)
    if (!names.features.count(d.name)) axes.push_back(&d);
  auto experts_axis = [&](const ir::Dim& d) {
    return d.size == layer.experts && (d.name.empty() || names.experts.count(d.name));
  };
  bool routing = false;
  for (size_t i = 0; i < axes.size() && !routing; ++i)
    for (size_t j = 0; j < axes.size() && !routing; ++j)
      routing = i != j && experts_axis(*axes[i]) && axes[j]->size == layer.capacity;
  if (!routing) return 0;
  int64_t elements = 1;
  for (const ir::Dim* d : axes) elements *= d->size;
  return elements;
}

// The step's values: inputs, parameters, optimizer state, and every scheduled node's outputs.
std::vector<ir::ValueId> step_values(const ir::Graph& g) {
  std::vector<ir::ValueId> values(g.inputs.begin(), g.inputs.end());
  for (const ir::Param& p : g.params) values.push_back(p.value);
  values.insert(values.end(), g.state.begin(), g.state.end());
  for (ir::NodeId id : g.schedule())
    for (ir::ValueId v : g.node(id).outputs) values.push_back(v);
  return values;
}

// The layer's dispatch buffer: the first forward value of shape [E, C, d] in its scope.
void find_dispatch(const ir::Graph& g, MoeLayerFigures& f) {
  const std::vector<int64_t> shape = {f.experts, f.capacity, f.d_model};
  for (ir::NodeId id : g.schedule()) {
    const ir::Node& n = g.node(id);
    if (n.phase != ir::Phase::Forward || n.scope != f.scope) continue;
    for (ir::ValueId v : n.outputs)
      if (g.value(v).type.sizes() == shape) {
        f.dispatch_found = true;
        f.dispatch_dtype = g.value(v).type.dtype;
        f.dispatch_bytes = g.value(v).type.bytes();
        return;
      }
  }
}

}  // namespace

MoeFigures analyze_moe(const ir::Graph& g) {
  MoeFigures m;
  m.total_params = g.param_count();
  m.active_params = m.total_params;
  if (g.moe_layers.empty()) return m;
  std::set<ir::ValueId> counted;
  std::vector<AxisNames> names;
  for (const ir::Graph::MoeLayer& layer : g.moe_layers) {
    MoeLayerFigures f;
    f.scope = layer.scope;
    f.experts = layer.experts, f.top_k = layer.top_k, f.tokens = layer.tokens, f.capacity = layer.capacity;
    f.d_model = layer.d_model;
    f.capacity_factor = layer.capacity_factor;
    f.dropped_output = layer.dropped_output;
    for (ir::ValueId p : layer.expert_params) {
      const int64_t numel = g.value(p).type.numel();
      f.expert_params += numel;
      if (!counted.insert(p).second) continue;
      m.expert_params.push_back(p);
      const int64_t unused = numel * (layer.experts - layer.top_k);
      if (unused % layer.experts != 0) m.active_exact = false;
      f.inactive_params += unused / layer.experts;
    }
    m.active_params -= f.inactive_params;
    find_dispatch(g, f);
    names.push_back(axis_names(g, layer));
    m.layers.push_back(f);
  }

  for (ir::ValueId p : m.expert_params) {
    m.expert_param_bytes += g.value(p).type.bytes();
    if (ir::ValueId grad = g.find_output("grad." + g.value(p).name); grad != ir::kNoValue)
      m.expert_grad_bytes += g.value(grad).type.bytes();
  }
  for (const auto& [state, param] : g.state_param)
    if (counted.count(param)) m.expert_state_bytes += g.value(state).type.bytes();

  // The largest against its layer's bound: the value that decides the check.
  double largest = 0;
  for (ir::ValueId v : step_values(g))
    for (size_t l = 0; l < m.layers.size(); ++l) {
      const int64_t elements = routing_elements(g.value(v).type, m.layers[l], names[l]);
      const double share = static_cast<double>(elements) / static_cast<double>(m.layers[l].routing_bound());
      if (share > largest) {
        largest = share;
        m.largest_routing_value = v;
        m.largest_routing_layer = l;
        m.largest_routing_elements = elements;
      }
      if (elements >= m.layers[l].routing_bound()) m.no_tokens_experts_capacity_tensor = false;
    }
  return m;
}

}  // namespace napkin::analysis
