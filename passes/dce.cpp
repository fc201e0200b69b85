#include "passes/dce.h"

#include <fmt/format.h>

#include "ir/use_list.h"

namespace napkin::passes {

namespace {

class DeadCodeElimination : public Pass {
 public:
  std::string_view name() const override { return "dce"; }

  bool run(ir::Graph& g, ir::Diagnostics&) override {
    std::vector<bool> live_value(g.num_values(), false);
    for (const auto& [label, v] : g.outputs) live_value[v] = true;
    for (const ir::Graph::Update& u : g.updates) live_value[u.value] = true;
    std::vector<ir::NodeId> dead;
    const auto& schedule = g.schedule();
    for (auto it = schedule.rbegin(); it != schedule.rend(); ++it) {
      const ir::Node& n = g.node(*it);
      bool live = false;
      for (ir::ValueId out : n.outputs) live = live || live_value[out];
      if (!live) {
        dead.push_back(n.id);
        continue;
      }
      for (ir::ValueId in : n.inputs) live_value[in] = true;
    }
    g.erase_nodes(dead);
    return !dead.empty();
  }
};

}  // namespace

std::unique_ptr<Pass> make_dce_pass() { return std::make_unique<DeadCodeElimination>(); }

void warn_unused_params(const ir::Graph& g, ir::Diagnostics& diag) {
  const ir::UseList uses(g);
  for (const ir::Param& p : g.params)
    if (uses.buffer_readers(p.value).empty())
      diag.warning(g.value(p.value).loc, fmt::format("parameter '{}' does not affect the loss", g.value(p.value).name),
                   "remove it, or use it in a computation the loss depends on");
}

}  // namespace napkin::passes
