#include "report/moe_report.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <tuple>

#include "ir/quantities.h"

namespace napkin::report {

using ir::human_bytes;
using ir::with_commas;

std::optional<DroppedTokens> read_dropped_tokens(std::istream& in, const std::string& path, std::string& error) {
  DroppedTokens d;
  d.path = path;
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    if (line.empty()) continue;
    nlohmann::ordered_json j;  // the layers in the order the trainer wrote them
    try {
      j = nlohmann::ordered_json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      error = fmt::format("{}:{}: not a JSON line ({})", path, number, e.what());
      return std::nullopt;
    }
    if (!j.is_object()) {
      error = fmt::format("{}:{}: not a metrics record (a JSON object)", path, number);
      return std::nullopt;
    }
    auto dropped = j.find("moe_dropped");
    if (dropped == j.end() || !dropped->is_object()) continue;
    d.found = true;
    auto step = j.find("step");
    d.step = step != j.end() && step->is_number() ? step->get<double>() : -1;
    d.layers.clear();
    for (auto it = dropped->begin(); it != dropped->end(); ++it)
      d.layers.emplace_back(it.key(), it->is_number() ? it->get<double>() : std::nan(""));
    d.load.clear();
    auto load = j.find("moe_load");
    if (load != j.end() && load->is_object())
      for (auto it = load->begin(); it != load->end(); ++it) {
        std::vector<double> counts;
        if (it->is_array())
          for (const auto& c : *it) counts.push_back(c.is_number() ? c.get<double>() : std::nan(""));
        d.load.emplace_back(it.key(), std::move(counts));
      }
  }
  return d;
}

namespace {

// A layer's expert load: its busiest and idlest experts' assignments over the mean.
struct LoadBalance {
  double max_over_mean = 0, min_over_mean = 0;
};
LoadBalance load_balance(const std::vector<double>& counts) {
  if (counts.empty()) return {};
  double total = 0;
  for (double c : counts) total += c;
  const double mean = total / static_cast<double>(counts.size());
  const auto [lo, hi] = std::minmax_element(counts.begin(), counts.end());
  if (!(mean > 0)) return {};
  return {*hi / mean, *lo / mean};
}

// The layer whose dropped-count output is moe.dropped.<key>, or null.
const analysis::MoeLayerFigures* layer_of(const analysis::MoeFigures& m, const std::string& key) {
  for (const analysis::MoeLayerFigures& l : m.layers)
    if (l.dropped_output == std::string(ir::kMetricOutputPrefix) + "moe_dropped." + key) return &l;
  return nullptr;
}

auto routing_shape(const analysis::MoeLayerFigures& l) {
  return std::tuple(l.experts, l.top_k, l.tokens, l.capacity, l.capacity_factor, l.d_model, l.dispatch_found,
                    l.dispatch_dtype);
}

std::string layer_name(const analysis::MoeLayerFigures& l) { return l.scope.empty() ? "(top level)" : l.scope; }

std::string dispatch_text(const analysis::MoeLayerFigures& l) {
  if (!l.dispatch_found) return "no [E, C, d] value in the step";
  return fmt::format("[{}, {}, {}] {}, {}", l.experts, l.capacity, l.d_model, ir::dtype_name(l.dispatch_dtype),
                     human_bytes(static_cast<double>(l.dispatch_bytes)));
}

}  // namespace

