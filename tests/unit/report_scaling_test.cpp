// `napkin report` on a model of many parameters (issue 36, item 19): N
// parameters of shape [d] and a forward of N residual adds, the model
// bench/many_params.py writes. Every parameter has its own gradient (a sum of
// the one dy every add passes back), update and buffers, so a step that
// compares each parameter, buffer or group with all the others shows as N^2:
// 80k lines took minutes. Checked without a wall clock: fuse-elementwise by
// its step counter, the analyses by the CPU time of this thread at N and 4N
// (linear: about 4x; the old code: 16x), best of three.
#include <doctest/doctest.h>
#include <time.h>

#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "analysis/in_place_reuse.h"
#include "analysis/memory.h"
#include "analysis/memory_plan.h"
#include "ir/fusion_group.h"
#include "frontend/frontend.h"
#include "passes/dce.h"
#include "passes/optimizer.h"
#include "passes/pipeline.h"
#include "report/fusion_report.h"
#include "support/fuse_work.h"
#include "support/test_models.h"

using namespace napkin;

namespace {

// bench/many_params.py's model with `params` parameters, updated by
// `optimizer` (the script's --optimizer sgd or adamw).
std::string many_params_model(int params, const std::string& optimizer = "sgd(lr=0.01)") {
  std::string yaml = "model: many_params\ndims: {batch: 4, d: 8}\ninputs:\n  x: {shape: [batch, d]}\n"
                     "  y: {shape: [batch, d]}\nparams:\n";
  for (int i = 1; i <= params; ++i) yaml += "  p" + std::to_string(i) + ": {shape: [d], init: zeros}\n";
  yaml += "forward:\n  - h1: x + p1\n";
  for (int i = 2; i <= params; ++i)
    yaml += "  - h" + std::to_string(i) + ": h" + std::to_string(i - 1) + " + p" + std::to_string(i) + "\n";
  return yaml + "loss: mse(h" + std::to_string(params) + ", y)\noptimizer: " + optimizer + "\nprecision: fp32\n";
}

double thread_cpu_seconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// The least CPU time of three runs of `repeat` calls of f.
template <typename F>
double best_of_three(int repeat, F&& f) {
  double best = 1e300;
  for (int i = 0; i < 3; ++i) {
    double start = thread_cpu_seconds();
    for (int r = 0; r < repeat; ++r) f();
    best = std::min(best, thread_cpu_seconds() - start);
  }
  return best;
}

}  // namespace

// attach_reductions looked through all of dy's readers (N reductions) for
// each reduction of dy; fold_constants scanned every reader of the learning
// rate's constant for each of the N update groups that got a copy of it.
TEST_CASE("report scaling: fuse-elementwise's work per node stays flat as parameters sharing one gradient grow") {
  ir::Graph small_graph = testing::compile_training(many_params_model(250)),
            large_graph = testing::compile_training(many_params_model(1000));
  double small = testing::fuse_work_per_node(small_graph), large = testing::fuse_work_per_node(large_graph);
  INFO(small << " vs " << large << " steps per node");
  CHECK(large < 1.2 * small);
}

// Under AdamW with weight decay and clipping, each parameter's 1 - lr·wd
// joined the optimizer's scalar group by walking every earlier parameter's
// update (they read the group's scalars and stay after it), and each
// parameter's update joined its clipped gradient's group by walking (and
// moving before it) every later parameter's clipped gradient: 8,000 lines
// took 13 s in the pass (old: 438 and 1,730 steps per node here, now 14).
TEST_CASE("report scaling: fuse-elementwise's work per node stays flat as parameters under adamw with weight decay and clipping grow") {
  // The training pipeline up to fuse-elementwise, which it runs too (a
  // second run finds the groups made and walks little).
  auto unfused = [](int params) {
    ir::Diagnostics diag;
    std::optional<ir::Graph> g =
        frontend::load_model_text(many_params_model(params, "adamw(lr=1e-3, weight_decay=0.01, grad_clip=1.0)"), "inline.yaml", diag);
    REQUIRE(g.has_value());
    REQUIRE(passes::run_forward_pipeline(*g, diag));
    testing::differentiate(*g);
    passes::PassManager pm({});
    pm.add(passes::make_optimizer_pass());
    pm.add(passes::make_dce_pass());
    REQUIRE(pm.run(*g, diag));
    return std::move(*g);
  };
  ir::Graph small_graph = unfused(250), large_graph = unfused(1000);
  double small = testing::fuse_work_per_node(small_graph), large = testing::fuse_work_per_node(large_graph);
  INFO(small << " vs " << large << " steps per node");
  CHECK(large < 1.2 * small);
}

