// The driver: values by id, the schedule in order, rounding per Numerics.
#include "interp/interpreter.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "interp/kernels.h"
#include "interp/rounding.h"
#include "ir/internal_check.h"

namespace napkin::interp {

namespace {

std::string describe(const ir::Graph& g, ir::ValueId v) {
  const ir::Value& val = g.value(v);
  return fmt::format("%{}{} {}", v, val.name.empty() ? "" : " '" + val.name + "'", ir::to_string(val.type));
}

}  // namespace

Interpreter::Interpreter(const ir::Graph& g, Numerics numerics)
    : g_(g), numerics_(numerics), values_(g.num_values()), has_(g.num_values(), 0) {}

void Interpreter::store(ir::ValueId v, std::vector<double> data, bool computed) {
  ir::DType t = g_.value(v).type.dtype;
  if (numerics_ == Numerics::Float64 && noise_ && computed && ir::is_floating(t)) {
    // Float64's rounding noise: the exact result lies within half an ulp of
    // the double stored, on an unknown side, so half the values move one ulp
    // up or down at random (never a value that was set: that is the point).
    for (double& x : data)
      if (std::isfinite(x) && x != 0 && (noise_->next_u32() & 1))
        x = std::nextafter(x, (noise_->next_u32() & 1) ? INFINITY : -INFINITY);
  } else if (numerics_ == Numerics::Native || !ir::is_floating(t)) {
    const bool random_rounding = noise_ && ir::is_floating(t);
    for (double& x : data) {
      double rounded = round_to_dtype(x, t);
      if (random_rounding && rounded != x && (noise_->next_u32() & 1)) rounded = round_other_way(x, rounded, t);
      x = rounded;
    }
  }
  values_[v] = std::move(data);
  has_[v] = 1;
}

void Interpreter::perturb_roundings(uint64_t seed, uint64_t stream) { noise_.emplace(seed, stream); }

void Interpreter::set(ir::ValueId v, std::vector<double> data) {
  if (v < 0 || v >= g_.num_values()) throw std::invalid_argument(fmt::format("interp: no value %{}", v));
  const ir::Value& val = g_.value(v);
  if (val.kind == ir::ValueKind::Result)
    throw std::invalid_argument(fmt::format("interp: {} is computed by the graph; only inputs, params and "
                                            "state can be set", describe(g_, v)));
  if (static_cast<int64_t>(data.size()) != val.type.numel())
    throw std::invalid_argument(
        fmt::format("interp: {} has {} elements, got {}", describe(g_, v), val.type.numel(), data.size()));
  store(v, std::move(data), false);
}

void Interpreter::set(const std::map<ir::ValueId, std::vector<double>>& values) {
  for (const auto& [v, data] : values) set(v, data);
}

bool Interpreter::has(ir::ValueId v) const { return v >= 0 && v < g_.num_values() && has_[v]; }

const std::vector<double>& Interpreter::get(ir::ValueId v) const {
  if (!has(v))
    throw std::out_of_range(v >= 0 && v < g_.num_values()
                                ? fmt::format("interp: {} has no value (not set, or run() not called)", describe(g_, v))
                                : fmt::format("interp: no value %{}", v));
  return values_[v];
}

void Interpreter::run() {
  for (const auto* list : {&g_.inputs, &g_.state})
    for (ir::ValueId v : *list)
      if (!has_[v]) throw std::runtime_error(fmt::format("interp: {} must be set before run()", describe(g_, v)));
  if (g_.rng != ir::kNoValue && !has_[g_.rng])
    throw std::runtime_error(fmt::format("interp: the rng tensor {} must be set before run() (runtime::rng_tensor_words)",
                                         describe(g_, g_.rng)));
  for (const ir::Param& p : g_.params)
    if (!has_[p.value])
      throw std::runtime_error(fmt::format("interp: {} must be set before run()", describe(g_, p.value)));

  for (ir::NodeId id : g_.schedule()) {
    const ir::Node& n = g_.node(id);
    std::vector<detail::Arg> args;
    args.reserve(n.inputs.size());
    for (ir::ValueId v : n.inputs) {
      NAPKIN_INTERNAL_CHECK(has_[v], "interp: input {} of {} (node {}) was not computed", describe(g_, v),
                            ir::op_name(n.op), n.id);
      const ir::Value& val = g_.value(v);
      args.push_back({val.type.sizes(), val.type.dtype, values_[v]});
    }
    std::vector<detail::OutType> outs;
    for (ir::ValueId v : n.outputs) outs.push_back({g_.value(v).type.sizes(), g_.value(v).type.dtype});
    std::vector<std::vector<double>> results = detail::eval_node(n, args, outs, numerics_ == Numerics::Native);
    if (ir::op_info(n.op).loop == ir::LoopKind::CachedAttention) {  // it writes its caches (inputs 3 and 4)
      NAPKIN_INTERNAL_CHECK(results.size() == 3, "interp: cached_attention returned {} values", results.size());
      store(n.in(3), std::move(results[1]), true);
      store(n.in(4), std::move(results[2]), true);
      results.resize(1);
    }
    NAPKIN_INTERNAL_CHECK(results.size() == n.outputs.size(), "interp: {} (node {}) produced {} outputs, not {}",
                          ir::op_name(n.op), n.id, results.size(), n.outputs.size());
    // Float64 rounding noise models rounding in arithmetic on floating
    // data: a constant, a fill or a cast of integers is exact as stored.
    const bool arithmetic = std::any_of(n.inputs.begin(), n.inputs.end(),
                                        [&](ir::ValueId v) { return ir::is_floating(g_.value(v).type.dtype); });
    for (size_t i = 0; i < n.outputs.size(); ++i) {
      const ir::Value& out = g_.value(n.outputs[i]);
      NAPKIN_INTERNAL_CHECK(static_cast<int64_t>(results[i].size()) == out.type.numel(),
                            "interp: {} (node {}) produced {} elements for {}", ir::op_name(n.op), n.id,
                            results[i].size(), describe(g_, out.id));
      store(out.id, std::move(results[i]), arithmetic);
    }
  }
}

void Interpreter::apply_updates() {
  std::vector<std::vector<double>> next;
  next.reserve(g_.updates.size());
  for (const ir::Graph::Update& u : g_.updates) next.push_back(get(u.value));
  for (size_t i = 0; i < g_.updates.size(); ++i) store(g_.updates[i].target, std::move(next[i]), true);
}

}  // namespace napkin::interp
