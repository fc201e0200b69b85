#include "runtime/parameter_collectives.h"

#include <chrono>
#include <cstring>
#include <stdexcept>

#include "runtime/tensor_element.h"
#include "runtime/tensor_types.h"

namespace napkin::runtime {

ParameterCollectives::ParameterCollectives(const OptimizerShards& shards, Communicator& comm, int stage)
    : shards_(shards), comm_(comm), stage_(stage) {}

ParameterCollectives::~ParameterCollectives() {
  if (!worker_.joinable()) return;
  {
    // What is queued and not begun is dropped: after a step completes nothing is queued, so this is an error's
    // unwinding, and the job ends anyway.
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    if (queue_.size() > 1) queue_.erase(queue_.begin() + 1, queue_.end());
  }
  changed_.notify_all();
  Communicator::Waiting waiting("the collectives thread's last call");  // a dead peer: the watchdog ends it
  worker_.join();
}

void ParameterCollectives::start_thread() {
  if (!worker_.joinable()) worker_ = std::thread([this] { work(); });
}

void ParameterCollectives::work() {
  Communicator::in_background();  // the rank waits, marked, in wait_for
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    changed_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, nothing left
    const Job job = queue_.front();
    lock.unlock();
    try {
      run(*job.spec, job.x, job.y);
    } catch (...) {
      lock.lock();
      if (!error_) error_ = std::current_exception();
      queue_.clear();
      done_ = issued_;  // nobody waits for the rest: the waiter rethrows
      changed_.notify_all();
      continue;
    }
    lock.lock();
    queue_.pop_front();
    ++done_;
    changed_.notify_all();
  }
}

void ParameterCollectives::wait_for(int64_t job) {
  const auto start = std::chrono::steady_clock::now();
  Communicator::Waiting waiting("ZeRO-3's collectives");
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [&] { return done_ >= job; });
  if (error_) std::rethrow_exception(error_);
  if (counting_) waits_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void ParameterCollectives::wait_before(int kernel) {
  if (!worker_.joinable()) return;
  int64_t job = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (kernel < 0) {
      job = issued_;
      due_.clear();
    } else if (auto it = due_.find(kernel); it != due_.end()) {
      job = it->second;
      due_.erase(it);
    }
  }
  if (job > 0) wait_for(job);
}

void ParameterCollectives::operator()(const CollectiveSpec& spec, const char* x, char* y) {
  if (!worker_.joinable()) {
    const auto start = std::chrono::steady_clock::now();
    run(spec, x, y);
    if (counting_) waits_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return;
  }
  int64_t job = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (error_) std::rethrow_exception(error_);  // the thread failed: nothing more goes to the other ranks
    queue_.push_back({&spec, x, y});
    job = ++issued_;
    if (spec.wait >= 0) due_[static_cast<int>(spec.wait)] = job;
  }
  changed_.notify_all();
  if (spec.wait < 0) wait_for(job);
}

void ParameterCollectives::run(const CollectiveSpec& spec, const char* x, char* y) {
  const int64_t bytes = spec.count * element_bytes(spec.dtype);
  auto copy = [&] { std::memmove(y, x, static_cast<size_t>(bytes)); };
  if (spec.collective == "all_reduce_sum") {
    copy();
    comm_.all_reduce_sum(reinterpret_cast<float*>(y), spec.count);
    return;
  }
  if (stage_ < 3) {  // every rank holds every parameter; the gradient stage reduces
    copy();
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  const int owner = shards_.owner(spec.param);
  const bool mine = comm_.rank() == owner;
  Totals* totals = nullptr;
  if (spec.collective == "all_gather") {
    if (mine) copy();
    comm_.broadcast(y, bytes, owner);
    totals = &gathers_;
  } else if (spec.collective == "reduce_scatter") {
    if (spec.dtype == DType::F32) {
      comm_.reduce_sum(reinterpret_cast<const float*>(x), reinterpret_cast<float*>(y), spec.count, owner);
    } else {
      staging_.resize(static_cast<size_t>(spec.count));
      for (int64_t i = 0; i < spec.count; ++i) staging_[static_cast<size_t>(i)] = static_cast<float>(read_element(x, spec.dtype, i));
      comm_.reduce_sum(staging_.data(), staging_.data(), spec.count, owner);
      if (mine)
        for (int64_t i = 0; i < spec.count; ++i) write_element(y, spec.dtype, i, staging_[static_cast<size_t>(i)]);
    }
    totals = &reduces_;
  } else {
    throw std::logic_error("ParameterCollectives: unknown collective " + spec.collective);
  }
  if (!counting_) return;
  ++totals->calls;
  totals->bytes += static_cast<double>(bytes);
  totals->seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

bool gathers_parameters(const Program& program) {
  for (const KernelSpec& k : program.kernels)
    if (const CollectiveSpec* c = k.as<CollectiveSpec>(); c && c->collective == "all_gather") return true;
  return false;
}

}  // namespace napkin::runtime
