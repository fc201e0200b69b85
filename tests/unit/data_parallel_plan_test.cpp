// What the plan tells a data-parallel runtime (codegen/plan.h): where each
// gradient is and when the backward has finished it, which parameters each
// optimizer kernel serves, whose state each state tensor is; and how
// runtime/optimizer_shards.h turns that into ZeRO-1 ownership. The e2e tests
// (tests/e2e/data_parallel_test.cpp) check that training with them is
// right; these check the facts themselves on every shipped model.
#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>

#include "codegen/plan.h"
#include "runtime/optimizer_shards.h"
#include "support/test_models.h"
#include "support/toy_optimizer.h"

namespace napkin {
namespace {

TEST_CASE("plan: every gradient is named, dense, finished inside the backward, and served by the optimizer") {
  for (const char* model : {"models/gpt.yaml", "models/mlp.yaml", "models/lm-gqa.yaml", "models/gpt2-124m.yaml"}) {
    CAPTURE(model);
    const ir::Graph g = testing::compile_small_model(testing::source_path(model), ir::PrecisionPolicy::BF16Mixed);
    const codegen::KernelPlan plan = codegen::plan_kernels(g);
    REQUIRE(plan.num_forward_kernels <= plan.num_gradient_kernels);
    REQUIRE(plan.num_gradient_kernels < static_cast<int>(plan.kernels.size()));
    // One gradient per parameter, in the params' order, inside the arena, none overlapping another.
    REQUIRE(plan.gradients.size() == g.params.size());
    std::vector<std::pair<int64_t, int64_t>> ranges;
    for (size_t i = 0; i < g.params.size(); ++i) {
      const codegen::PlannedGradient& grad = plan.gradients[i];
      CHECK(grad.param == g.value(g.params[i].value).name);
      CHECK(grad.bytes == g.value(g.params[i].value).type.numel() * static_cast<int64_t>(ir::dtype_size(grad.dtype)));
      CHECK(grad.byte_offset >= 0);
      CHECK(grad.byte_offset + grad.bytes <= plan.arena_bytes);
      CHECK(grad.ready_after >= plan.num_forward_kernels);
      CHECK(grad.ready_after < plan.num_gradient_kernels);
      ranges.emplace_back(grad.byte_offset, grad.byte_offset + grad.bytes);
    }
    std::sort(ranges.begin(), ranges.end());
    for (size_t i = 1; i < ranges.size(); ++i) CHECK(ranges[i - 1].second <= ranges[i].first);
    // Only optimizer kernels after the boundary; every parameter's update is served by some kernel.
    std::set<int> served;
    for (size_t i = 0; i < plan.kernels.size(); ++i) {
      const codegen::Kernel& k = plan.kernels[i];
      CHECK((k.phase == ir::Phase::Optimizer) == (static_cast<int>(i) >= plan.num_gradient_kernels));
      if (k.serves) served.insert(k.serves->begin(), k.serves->end());
      CHECK((k.batch.empty() || k.phase != ir::Phase::Optimizer || k.member_serves.size() == k.batch.size()));
    }
    CHECK(served.size() == g.params.size());
    // Every AdamW state tensor belongs to its parameter, by the optimizer pass's record; the step counter to none.
    for (const codegen::PlannedTensor& t : plan.tensors) {
      if (t.role != codegen::TensorRole::State) continue;
      CAPTURE(t.name);
      if (t.name == "optimizer.step") CHECK(t.param.empty());
      else CHECK(t.name == "adam." + std::string(t.name.substr(5, 1)) + "." + t.param);
    }
    for (const codegen::UpdateCopy& u : plan.updates) CHECK((u.param.empty() == (u.target == "optimizer.step")));
  }
}

// A program as OptimizerShards reads it: params a..e (bytes 400, 300, 200,
// 100, 100, each with as much state), kernel 0 shared, kernel 1 a batch that
// can run member by member (a, b, c), kernel 2 one kernel for d and e
// together, kernel 3 serving everything (a gradient norm).
runtime::Program toy_program() {
  runtime::Program p;
  const std::map<std::string, int64_t> bytes = {{"a", 400}, {"b", 300}, {"c", 200}, {"d", 100}, {"e", 100}};
  for (const auto& [name, b] : bytes) {
    runtime::TensorSpec t;
    t.name = name, t.role = runtime::TensorRole::Param, t.dtype = runtime::DType::F32, t.bytes = b;
    p.tensors.push_back(t);
    t.name = "adam.m." + name, t.role = runtime::TensorRole::State, t.param = name;
    p.tensors.push_back(t);
  }
  runtime::TensorSpec step;
  step.name = "optimizer.step", step.role = runtime::TensorRole::State, step.dtype = runtime::DType::I64, step.bytes = 8;
  p.tensors.push_back(step);
  p.kernels = napkin::testing::toy_optimizer_kernels();
  p.updates = {{"a", 0, 0, 0, "a"}, {"optimizer.step", 0, 0, 0, ""}};
  return p;
}

// A GPU's batch of every parameter's update (one launch, which cannot run
// member by member) serves every parameter as the gradient norm does, but
// writes their state: it binds them into one unit, and only its owner runs
// it (a rank running it would write the others' released state).
TEST_CASE("ZeRO-1: an update kernel serving every parameter binds them all to one rank, which alone runs it (issue 40)") {
  runtime::Program p = toy_program();
  int64_t at = 0;
  for (runtime::TensorSpec& t : p.tensors) t.offset = at, at += t.bytes;
  runtime::KernelSpec all = p.kernels[3];
  all.name = "update_all";
  all.out_offset = p.tensors[1].offset;  // adam.m.a
  p.kernels = {p.kernels[0], all};
  for (int ranks : {2, 3}) {
    CAPTURE(ranks);
    int running = 0;
    for (int rank = 0; rank < ranks; ++rank) {
      const runtime::OptimizerShards s(p, ranks, rank);
      for (const char* name : {"b", "c", "d", "e"}) CHECK(s.owner(name) == s.owner("a"));
      CHECK_FALSE(s.skip_kernel()[0]);
      CHECK(s.skip_kernel()[1] == (s.owner("a") != rank));
      running += !s.skip_kernel()[1];
    }
    CHECK(running == 1);
  }
}

TEST_CASE("ZeRO-1: every parameter has one owner, units stay together, and a rank skips exactly the others' work") {
  const runtime::Program p = toy_program();
  for (int ranks : {1, 2, 3, 4}) {
    CAPTURE(ranks);
    std::map<std::string, int> owners;
    int64_t owned_state = 0;
    for (int rank = 0; rank < ranks; ++rank) {
      const runtime::OptimizerShards s(p, ranks, rank);
      for (const char* name : {"a", "b", "c", "d", "e"}) owners[name] = s.owner(name);
      owned_state += s.owned_state_bytes();
      // The shared kernel runs everywhere, and so does the norm (it serves every trained parameter: under
      // ZeRO-2 each rank sums its part of it).
      CHECK_FALSE(s.skip_kernel()[0]);
      CHECK_FALSE(s.skip_kernel()[3]);
      // The batch: skipped when no member is this rank's, else exactly its members run.
      const bool any = s.owner("a") == rank || s.owner("b") == rank || s.owner("c") == rank;
      CHECK(s.skip_kernel()[1] == !any);
      if (any && !s.run_member()[1].empty())
        for (int m = 0; m < 3; ++m) CHECK(s.run_member()[1][m] == (s.owner(std::string(1, static_cast<char>('a' + m))) == rank));
      CHECK(s.skip_update()[0] == (s.owner("a") != rank));
      CHECK_FALSE(s.skip_update()[1]);  // the step counter is everyone's
      CHECK(s.others_state().size() == static_cast<size_t>(5 - s.owned_params()));
    }
    CHECK(owners["d"] == owners["e"]);  // one kernel, one rank
    CHECK(owned_state == 1100);         // every state byte has exactly one owner
    if (ranks == 2) {
      // Largest first (with state) to the least loaded: a 800 -> 0; b 600 -> 1; c 400 -> 1 (600 < 800);
      // the unit {d, e} 400 -> 0 (800 < 1000).
      CHECK(owners["a"] == 0);
      CHECK(owners["b"] == 1);
      CHECK(owners["c"] == 1);
      CHECK(owners["d"] == 0);
    }
  }
}

}  // namespace
}  // namespace napkin