// How much longer step(make_input(n)) takes for n = 4 * params than for n =
// params: about 4 when linear (a little more as the data outgrow the
// caches), 16 when quadratic.
template <typename MakeInput, typename Step>
double growth(int params, MakeInput&& make_input, Step&& step) {
  // Repeated until the smaller model takes 20 ms or more: shorter times are
  // mostly noise.
  int repeat = 1;
  auto seconds = [&](int n, bool calibrate) {
    const auto input = make_input(n);
    double t = best_of_three(repeat, [&] { step(input); });
    while (calibrate && t < 0.02) t = best_of_three(repeat *= 2, [&] { step(input); });
    return t;
  };
  double small = seconds(params, true), large = seconds(4 * params, false);
  return large / small;
}

ir::Graph training_graph(int params) { return testing::compile_training(many_params_model(params)); }

// analyze_memory scanned the whole kernel of each update to see whether it
// reads the target elsewhere: an optimizer batch spans up to 750 sgd updates
// (old: 10.6x here).
TEST_CASE("report scaling: the memory analysis takes linear time in the parameters") {
  CHECK(growth(180, training_graph, [](const ir::Graph& g) { analysis::analyze_memory(g); }) < 8);
}

// plan_memory compared each buffer with every one placed before it (N params
// and N gradients live together; old: 14.5x here).
TEST_CASE("report scaling: the memory plan takes linear time in the parameters") {
  CHECK(growth(
            1000, [](int params) { return analysis::analyze_memory(training_graph(params)); },
            [](const analysis::MemoryReport& m) { analysis::plan_memory(m); }) < 8);
}

// The fusion report's pattern of each group scanned every update (is it a
// parameter's update?) for each optimizer group.
TEST_CASE("report scaling: the fusion groups' patterns take linear time in the parameters") {
  CHECK(growth(1000,
               [](int params) {
                 ir::Graph g = training_graph(params);
                 ir::FusionGroups groups = ir::fusion_groups(g);
                 return std::make_pair(std::move(g), std::move(groups));
               },
               [](const std::pair<ir::Graph, ir::FusionGroups>& in) { report::group_patterns(in.first, in.second); }) <
        8);
}

// Under AdamW with weight decay and clipping, one kernel (the optimizer's
// scalar group) reads every parameter's sum of squared gradients and makes
// every parameter's 1 - lr·wd, all four bytes: each result scanned the inputs
// its siblings had already taken over before finding one free (old: 23x
// here; 61% of the report's time at 16,000 lines).
TEST_CASE("report scaling: in-place reuse takes linear time in the parameters under adamw with weight decay and clipping") {
  struct Input {
    ir::Graph graph;
    ir::FusionGroups groups;
    std::vector<analysis::MemoryBuffer> buffers;  // before any reuse
  };
  CHECK(growth(
            500,
            [](int params) {
              ir::Graph g = testing::compile_training(
                  many_params_model(params, "adamw(lr=1e-3, weight_decay=0.01, grad_clip=1.0)"));
              ir::FusionGroups groups = ir::fusion_groups(g);
              std::vector<analysis::MemoryBuffer> buffers =
                  analysis::analyze_memory(g, {.in_place_reuse = false}).buffers;
              return Input{std::move(g), std::move(groups), std::move(buffers)};
            },
            [](const Input& in) {
              std::vector<analysis::MemoryBuffer> buffers = in.buffers;
              analysis::reuse_buffers_in_place(in.graph, in.groups, buffers);
            }) < 8);
}
