#include "passes/recompute.h"

#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <functional>
#include <map>
#include <set>

#include "analysis/memory.h"
#include "analysis/memory_plan.h"
#include "ir/builder.h"
#include "ir/internal_check.h"
#include "ir/quantities.h"
#include "passes/fuse_elementwise.h"

namespace napkin::passes {

using ir::human_bytes;
using ir::with_commas;

namespace {

double node_flops(const ir::Graph& g, const ir::Node& n) { return ir::op_info(n.op).cost(g, n).flops; }

double step_flops(const ir::Graph& g) {
  double sum = 0;
  for (ir::NodeId id : g.schedule()) sum += node_flops(g, g.node(id));
  return sum;
}

}  // namespace

ir::Graph with_recompute(const ir::Graph& original, const std::set<ir::ValueId>& recomputed, double& flops_added) {
  ir::Graph g = original;
  flops_added = 0;
  if (recomputed.empty()) return g;
  std::vector<ir::NodeId> schedule, backward, optimizer;
  for (ir::NodeId id : original.schedule()) {
    switch (original.node(id).phase) {
      case ir::Phase::Setup:
      case ir::Phase::Forward:
      case ir::Phase::Decode: schedule.push_back(id); break;
      case ir::Phase::Backward: backward.push_back(id); break;
      case ir::Phase::Optimizer: optimizer.push_back(id); break;
    }
  }
  ir::Builder b(g);
  b.set_phase(ir::Phase::Backward);
  std::map<ir::ValueId, ir::ValueId> clone_of;
  // The value a backward node reads in place of v: v itself unless its buffer
  // is recomputed, else its clone (made now, with the clones it needs first).
  std::function<ir::ValueId(ir::ValueId)> materialize = [&](ir::ValueId v) -> ir::ValueId {
    if (g.value(v).kind != ir::ValueKind::Result || !recomputed.count(g.value(v).storage)) return v;
    if (auto it = clone_of.find(v); it != clone_of.end()) return it->second;
    const ir::Node n = g.node(g.value(v).producer);  // a copy: adding nodes moves the graph's storage
    NAPKIN_INTERNAL_CHECK(n.phase == ir::Phase::Forward, "recomputing %{}, made by a {} node", v, ir::phase_name(n.phase));
    std::vector<ir::ValueId> inputs;
    for (ir::ValueId in : n.inputs) inputs.push_back(materialize(in));
    b.set_loc(n.loc);
    b.set_scope(n.scope);
    b.set_origin(n.id);
    const ir::ValueId first = b.must(b.add(n.op, inputs, n.attrs));
    const ir::NodeId clone = g.value(first).producer;
    const std::vector<ir::ValueId> made = g.node(clone).outputs;
    // Every output of the node is recomputed with it (attention's o and lse).
    for (size_t i = 0; i < made.size(); ++i) {
      const ir::Value original_value = g.value(n.outputs[i]);
      b.rename_dims(made[i], original_value.type.dims);
      if (!original_value.name.empty()) g.value(made[i]).name = original_value.name + ".recomputed";
      clone_of[n.outputs[i]] = made[i];
    }
    if (ir::op_info(n.op).op_class != ir::OpClass::View) flops_added += node_flops(g, g.node(clone));
    schedule.push_back(clone);
    return clone_of.at(v);
  };
  for (ir::NodeId id : backward) {
    std::vector<ir::ValueId> inputs = g.node(id).inputs;
    for (ir::ValueId& in : inputs) in = materialize(in);
    ir::Node& n = g.node(id);
    n.inputs = std::move(inputs);
    // A backward view of a recomputed buffer is now a view of the clone.
    if (ir::op_info(n.op).op_class == ir::OpClass::View) g.value(n.out()).storage = g.value(n.in(0)).storage;
    schedule.push_back(id);
  }
  schedule.insert(schedule.end(), optimizer.begin(), optimizer.end());
  g.mutable_schedule() = std::move(schedule);
  return g;
}

namespace {

struct Candidate {
  std::vector<ir::ValueId> closure;
  int64_t saved = 0;
  double flops = 0;
};

// The next closure to recompute (the header's greedy), or an empty one when
// no candidate saves bytes at the peak.
Candidate choose(const ir::Graph& g, const analysis::MemoryReport& m, const std::set<ir::ValueId>& recomputed) {
  if (!m.peak.found) return {};
  const int peak = m.peak.position;
  const int n = static_cast<int>(g.schedule().size());
  std::vector<int> last_forward_read(g.num_values(), -1), first_backward_read(g.num_values(), n);
  std::vector<bool> kept(g.num_values(), false);  // read by the optimizer or after the step
  for (int p = 0; p < n; ++p) {
    const ir::Node& node = g.node(g.schedule()[p]);
    for (ir::ValueId in : node.inputs) {
      ir::ValueId s = g.value(in).storage;
      if (node.phase == ir::Phase::Forward) last_forward_read[s] = p;
      if (node.phase == ir::Phase::Backward) first_backward_read[s] = std::min(first_backward_read[s], p);
      if (node.phase == ir::Phase::Optimizer) kept[s] = true;
    }
  }
  for (const auto& [label, v] : g.outputs) kept[g.value(v).storage] = true;
  for (const ir::Graph::Update& u : g.updates) kept[g.value(u.value).storage] = true;
  std::map<ir::ValueId, const analysis::MemoryBuffer*> buffer_of;
  for (const analysis::MemoryBuffer& b : m.buffers) buffer_of[b.value] = &b;
  auto forward_result = [&](const analysis::MemoryBuffer& b) {
    return !b.resident && b.producer != ir::kNoNode && g.node(b.producer).phase == ir::Phase::Forward;
  };

  Candidate best;
  double best_score = -1;
  for (const analysis::MemoryBuffer& c : m.buffers) {
    if (c.category != analysis::MemoryCategory::SavedActivations || kept[c.value] || recomputed.count(c.value)) continue;
    if (c.first > peak || std::max(c.first, last_forward_read[c.value]) >= peak || first_backward_read[c.value] <= peak)
      continue;  // not freed at the peak by recomputing it
    Candidate cand;
    cand.saved = c.bytes;
    std::set<ir::ValueId> in_closure{c.value};
    std::vector<ir::ValueId> stack{c.value};
    while (!stack.empty()) {
      ir::ValueId v = stack.back();
      stack.pop_back();
      cand.closure.push_back(v);
      const ir::Node& producer = g.node(g.value(v).producer);
      cand.flops += node_flops(g, producer);
      for (ir::ValueId in : producer.inputs) {
        ir::ValueId s = g.value(in).storage;
        auto it = buffer_of.find(s);
        if (it == buffer_of.end() || !forward_result(*it->second) || recomputed.count(s) || in_closure.count(s)) continue;
        const analysis::MemoryBuffer& input = *it->second;
        if (input.last >= peak) continue;  // live at the peak anyway
        if (kept[s]) {
          cand.saved -= input.bytes;  // would be kept alive to the backward phase
          continue;
        }
        in_closure.insert(s);
        stack.push_back(s);
      }
    }
    if (cand.saved <= 0) continue;
    double score = static_cast<double>(cand.saved) / (cand.flops + 1);
    if (score > best_score || (score == best_score && cand.saved > best.saved)) {
      best_score = score;
      best = std::move(cand);
    }
  }
  return best;
}

// A candidate step: the graph with `recomputed` recomputed, its memory (what
// the greedy reads peaks from), and the arena and peak of that graph once
// fuse-elementwise, which the pipeline runs next, has grouped it: the memory a
// trainer really gets, which is what the budget is checked against.
struct Planned {
  ir::Graph g;
  analysis::MemoryReport memory;
  int64_t arena = 0;
  int64_t peak = 0;
  double flops_added = 0;
};

Planned plan_with(const ir::Graph& original, const std::set<ir::ValueId>& recomputed) {
  Planned p;
  p.g = with_recompute(original, recomputed, p.flops_added);
  p.memory = analysis::analyze_memory(p.g);
  ir::Graph fused = p.g;
  ir::Diagnostics ignored;  // fusion reports no user errors
  make_fuse_elementwise_pass()->run(fused, ignored);
  analysis::MemoryReport fused_memory = analysis::analyze_memory(fused);
  p.arena = analysis::plan_memory(fused_memory).arena_bytes;
  p.peak = fused_memory.peak.bytes;
  return p;
}

std::string peak_breakdown(const analysis::MemoryPeak& peak) {
  std::vector<std::string> parts;
  for (analysis::MemoryCategory c : analysis::kMemoryCategories)
    if (peak.category_bytes(c) > 0)
      parts.push_back(fmt::format("{} {}", analysis::memory_category_name(c), with_commas(static_cast<double>(peak.category_bytes(c)))));
  return fmt::format("{}", fmt::join(parts, ", "));
}

class Recompute : public Pass {
 public:
  Recompute(int64_t budget, RecomputeReport& report) : budget_(budget), report_(report) {}
  std::string_view name() const override { return "recompute"; }