std::string moe_section_text(const ir::Graph& g, const analysis::MoeFigures& m, const DroppedTokens* dropped,
                             int64_t micro_batches) {
  if (!m.has_moe()) return "";
  std::string out = fmt::format("\nmixture of experts ({} moe() layer{}; docs/report.md, \"Mixture of experts\")\n",
                                m.layers.size(), m.layers.size() == 1 ? "" : "s");
  // One row per run of alike layers.
  out += fmt::format("  {:<24} {:>7} {:>3} {:>10} {:>10} {:>7} {:>12} {:>12}  {}\n", "layers", "experts", "k", "tokens T",
                     "capacity C", "factor", "slots E·C", "routed T·k", "dispatch buffer");
  for (size_t first = 0; first < m.layers.size();) {
    size_t last = first;
    while (last + 1 < m.layers.size() && routing_shape(m.layers[last + 1]) == routing_shape(m.layers[first])) ++last;
    const analysis::MoeLayerFigures& l = m.layers[first];
    const std::string label = first == last ? layer_name(l)
                                            : fmt::format("{} .. {} ({})", layer_name(l), layer_name(m.layers[last]),
                                                          last - first + 1);
    out += fmt::format("  {:<24} {:>7} {:>3} {:>10} {:>10} {:>7.4g} {:>12} {:>12}  {}\n", label, l.experts, l.top_k,
                       with_commas(static_cast<double>(l.tokens)), with_commas(static_cast<double>(l.capacity)),
                       l.capacity_factor, with_commas(static_cast<double>(l.slots())),
                       with_commas(static_cast<double>(l.assignments())), dispatch_text(l));
    first = last + 1;
  }
  out += "  the experts compute every slot, filled or not: the counted FLOPs are E·C slots' expert work (capacity "
         "padding included), not T·k's\n";
  const double experts_total =
      static_cast<double>(m.expert_param_bytes + m.expert_grad_bytes + m.expert_state_bytes);
  out += fmt::format("  all experts' memory  {:>22}  ({}: parameters {}, gradients {}, optimizer state {}; every expert, "
                     "active or not)\n",
                     with_commas(experts_total), human_bytes(experts_total),
                     human_bytes(static_cast<double>(m.expert_param_bytes)),
                     human_bytes(static_cast<double>(m.expert_grad_bytes)),
                     human_bytes(static_cast<double>(m.expert_state_bytes)));
  if (m.largest_routing_value == ir::kNoValue) {
    out += "  routing tensors      none has an experts and a capacity axis\n";
  } else {
    const analysis::MoeLayerFigures& l = m.layers[m.largest_routing_layer];
    const ir::Value& v = g.value(m.largest_routing_value);
    out += fmt::format("  routing tensors      {}: the largest, {} {} ({} elements over its routing axes), against "
                       "T·E·C = {}\n",
                       m.no_tokens_experts_capacity_tensor ? "no [tokens, experts, capacity] tensor"
                                                           : "A [TOKENS, EXPERTS, CAPACITY] TENSOR",
                       v.name.empty() ? fmt::format("%{}", v.id) : v.name, ir::to_string(v.type),
                       with_commas(static_cast<double>(m.largest_routing_elements)),
                       with_commas(static_cast<double>(l.routing_bound())));
  }
  if (!dropped) return out;
  if (!dropped->found) {
    out += fmt::format("  tokens dropped       {} has no record with \"moe_dropped\" (the trainer of a model with moe() "
                       "layers writes it with every logged step)\n",
                       dropped->path);
    return out;
  }
  out += fmt::format("  tokens dropped       (from {}{}: the (token, choice) assignments past capacity in a step, summed over "
                     "its {} micro-batch{} of T tokens: ranks x micro-batches a rank)\n",
                     dropped->path, dropped->step >= 0 ? fmt::format(", step {}", with_commas(dropped->step)) : "",
                     micro_batches, micro_batches == 1 ? "" : "es");
  for (const auto& [key, count] : dropped->layers) {
    const analysis::MoeLayerFigures* l = layer_of(m, key);
    const double routed = l ? static_cast<double>(l->assignments() * micro_batches) : 0;
    std::string share = !l                 ? "not a moe() layer of this model"
                        : std::isnan(count) ? "not recorded"
                                            : fmt::format("{:.2f}% of T·k x {} = {}", 100 * count / routed, micro_batches,
                                                          with_commas(routed));
    out += fmt::format("    {:<18} {:>22}  ({})\n", key, std::isnan(count) ? "null" : with_commas(count), share);
  }
  if (!dropped->load.empty()) {
    out += "  expert load          (the same step: each expert's assignments before capacity, against the mean "
           "T·k·micro-batches / E; 1.00 is balanced)\n";
    for (const auto& [key, counts] : dropped->load) {
      const LoadBalance b = load_balance(counts);
      out += fmt::format("    {:<18} busiest {:.2f}x the mean, idlest {:.2f}x, over {} experts: {}\n", key, b.max_over_mean,
                         b.min_over_mean, counts.size(), fmt::join(counts, " "));
    }
  }
  return out;
}

