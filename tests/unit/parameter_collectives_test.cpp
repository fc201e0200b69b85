// runtime/parameter_collectives: the prefetch thread. In one process every
// collective is its owner's copy, so what a test can see is when each copy
// has happened: a gather issued ahead (CollectiveSpec::wait >= 0) is done by
// the time wait_before(its kernel) returns, the collectives run in the order
// they were issued, one not issued ahead is done when its call returns, and
// an error on the thread reaches the rank at its next wait.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>
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

// Rank `rank` of 2 whose broadcasts block until the test opens the gate,
// then deliver 7s: the owner's bytes arriving.
class GatedCommunicator final : public runtime::Communicator {
 public:
  explicit GatedCommunicator(int rank) : rank_(rank) {}
  void open() {
    std::lock_guard<std::mutex> lock(mutex_);
    open_ = true;
    gate_.notify_all();
  }
  std::atomic<int> entered{0};

  int rank() const override { return rank_; }
  int size() const override { return 2; }
  std::string describe() const override { return "a gated test communicator"; }
  void broadcast(void* data, int64_t bytes, int) override {
    ++entered;
    std::unique_lock<std::mutex> lock(mutex_);
    gate_.wait(lock, [&] { return open_; });
    for (int64_t i = 0; i < bytes / 4; ++i) static_cast<float*>(data)[i] = 7.0f;
  }
  void all_reduce_sum(float*, int64_t) override { unused(); }
  void all_reduce_sum(double*, int64_t) override { unused(); }
  void reduce_scatter_sum(float*, const std::vector<int64_t>&) override { unused(); }
  void reduce_sum(const float*, float*, int64_t, int) override { unused(); }
  void all_gather(const void*, int64_t, void*) override { unused(); }
  void send(const void*, int64_t, int) override { unused(); }
  void receive(void*, int64_t, int) override { unused(); }
  void barrier() override { unused(); }
  std::unique_ptr<Communicator> split(int, int) override { unused(); }
  [[noreturn]] void abort(int) override { unused(); }

 private:
  [[noreturn]] static void unused() { throw std::logic_error("not used by this test"); }
  int rank_;
  std::mutex mutex_;
  std::condition_variable gate_;
  bool open_ = false;
};

}  // namespace

TEST_CASE("parameter collectives: a gather issued ahead returns at once, and its kernel's wait returns only once its bytes have arrived") {
  const runtime::Program program = toy_program();
  runtime::OptimizerShards shards(program, 2, 0);
  GatedCommunicator comm(1 - shards.owner("a"));  // not the owner: the bytes come by the broadcast
  runtime::ParameterCollectives collectives(shards, comm, 3);
  collectives.start_thread();
  const std::vector<float> x(4, 1.0f);
  std::vector<float> y(4, 0.0f);
  const CollectiveSpec ahead = gather("a", 5);
  collectives(ahead, reinterpret_cast<const char*>(x.data()), reinterpret_cast<char*>(y.data()));  // returns: issued
  while (comm.entered.load() == 0) std::this_thread::yield();  // the thread is in the broadcast, held at the gate
  std::atomic<bool> waited{false};
  std::thread kernel5([&] {
    collectives.wait_before(5);
    waited = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK_FALSE(waited.load());  // kernel 5 may not run before the gather is done
  collectives.wait_before(4);  // nothing is due before kernel 4
  comm.open();
  kernel5.join();
  CHECK(waited.load());
  CHECK(y == std::vector<float>(4, 7.0f));
}

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
