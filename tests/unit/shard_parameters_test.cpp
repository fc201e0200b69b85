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
#include "analysis/distributed.h"
#include "analysis/step_kernels.h"
#include "codegen/plan.h"
#include "ir/fusion_group.h"
#include "passes/pipeline.h"
#include "support/test_models.h"

using namespace napkin;
using ir::NodeId;
using ir::Op;
using ir::ValueId;

namespace {

ir::Graph sharded_gpt(bool keep_gathered, bool prefetch = false, const analysis::Interconnect* link = nullptr,
                      passes::ShardSchedule* schedule = nullptr) {
  ir::Diagnostics diag;
  frontend::LoadOptions options;
  options.dim_overrides = testing::small_dims().at("gpt");
  options.dim_overrides["layers"] = 2;
  std::optional<ir::Graph> g = frontend::load_model_file(testing::source_path("models/gpt.yaml"), diag, options);
  passes::PipelineOptions pipeline;
  pipeline.shard_parameters = true;
  pipeline.keep_gathered = keep_gathered;
  pipeline.prefetch = prefetch;
  pipeline.shard_link = link;
  std::optional<passes::PipelineResult> result = passes::run_training_pipeline(*g, diag, pipeline);
  REQUIRE_MESSAGE(result, diag.render());
  if (schedule) *schedule = result->shard_schedule;
  return std::move(*g);
}

// Schedule positions.
std::map<NodeId, int> positions(const ir::Graph& g) {
  std::map<NodeId, int> at;
  for (size_t i = 0; i < g.schedule().size(); ++i) at[g.schedule()[i]] = static_cast<int>(i);
  return at;
}

}  // namespace

