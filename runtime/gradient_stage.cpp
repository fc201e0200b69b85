#include "runtime/gradient_stage.h"

#include <chrono>
#include <stdexcept>

#include "runtime/error.h"
#include "runtime/tensor_element.h"

namespace napkin::runtime {

GradientStage::GradientStage(Engine& engine, Communicator& comm, int64_t micro_batches)
    : engine_(engine), comm_(comm), micro_batches_(micro_batches) {
  if (micro_batches < 1) throw std::logic_error("GradientStage: fewer than one micro-batch");
  active_ = micro_batches > 1 || comm.size() > 1;
  const Program& p = engine.program();
  for (const GradientSpec& g : p.gradients) {
    numel_ += g.numel();
    gradient_bytes_ += g.bytes;
    all_f32_ = all_f32_ && g.dtype == DType::F32;
  }
  if (!active_) return;
  if (p.gradients.empty()) throw Error("the program names no gradients: it cannot accumulate or all-reduce them");
  if (micro_batches == 1 && comm.size() > 1) {
    device_ = engine.join_device_collectives(comm, why_not_device_);
    if (!device_.empty()) return;
  }
  sum_.resize(static_cast<size_t>(numel_));
  // f32 gradients are read into `sum_` itself (micro-batch 0) or `raw_`.
  if (!all_f32_ || micro_batches > 1) raw_.resize(static_cast<size_t>(gradient_bytes_));
}

int64_t GradientStage::all_reduce_bytes() const {
  return device_.empty() ? numel_ * static_cast<int64_t>(sizeof(float)) : gradient_bytes_;
}

int64_t GradientStage::buffer_bytes() const {
  return static_cast<int64_t>(sum_.size() * sizeof(float) + raw_.size());
}

void GradientStage::add_micro_batch(int64_t k) {
  if (!active_ || !device_.empty()) return;
  if (all_f32_) {
    if (k == 0) {
      engine_.download_gradients(reinterpret_cast<char*>(sum_.data()));
      return;
    }
    engine_.download_gradients(raw_.data());
    const float* g = reinterpret_cast<const float*>(raw_.data());
    float* s = sum_.data();
    for (int64_t i = 0; i < numel_; ++i) s[i] += g[i];
    return;
  }
  engine_.download_gradients(raw_.data());
  const char* base = raw_.data();
  int64_t at = 0;
  for (const GradientSpec& g : engine_.program().gradients) {
    const int64_t n = g.numel();
    for (int64_t i = 0; i < n; ++i) {
      float v = static_cast<float>(read_element(base, g.dtype, i));
      sum_[static_cast<size_t>(at + i)] = k == 0 ? v : sum_[static_cast<size_t>(at + i)] + v;
    }
    base += g.bytes;
    at += n;
  }
}

void GradientStage::finish() {
  if (!active_) return;
  auto timed = [this](auto&& all_reduce) {
    const auto start = std::chrono::steady_clock::now();
    all_reduce();
    all_reduce_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    ++all_reduces_;
  };
  if (!device_.empty()) {
    timed([&] { engine_.average_gradients_on_device(); });
    return;
  }
  if (comm_.size() > 1) timed([&] { comm_.all_reduce_sum(sum_.data(), numel_); });
  const float scale = static_cast<float>(1.0 / static_cast<double>(micro_batches_ * comm_.size()));
  if (all_f32_) {
    for (float& v : sum_) v *= scale;
    engine_.upload_gradients(reinterpret_cast<const char*>(sum_.data()));
    return;
  }
  char* base = raw_.data();
  int64_t at = 0;
  for (const GradientSpec& g : engine_.program().gradients) {
    const int64_t n = g.numel();
    for (int64_t i = 0; i < n; ++i) write_element(base, g.dtype, i, sum_[static_cast<size_t>(at + i)] * scale);
    base += g.bytes;
    at += n;
  }
  engine_.upload_gradients(raw_.data());
}

}  // namespace napkin::runtime
