// runtime/parameter_collectives: the prefetch thread. In one process every
// collective is its owner's copy, so what a test can see is when each copy
// has happened: a gather issued ahead (CollectiveSpec::wait >= 0) is done by
// the time wait_before(its kernel) returns, the collectives run in the order
// they were issued, one not issued ahead is done when its call returns, and
// an error on the thread reaches the rank at its next wait.
#include <doctest/doctest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "runtime/communicator.h"
#include "runtime/error.h"
#include "runtime/optimizer_shards.h"
#include "runtime/parameter_collectives.h"
#include "support/toy_optimizer.h"

using namespace napkin;
using runtime::CollectiveSpec;

namespace {

// Params a..e (the toy optimizer's kernels), 4 f32 each, one after the other.
runtime::Program toy_program() {
  runtime::Program p;
  int64_t at = 0;
  for (const char* name : {"a", "b", "c", "d", "e"}) {
    runtime::TensorSpec t;
    t.name = name, t.role = runtime::TensorRole::Param, t.dtype = runtime::DType::F32, t.shape = {4};
    t.offset = at, t.bytes = 16;
    at += 16;
    p.tensors.push_back(t);
  }
  p.kernels = testing::toy_optimizer_kernels();
  p.num_gradient_kernels = 0;
  return p;
}

CollectiveSpec gather(const char* param, int64_t wait) {
  return {.collective = "all_gather", .x = 0, .y = 0, .count = 4, .dtype = runtime::DType::F32, .param = param, .wait = wait};
}

}  // namespace

TEST_CASE("parameter collectives: on the prefetch thread a gather issued ahead is done by its kernel's wait, in issue order, and an error reaches the next wait") {
  const runtime::Program program = toy_program();
  runtime::OptimizerShards shards(program, 1, 0);
  std::unique_ptr<runtime::Communicator> comm = runtime::open_communicator(0);
  runtime::ParameterCollectives collectives(shards, *comm, 3);
  collectives.start_thread();
  REQUIRE(collectives.threaded());

  // Sources and destinations: 16 gathers of a growing value, each into its own slot.
  constexpr int kGathers = 16;
  std::vector<float> x(kGathers * 4), y(kGathers * 4, -1.0f);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i);
  std::vector<CollectiveSpec> specs;
  for (int i = 0; i < kGathers; ++i) specs.push_back(gather("a", i < kGathers / 2 ? 5 : 7));
  for (int i = 0; i < kGathers; ++i)
    collectives(specs[static_cast<size_t>(i)], reinterpret_cast<const char*>(&x[static_cast<size_t>(i) * 4]),
                reinterpret_cast<char*>(&y[static_cast<size_t>(i) * 4]));
  collectives.wait_before(5);  // the first half must be done now
  for (int i = 0; i < kGathers / 2 * 4; ++i) CHECK(y[static_cast<size_t>(i)] == static_cast<float>(i));
  collectives.wait_before(7);
  CHECK(y == x);

  // Not issued ahead: done when the call returns, after everything issued before it.
  std::vector<float> z(4, 0.0f);
  const std::vector<float> w = {1, 2, 3, 4};
  const CollectiveSpec now = gather("b", -1);
  collectives(now, reinterpret_cast<const char*>(w.data()), reinterpret_cast<char*>(z.data()));
  CHECK(z == w);

  // An unknown collective fails on the thread; the rank hears of it at its wait.
  CollectiveSpec bad = gather("c", 3);
  bad.collective = "all_to_all";
  collectives(bad, reinterpret_cast<const char*>(w.data()), reinterpret_cast<char*>(z.data()));
  CHECK_THROWS_WITH_AS(collectives.wait_before(-1), doctest::Contains("unknown collective all_to_all"), std::logic_error);
}

TEST_CASE("parameter collectives: without the thread each collective is done when its call returns, and counted as waited for") {
  const runtime::Program program = toy_program();
  runtime::OptimizerShards shards(program, 1, 0);
  std::unique_ptr<runtime::Communicator> comm = runtime::open_communicator(0);
  runtime::ParameterCollectives collectives(shards, *comm, 3);
  const std::vector<float> w = {1, 2, 3, 4};
  std::vector<float> z(4, 0.0f);
  const CollectiveSpec ahead = gather("d", 9);
  collectives(ahead, reinterpret_cast<const char*>(w.data()), reinterpret_cast<char*>(z.data()));
  CHECK(z == w);
  CHECK(collectives.gathers().calls == 1);
  CHECK(collectives.waits().seconds >= collectives.gathers().seconds);
  collectives.wait_before(9);  // nothing in flight: returns
}