  bool run(ir::Graph& g, ir::Diagnostics& diag) override {
    const ir::Graph original = g;
    std::set<ir::ValueId> recomputed;
    Planned current = plan_with(original, recomputed);
    const int64_t arena_before = current.arena, peak_before = current.peak;
    int64_t smallest = current.arena;
    analysis::MemoryPeak smallest_peak = current.memory.peak;
    while (current.arena > budget_) {
      Candidate next = choose(current.g, current.memory, recomputed);
      if (next.closure.empty()) {
        diag.error({},
                   fmt::format("--memory-budget {} bytes ({}) cannot be met: recomputing activations brings the arena "
                               "of this step down to {} bytes ({}) at the least (at its peak: {})",
                               with_commas(static_cast<double>(budget_)), human_bytes(static_cast<double>(budget_)),
                               with_commas(static_cast<double>(smallest)), human_bytes(static_cast<double>(smallest)),
                               peak_breakdown(smallest_peak)),
                   fmt::format("the smallest budget that can be met is --memory-budget {}", smallest));
        return false;
      }
      recomputed.insert(next.closure.begin(), next.closure.end());
      current = plan_with(original, recomputed);
      if (current.arena < smallest) smallest = current.arena, smallest_peak = current.memory.peak;
    }
    report_.ran = true;
    report_.budget = budget_;
    report_.arena_before = arena_before;
    report_.peak_before = peak_before;
    report_.arena_after = current.arena;
    report_.peak_after = current.peak;
    report_.step_flops = step_flops(original);
    report_.flops_added = current.flops_added;
    for (ir::NodeId id : original.schedule()) {
      const ir::Node& n = original.node(id);
      if (n.phase != ir::Phase::Forward || !recomputed.count(n.out())) continue;
      const ir::Value& v = original.value(n.out());
      report_.values.push_back({v.name.empty() ? fmt::format("%{}", v.id) : v.name, std::string(ir::op_name(n.op)),
                                 n.loc.known() ? n.loc.line : 0, v.type.bytes(), node_flops(original, n)});
    }
    if (recomputed.empty()) return false;
    g = std::move(current.g);
    return true;
  }