nlohmann::json moe_json(const ir::Graph& g, const analysis::MoeFigures& m, const DroppedTokens* dropped,
                        int64_t micro_batches) {
  using nlohmann::json;
  json layers = json::array();
  for (const analysis::MoeLayerFigures& l : m.layers)
    layers.push_back({{"scope", l.scope},
                      {"experts", l.experts},
                      {"top_k", l.top_k},
                      {"tokens", l.tokens},
                      {"capacity", l.capacity},
                      {"capacity_factor", l.capacity_factor},
                      {"d_model", l.d_model},
                      {"slots", l.slots()},
                      {"assignments", l.assignments()},
                      {"expert_params", l.expert_params},
                      {"inactive_params", l.inactive_params},
                      {"dispatch_bytes", l.dispatch_found ? json(l.dispatch_bytes) : json(nullptr)},
                      {"dispatch_dtype", l.dispatch_found ? json(std::string(ir::dtype_name(l.dispatch_dtype))) : json(nullptr)},
                      {"dropped_output", l.dropped_output}});
  json largest = nullptr;
  if (m.largest_routing_value != ir::kNoValue) {
    const ir::Value& v = g.value(m.largest_routing_value);
    largest = {{"name", v.name.empty() ? fmt::format("%{}", v.id) : v.name},
               {"shape", v.type.sizes()},
               {"layer", m.largest_routing_layer},
               {"routing_elements", m.largest_routing_elements},
               {"tokens_experts_capacity", m.layers[m.largest_routing_layer].routing_bound()}};
  }
  json j = {{"layers", layers},
            {"params_total", m.total_params},
            {"params_active", m.active_params},
            {"params_active_exact", m.active_exact},
            {"expert_memory",
             {{"params", m.expert_param_bytes},
              {"grads", m.expert_grad_bytes},
              {"optimizer_state", m.expert_state_bytes},
              {"total", m.expert_param_bytes + m.expert_grad_bytes + m.expert_state_bytes}}},
            {"largest_routing_value", largest},
            {"no_tokens_experts_capacity_tensor", m.no_tokens_experts_capacity_tensor}};
  if (dropped) {
    json per_layer = json::array();
    for (const auto& [key, count] : dropped->layers) {
      const analysis::MoeLayerFigures* l = layer_of(m, key);
      const bool known = l && !std::isnan(count);
      const int64_t routed = l ? l->assignments() * micro_batches : 0;
      per_layer.push_back({{"layer", key},
                           {"dropped", std::isnan(count) ? json(nullptr) : json(count)},
                           {"fraction", known ? json(count / static_cast<double>(routed)) : json(nullptr)},
                           {"assignments", l ? json(routed) : json(nullptr)}});
    }
    json load = json::array();
    for (const auto& [key, counts] : dropped->load) {
      const LoadBalance b = load_balance(counts);
      load.push_back({{"layer", key}, {"assignments", counts}, {"max_over_mean", b.max_over_mean},
                      {"min_over_mean", b.min_over_mean}});
    }
    j["load"] = load;
    j["dropped"] = {{"file", dropped->path},
                    {"found", dropped->found},
                    {"micro_batches", micro_batches},
                    {"step", dropped->found && dropped->step >= 0 ? json(dropped->step) : json(nullptr)},
                    {"layers", per_layer}};
  }
  return j;
}

}  // namespace napkin::report
