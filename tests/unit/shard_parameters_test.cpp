// passes/shard_parameters (napkin build --zero 3) on models/gpt.yaml at
// small dims: where it puts each parameter's gathers and each gradient's
// reduce, and that no gathered parameter lives from the forward into the
// backward (each is gathered again there) unless --keep-gathered says so.
#include <doctest/doctest.h>

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "frontend/frontend.h"
#include "ir/op.h"
#include "passes/pipeline.h"
#include "support/test_models.h"

using namespace napkin;
using ir::NodeId;
using ir::Op;
using ir::ValueId;

namespace {

ir::Graph sharded_gpt(bool keep_gathered) {
  ir::Diagnostics diag;
  frontend::LoadOptions options;
  options.dim_overrides = testing::small_dims().at("gpt");
  options.dim_overrides["layers"] = 2;
  std::optional<ir::Graph> g = frontend::load_model_file(testing::source_path("models/gpt.yaml"), diag, options);
  passes::PipelineOptions pipeline;
  pipeline.shard_parameters = true;
  pipeline.keep_gathered = keep_gathered;
  testing::require_training_pipeline(g, diag, pipeline, nullptr);
  return std::move(*g);
}

// Schedule positions.
std::map<NodeId, int> positions(const ir::Graph& g) {
  std::map<NodeId, int> at;
  for (size_t i = 0; i < g.schedule().size(); ++i) at[g.schedule()[i]] = static_cast<int>(i);
  return at;
}

}  // namespace

TEST_CASE("shard_parameters: each parameter gathered right before its first use and again for the backward, each gradient reduced right after it is made") {
  const ir::Graph g = sharded_gpt(false);
  const std::map<NodeId, int> at = positions(g);
  std::map<ValueId, std::vector<NodeId>> gathers;  // param -> its all_gather nodes
  for (NodeId id : g.schedule()) {
    const ir::Node& n = g.node(id);
    if (n.op == Op::AllGather) {
      gathers[n.in(0)].push_back(id);
      CHECK(n.attrs.get_string("param") == g.value(n.in(0)).name);
      continue;
    }
    // Nothing but a gather and the optimizer (the owner's update) reads a parameter in place.
    for (ValueId in : n.inputs)
      if (g.value(g.value(in).storage).kind == ir::ValueKind::Param) CHECK(n.phase == ir::Phase::Optimizer);
  }
  REQUIRE(gathers.size() == g.params.size());  // every gpt parameter is read
  for (const auto& [param, nodes] : gathers) {
    CAPTURE(g.value(param).name);
    REQUIRE(!nodes.empty());
    CHECK(g.node(nodes.front()).phase == ir::Phase::Forward);
    int backward = 0;
    for (NodeId id : nodes) backward += g.node(id).phase == ir::Phase::Backward ? 1 : 0;
    CHECK(backward <= 1);
    CHECK(nodes.size() == 1 + static_cast<size_t>(backward));
    // Right before its first reader: only other gathers in between.
    const ValueId copy = g.node(nodes.front()).out();
    int first_reader = static_cast<int>(g.schedule().size());
    for (NodeId id : g.schedule())
      for (ValueId in : g.node(id).inputs)
        if (g.value(in).storage == copy) first_reader = std::min(first_reader, at.at(id));
    for (int p = at.at(nodes.front()) + 1; p < first_reader; ++p) CHECK(g.node(g.schedule()[p]).op == Op::AllGather);
  }
  // The backward gathers the matrices again (their gradient reads them): at least one per layer's four.
  int regathered = 0;
  for (const auto& [param, nodes] : gathers) regathered += nodes.size() == 2 ? 1 : 0;
  CHECK(regathered >= 8);

  // No backward node reads a forward node's gathered copy, or what the forward computed from it alone.
  std::set<ValueId> forward_gathered;
  for (const auto& [param, nodes] : gathers) forward_gathered.insert(g.node(nodes.front()).out());
  for (NodeId id : g.schedule()) {
    const ir::Node& n = g.node(id);
    if (n.phase != ir::Phase::Backward) continue;
    for (ValueId in : n.inputs) CHECK(forward_gathered.count(g.value(in).storage) == 0);
  }

  // Each gradient the optimizer reads is a reduce's, right after the node that made it.
  int reduced = 0;
  for (const auto& [label, v] : g.outputs) {
    if (label.rfind("grad.", 0) != 0) continue;
    CAPTURE(label);
    const ir::Node& scatter = g.node(g.value(v).producer);
    REQUIRE(scatter.op == Op::ReduceScatter);
    CHECK(scatter.phase == ir::Phase::Backward);
    CHECK(scatter.attrs.get_string("param") == label.substr(5));
    // Only other reduces in between (a node that makes two gradients, a norm's gain and bias, has two).
    for (int p = at.at(g.value(scatter.in(0)).producer) + 1; p < at.at(scatter.id); ++p)
      CHECK(g.node(g.schedule()[p]).op == Op::ReduceScatter);
    ++reduced;
  }
  CHECK(reduced == static_cast<int>(g.params.size()));
}

TEST_CASE("shard_parameters: --keep-gathered gathers once, and the backward reads the forward's copies") {
  const ir::Graph g = sharded_gpt(true);
  std::set<ValueId> gathered;
  for (NodeId id : g.schedule()) {
    const ir::Node& n = g.node(id);
    if (n.op != Op::AllGather) continue;
    CHECK(n.phase == ir::Phase::Forward);
    gathered.insert(n.out());
  }
  CHECK(gathered.size() == g.params.size());
  bool backward_reads_a_copy = false;
  for (NodeId id : g.schedule())
    if (g.node(id).phase == ir::Phase::Backward)
      for (ValueId in : g.node(id).inputs) backward_reads_a_copy |= gathered.count(g.value(in).storage) > 0;
  CHECK(backward_reads_a_copy);
}