 private:
  int64_t budget_;
  RecomputeReport& report_;
};

}  // namespace

std::unique_ptr<Pass> make_recompute_pass(int64_t budget, RecomputeReport& report) {
  return std::make_unique<Recompute>(budget, report);
}

std::optional<int64_t> parse_memory_budget(std::string_view text, std::string& error) {
  auto trimmed = [](std::string_view s) {
    while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
    while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
    return s;
  };
  std::string_view s = trimmed(text);
  double number = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), number);
  if (ec != std::errc() || !std::isfinite(number)) {
    error = fmt::format("'{}' is not a byte count", text);
    return std::nullopt;
  }
  std::string_view unit = trimmed(s.substr(static_cast<size_t>(end - s.data())));
  static const std::pair<std::string_view, double> kUnits[] = {
      {"", 1},        {"B", 1},          {"kB", 1e3},       {"KB", 1e3},       {"MB", 1e6},         {"GB", 1e9},
      {"TB", 1e12},   {"KiB", 1024.0},   {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0}};
  for (const auto& [name, scale] : kUnits) {
    if (unit != name) continue;
    double bytes = std::round(number * scale);
    if (bytes < 1 || bytes > 9.2e18) {
      error = fmt::format("'{}' is not a positive byte count that fits in 63 bits", text);
      return std::nullopt;
    }
    return static_cast<int64_t>(bytes);
  }
  error = fmt::format("'{}': unknown unit '{}' (known: B, kB, MB, GB, TB, KiB, MiB, GiB, TiB)", text, unit);
  return std::nullopt;
}

}  // namespace napkin::passes
