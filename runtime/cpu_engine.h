// The CPU engine: a trainer's kernels run by the executor (runtime/executor.h)
// over an arena in host memory, so host tensors are the arena itself and
// uploads and downloads have nothing to do.
#pragma once

#include "runtime/engine.h"
#include "runtime/executor.h"

namespace napkin::runtime {

class CpuEngine final : public Engine {
 public:
  CpuEngine(const Program& program, const KernelCode* kernels, int threads) : ex_(program, kernels, threads) {}

  const Program& program() const override { return ex_.program(); }
  std::string describe() const override;

  char* host(const TensorSpec& t) override { return ex_.arena() + t.offset; }
  void upload(TensorRole) override {}
  void download(TensorRole) override {}
  void download_tensor(const TensorSpec&) override {}

  void run_setup() override { ex_.run_setup(); }
  void run_forward() override { ex_.run_forward(); }
  double loss() override { return ex_.loss(); }
  void run_backward() override { ex_.run_backward(); }
  void run_decode() override { ex_.run_kernels(ex_.program().num_forward_kernels, static_cast<int>(ex_.program().kernels.size())); }
  void run_optimizer() override {
    ex_.run_optimizer();
    ex_.apply_updates();
  }
  void skip(const std::vector<bool>& kernels, const std::vector<bool>& updates,
            const std::vector<std::vector<bool>>& members) override {
    ex_.skip_kernel = kernels;
    ex_.skip_update = updates;
    ex_.run_member = members;
  }
  void set_collectives(std::function<void(const CollectiveSpec& spec, const char* x, char* y)> fn) override {
    ex_.collectives = std::move(fn);
  }
  bool set_collective_waits(std::function<void(int kernel)> fn) override {
    ex_.wait_collectives = std::move(fn);
    return true;
  }
  void release(const std::vector<const TensorSpec*>& tensors) override {
    for (const TensorSpec* t : tensors) ex_.release(t->offset, t->bytes);
  }
  void download_gradients(char* dst) override;
  void upload_gradients(const char* src) override;
  void download_gradient(size_t index, char* dst) override;
  void upload_gradient(size_t index, const char* src) override;
  void zero_gradient(size_t index) override;

  void inspect_each_kernel(std::function<void(int kernel, const char* output)> inspect) override;
  void set_profiling(bool on) override { ex_.profile = on; }
  const std::vector<double>& kernel_seconds() const override { return ex_.kernel_seconds; }

 private:
  Executor ex_;
};

}  // namespace napkin::runtime
