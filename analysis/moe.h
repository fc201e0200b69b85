// The mixture-of-experts figures of a step, from ir::Graph::moe_layers (what
// the frontend's moe() recorded) and the step's values: the parameters a
// token uses, the memory all experts hold, each layer's routing shape, and
// the check that the step has no [tokens, experts, capacity] routing tensor
// (docs/report.md, "Mixture of experts"). The report prints them
// (report/moe_report.h); this file computes and never prints.
//
// Terms, for a layer of E experts, top-k routing, T tokens a micro-batch,
// capacity C slots an expert, model width d:
//  - expert parameters: the layer's params stacked on a leading experts axis
//    ([E, ...]); a token uses k of their E slices.
//  - active parameters (per token): every parameter, less (E − k)/E of each
//    expert parameter: total − Σ numel·(E − k)/E, each parameter once even
//    when two layers share it. The router counts as active (every token
//    runs it), and all k experts' slices count (Mixtral's 12.9e9 of 46.7e9
//    is this count). numel·(E − k) is divided by E exactly when the experts
//    axis is numel's factor (it always is for [E, ...]); otherwise the
//    quotient is rounded down and `active_exact` says so.
//  - slots E·C against assignments T·k: the experts compute every slot,
//    filled or not (capacity padding), so the step's counted FLOPs are E·C
//    tokens' worth of expert work, not T·k's.
//  - dispatch buffer: the step's forward value of shape [E, C, d] in the
//    layer's scope (the gathered tokens); its dtype is the activations'.
//  - axis names: a layer's router and expert parameters name their first
//    axis (the experts axis: `experts`) and their others (the feature axes:
//    d, ffn); unnamed axes name nothing.
//  - feature axes of a value: its axes named as one of the layer's feature
//    axes, whatever their size (so [E, C, d] is not [E, C, T] when d == T).
//  - an experts axis of a value: an axis of size E, unnamed or named as the
//    layer's experts axis (so [batch, seq, kv_heads, hd] is no routing
//    value when kv_heads == E and seq == C).
//  - routing elements of a value: the product of its sizes over its axes
//    that are not feature axes. A value is a routing value of a layer when
//    it has an experts axis and another axis of size C, neither a feature
//    axis.
//  - the tokens × experts × capacity check: no routing value of any layer
//    has T·E·C or more routing elements, among every value of the step
//    (inputs, parameters, optimizer state, each scheduled node's outputs,
//    views included). The one-hot dispatch mask of GShard ([T, E, C], or
//    [B, S, E, C]) fails it; the [E, C, d] dispatch buffer, the [T, E]
//    router logits and the [T, k] choices pass.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ir/graph.h"

namespace napkin::analysis {

struct MoeLayerFigures {
  std::string scope;
  int64_t experts = 0, top_k = 0, tokens = 0, capacity = 0, d_model = 0;
  double capacity_factor = 0;
  int64_t expert_params = 0;    // elements of its expert parameters, all E experts
  int64_t inactive_params = 0;  // Σ numel·(E − k)/E over them (those no earlier layer counted)
  int64_t slots() const { return experts * capacity; }     // E·C, computed
  int64_t assignments() const { return tokens * top_k; }   // T·k, routed
  int64_t routing_bound() const { return tokens * experts * capacity; }  // T·E·C
  // The dispatch buffer: found (a forward [E, C, d] value in the scope), its dtype and bytes.
  bool dispatch_found = false;
  ir::DType dispatch_dtype = ir::DType::F32;
  int64_t dispatch_bytes = 0;
  std::string dropped_output;  // the graph output of its dropped count ("metric.moe_dropped.layers.0")
};

struct MoeFigures {
  std::vector<MoeLayerFigures> layers;  // empty: the model has no moe() layer
  int64_t total_params = 0, active_params = 0;
  bool active_exact = true;
  std::vector<ir::ValueId> expert_params;  // each once, in layer order
  // Bytes of all experts: their parameters, gradients (grad.<name>) and optimizer state.
  int64_t expert_param_bytes = 0, expert_grad_bytes = 0, expert_state_bytes = 0;
  // The routing value with the most routing elements for its layer's T·E·C
  // (kNoValue: none), the layer it is one of, and its routing elements.
  ir::ValueId largest_routing_value = ir::kNoValue;
  size_t largest_routing_layer = 0;
  int64_t largest_routing_elements = 0;
  bool no_tokens_experts_capacity_tensor = true;
  bool has_moe() const { return !layers.empty(); }
};

MoeFigures analyze_moe(const ir::Graph& g);

}  // namespace napkin::analysis