TEST_CASE("shard_parameters: without prefetch, each parameter gathered right before its first use and again for the backward, each gradient reduced right after it is made") {
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

namespace {

// The first reader of each gather's copy, by schedule position.
std::map<NodeId, int> first_readers(const ir::Graph& g) {
  const std::map<NodeId, int> at = positions(g);
  std::map<ValueId, NodeId> gather_of;
  for (NodeId id : g.schedule())
    if (g.node(id).op == Op::AllGather) gather_of[g.node(id).out()] = id;
  std::map<NodeId, int> first;
  for (NodeId id : g.schedule())
    for (ValueId in : g.node(id).inputs)
      if (auto it = gather_of.find(g.value(in).storage); it != gather_of.end() && !first.count(it->second))
        first[it->second] = at.at(id);
  return first;
}

}  // namespace

TEST_CASE("shard_parameters: prefetch issues each unit's gathers where the time model says they arrive, between the previous unit's first use and its own") {
  passes::ShardSchedule off, slow_off, slow, fast;
  const ir::Graph g_off = sharded_gpt(false, false, nullptr, &off);
  // A link so slow no gather can hide: each unit goes as far ahead as allowed.
  const analysis::Interconnect crawl{"crawl", "a test link", 1e3, 1e-3, "test"};
  const ir::Graph g_slow = sharded_gpt(false, true, &crawl, &slow);
  sharded_gpt(false, false, &crawl, &slow_off);
  // A link so fast every gather hides right before its use: each unit gathered whole right before its first use.
  const analysis::Interconnect instant{"instant", "a test link", 1e30, 0, "test"};
  const ir::Graph g_fast = sharded_gpt(false, true, &instant, &fast);

  // Without prefetch, every gather is waited for in full, as is every reduce: the time model's exposed time is
  // the sum of the collectives' (a hand sum of its own parts).
  REQUIRE(off.ran);
  CHECK_FALSE(off.prefetch);
  CHECK(off.exposed_seconds == doctest::Approx(off.gather_seconds + off.reduce_seconds).epsilon(1e-12));
  CHECK(off.reduces == static_cast<int>(g_off.params.size()));

  // Units: a unit per block of the repeat and per run of top-level parameters, in each of forward and backward.
  std::set<std::string> forward_scopes;
  int gathers = 0;
  for (const passes::ShardUnit& u : slow.units) {
    gathers += u.gathers;
    if (u.phase == ir::Phase::Forward) forward_scopes.insert(u.scope);
  }
  CHECK(forward_scopes.count("blocks.0") == 1);
  CHECK(forward_scopes.count("blocks.1") == 1);
  int gather_nodes = 0;
  for (NodeId id : g_slow.schedule()) gather_nodes += g_slow.node(id).op == Op::AllGather ? 1 : 0;
  CHECK(gathers == gather_nodes);

  // The fast link: each run of gathers (a unit) is followed by its first reader.
  const std::map<NodeId, int> fast_reader = first_readers(g_fast);
  for (int p = 0; p < static_cast<int>(g_fast.schedule().size()); ++p) {
    if (g_fast.node(g_fast.schedule()[p]).op != Op::AllGather ||
        (p > 0 && g_fast.node(g_fast.schedule()[p - 1]).op == Op::AllGather))
      continue;
    int end = p, first = static_cast<int>(g_fast.schedule().size());
    for (; g_fast.node(g_fast.schedule()[end]).op == Op::AllGather; ++end) first = std::min(first, fast_reader.at(g_fast.schedule()[end]));
    CHECK(first == end);
  }
  CHECK(fast.exposed_seconds == doctest::Approx(0).epsilon(1e-9));

  // The slow link: each unit's gathers sit together, ahead of their readers, after the previous unit's first
  // reader, in their own phase; and the crawl cannot be hidden, so prefetching only helps.
  const std::map<NodeId, int> at = positions(g_slow);
  const std::map<NodeId, int> reader = first_readers(g_slow);
  int previous_first_reader = -1, moved = 0;
  ir::Phase previous_phase = ir::Phase::Forward;
  for (int p = 0; p < static_cast<int>(g_slow.schedule().size()); ++p) {
    const ir::Node& n = g_slow.node(g_slow.schedule()[p]);
    if (n.op != Op::AllGather) continue;
    CAPTURE(n.attrs.get_string("param"));
    REQUIRE(reader.count(n.id));
    CHECK(reader.at(n.id) > p);
    CHECK(g_slow.node(g_slow.schedule()[reader.at(n.id)]).phase == n.phase);
    const bool starts_unit = p == 0 || g_slow.node(g_slow.schedule()[p - 1]).op != Op::AllGather;
    if (!starts_unit) continue;
    if (n.phase == previous_phase) CHECK(p > previous_first_reader);
    // The first reader of any gather of this run: the unit's first use.
    int first = reader.at(n.id);
    for (int q = p; q < static_cast<int>(g_slow.schedule().size()) && g_slow.node(g_slow.schedule()[q]).op == Op::AllGather; ++q)
      first = std::min(first, reader.at(g_slow.schedule()[q]));
    moved += first > p + 1 ? 1 : 0;
    previous_first_reader = first, previous_phase = n.phase;
  }
  CHECK(moved >= 4);  // the blocks' units, at least, went ahead
  CHECK(slow.exposed_seconds < slow_off.exposed_seconds);
  CHECK(slow.gather_seconds > 0);
  (void)at;
}

TEST_CASE("shard_parameters: the plan waits for each gather issued ahead at the first kernel that reads it, no sooner") {
  const analysis::Interconnect crawl{"crawl", "a test link", 1e3, 1e-3, "test"};
  const ir::Graph g = sharded_gpt(false, true, &crawl);
  const codegen::KernelPlan plan = codegen::plan_kernels(g);
  const std::vector<analysis::StepKernel> steps = analysis::step_kernels(g, ir::fusion_groups(g));
  REQUIRE(steps.size() == plan.kernels.size());
  auto reads = [&](size_t k, ValueId gathered) {
    for (NodeId id : steps[k].nodes)
      for (ValueId in : g.node(id).inputs)
        if (g.value(in).storage == gathered) return true;
    return false;
  };
  int ahead = 0;
  for (size_t i = 0; i < plan.kernels.size(); ++i) {
    const codegen::Kernel& k = plan.kernels[i];
    if (k.kind != analysis::KernelKind::Collective || k.collective().which != ir::Collective::AllGather) continue;
    CAPTURE(k.name);
    const ValueId gathered = g.node(steps[i].nodes.back()).out();
    size_t first = i + 1;
    while (first < plan.kernels.size() && !reads(first, gathered)) ++first;
    REQUIRE(first < plan.kernels.size());
    if (first == i + 1) {
      CHECK(k.wait_kernel == -1);  // read by the next kernel: waited for at once
    } else {
      CHECK(k.wait_kernel == static_cast<int>(first));
      ++ahead;
    }
  }
  CHECK(ahead >= 8);
}
