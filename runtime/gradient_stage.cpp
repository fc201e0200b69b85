#include "runtime/gradient_stage.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <stdexcept>

#include "runtime/error.h"
#include "runtime/tensor_element.h"

namespace napkin::runtime {

namespace {

// Runs `collective`, adding its seconds to `seconds`.
template <typename F>
void timed(double& seconds, F&& collective) {
  const auto start = std::chrono::steady_clock::now();
  collective();
  seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

GradientStage::GradientStage(Engine& engine, Communicator& comm, int64_t micro_batches, const OptimizerShards* shards,
                             bool reduced_in_step, Communicator* replicas)
    : engine_(engine),
      comm_(comm),
      replicas_(replicas && replicas->size() > 1 && shards ? replicas : nullptr),
      micro_batches_(micro_batches),
      reduced_in_step_(reduced_in_step && shards) {
  if (micro_batches < 1) throw std::logic_error("GradientStage: fewer than one micro-batch");
  active_ = micro_batches > 1 || comm.size() > 1 || replicas_;
  const Program& p = engine.program();
  for (const GradientSpec& g : p.gradients) {
    numel_ += g.numel();
    gradient_bytes_ += g.bytes;
    all_f32_ = all_f32_ && g.dtype == DType::F32;
  }
  if (!active_) return;
  if (p.gradients.empty()) throw Error("the program names no gradients: it cannot accumulate or all-reduce them");
  const bool sharded = shards && (comm.size() > 1 || replicas_);
  // ZeRO-2 and 3 too, unless hybrid: the engine then averages each gradient onto its owner
  // (Engine::run_collectives_on_device).
  if ((!sharded || !replicas_) && micro_batches == 1 && comm.size() > 1) {
    device_ = engine.join_device_collectives(comm, why_not_device_);
    if (!device_.empty()) return;
  }
  Layout l = layout(p, micro_batches, comm.size(), comm.rank(), sharded ? shards : nullptr, reduced_in_step_);
  order_ = std::move(l.order);
  rank_counts_ = std::move(l.rank_counts);
  owned_ = std::move(l.owned);
  own_at_ = std::move(l.own_at);
  buckets_ = std::move(l.buckets);
  sum_.resize(static_cast<size_t>(l.sum));
  staging_.resize(static_cast<size_t>(l.staging));
  raw_.resize(static_cast<size_t>(l.raw));
}

GradientStage::Layout GradientStage::layout(const Program& p, int64_t micro_batches, int ranks, int rank,
                                            const OptimizerShards* shards, bool reduced_in_step) {
  Layout l;
  int64_t numel = 0, gradient_bytes = 0;
  bool all_f32 = true;
  for (const GradientSpec& g : p.gradients) {
    numel += g.numel();
    gradient_bytes += g.bytes;
    all_f32 = all_f32 && g.dtype == DType::F32;
  }
  if (!shards) {
    l.sum = numel;
    // f32 gradients are read into `sum_` itself (micro-batch 0) or `raw_`.
    if (!all_f32 || micro_batches > 1) l.raw = gradient_bytes;
    return l;
  }
  l.order.resize(p.gradients.size());
  for (size_t i = 0; i < l.order.size(); ++i) l.order[i] = i;
  std::stable_sort(l.order.begin(), l.order.end(), [&](size_t a, size_t b) {
    return shards->owner(p.gradients[a].param) < shards->owner(p.gradients[b].param);
  });
  l.rank_counts.assign(static_cast<size_t>(ranks), 0);
  l.owned.assign(p.gradients.size(), false);
  l.own_at.assign(p.gradients.size(), 0);
  int64_t largest = 0, widest_raw = 0;
  for (size_t i : l.order) {
    const GradientSpec& g = p.gradients[i];
    const int owner = shards->owner(g.param);
    if (owner == rank) {
      l.owned[i] = true;
      l.own_at[i] = l.rank_counts[static_cast<size_t>(owner)];
    }
    l.rank_counts[static_cast<size_t>(owner)] += g.numel();
    largest = std::max(largest, (g.bytes + 3) / 4);
    if (g.dtype != DType::F32) widest_raw = std::max(widest_raw, g.bytes);
  }
  // Buckets of whole gradients in owner order, each closed once it holds
  // bucket_bytes of f32 sums (a bucket holds any gradient larger alone).
  int64_t own_begin = 0;
  for (int r = 0; r < rank; ++r) own_begin += l.rank_counts[static_cast<size_t>(r)];
  const int64_t own_end = own_begin + l.rank_counts[static_cast<size_t>(rank)];
  l.sum = own_end - own_begin;
  if (reduced_in_step) {
    // No buckets nor staging (the others' gradients are zeroed by Engine::zero_gradient): each gradient read
    // to be added.
    int64_t widest = 0;
    for (const GradientSpec& g : p.gradients) widest = std::max(widest, g.bytes);
    l.raw = micro_batches > 1 ? widest : widest_raw;
    return l;
  }
  int64_t at = 0, widest_bucket = 0;
  Bucket b;
  b.counts.assign(static_cast<size_t>(ranks), 0);
  for (size_t n = 0; n < l.order.size(); ++n) {
    const GradientSpec& g = p.gradients[l.order[n]];
    if (b.first == b.last) b.own_at = std::clamp(at, own_begin, own_end) - own_begin;
    b.counts[static_cast<size_t>(shards->owner(g.param))] += g.numel();
    b.last = n + 1;
    at += g.numel();
    int64_t filled = 0;
    for (int64_t c : b.counts) filled += c;
    if (filled * static_cast<int64_t>(sizeof(float)) < static_cast<int64_t>(p.bucket_bytes) && n + 1 < l.order.size())
      continue;
    widest_bucket = std::max(widest_bucket, filled);
    l.buckets.push_back(b);
    b.first = b.last = n + 1;
    b.counts.assign(static_cast<size_t>(ranks), 0);
  }
  l.staging = std::max(widest_bucket, largest);
  l.raw = widest_raw;
  return l;
}

GradientStage::HostBuffers GradientStage::host_buffers(const Program& program, int64_t micro_batches, int ranks,
                                                       int rank, const OptimizerShards* shards, bool reduced_in_step) {
  if (micro_batches <= 1 && ranks <= 1) return {};  // inactive
  const bool sharded = shards && ranks > 1;
  const Layout l = layout(program, micro_batches, ranks, rank, sharded ? shards : nullptr, reduced_in_step && sharded);
  const int64_t f32 = sizeof(float);
  HostBuffers h;
  h.bytes = (l.sum + l.staging) * f32 + l.raw;
  if (!sharded && ranks > 1) h.all_reduced = l.sum * f32;
  if (sharded && !reduced_in_step) h.scattered = l.staging * f32;
  return h;
}

int64_t GradientStage::all_reduce_bytes() const {
  if (reduced_in_step_) return 0;
  if (sharded()) return micro_batches_ * numel_ * static_cast<int64_t>(sizeof(float));
  return device_.empty() ? numel_ * static_cast<int64_t>(sizeof(float)) : gradient_bytes_;
}

int64_t GradientStage::buffer_bytes() const {
  return static_cast<int64_t>((sum_.size() + staging_.size()) * sizeof(float) + raw_.size());
}

void GradientStage::add_sharded(int64_t k) {
  const Program& p = engine_.program();
  for (const Bucket& b : buckets_) {
    float* packed = staging_.data();
    for (size_t n = b.first; n < b.last; ++n) {
      const size_t i = order_[n];
      const GradientSpec& g = p.gradients[i];
      if (g.dtype == DType::F32) {
        engine_.download_gradient(i, reinterpret_cast<char*>(packed));
      } else {
        engine_.download_gradient(i, raw_.data());
        for (int64_t e = 0; e < g.numel(); ++e) packed[e] = static_cast<float>(read_element(raw_.data(), g.dtype, e));
      }
      packed += g.numel();
    }
    timed(all_reduce_seconds_, [&] { comm_.reduce_scatter_sum(staging_.data(), b.counts); });
    const int64_t mine = b.counts[static_cast<size_t>(comm_.rank())];
    float* sum = sum_.data() + b.own_at;
    if (k == 0) std::copy(staging_.data(), staging_.data() + mine, sum);
    else
      for (int64_t e = 0; e < mine; ++e) sum[e] += staging_[static_cast<size_t>(e)];
  }
}

void GradientStage::add_reduced(int64_t k) {
  const Program& p = engine_.program();
  for (size_t i = 0; i < p.gradients.size(); ++i) {
    if (!owned_[i]) continue;
    const GradientSpec& g = p.gradients[i];
    float* sum = sum_.data() + own_at_[i];
    if (g.dtype == DType::F32 && k == 0) {
      engine_.download_gradient(i, reinterpret_cast<char*>(sum));
      continue;
    }
    engine_.download_gradient(i, raw_.data());
    for (int64_t e = 0; e < g.numel(); ++e) {
      const float v = static_cast<float>(read_element(raw_.data(), g.dtype, e));
      sum[e] = k == 0 ? v : sum[e] + v;
    }
  }
}

void GradientStage::finish_sharded() {
  // Hybrid sharding: the same parameter's sum from every group.
  if (replicas_) timed(all_reduce_seconds_, [&] { replicas_->all_reduce_sum(sum_.data(), static_cast<int64_t>(sum_.size())); });
  const int64_t ranks = comm_.size() * (replicas_ ? replicas_->size() : 1);
  const float scale = static_cast<float>(1.0 / static_cast<double>(micro_batches_ * ranks));
  for (float& v : sum_) v *= scale;
  const Program& p = engine_.program();
  std::fill(staging_.begin(), staging_.end(), 0.0f);
  for (size_t i = 0; i < p.gradients.size(); ++i) {
    const GradientSpec& g = p.gradients[i];
    if (!owned_[i]) {
      // Zeros: they add nothing to the norm's and the overflow probe's sums. ZeRO-3's rank never wrote them
      // (its reduce leaves them alone), so they are given back rather than written.
      if (reduced_in_step_) engine_.zero_gradient(i);
      else engine_.upload_gradient(i, reinterpret_cast<const char*>(staging_.data()));
      continue;
    }
    const float* mean = sum_.data() + own_at_[i];
    if (g.dtype == DType::F32) {
      engine_.upload_gradient(i, reinterpret_cast<const char*>(mean));
      continue;
    }
    for (int64_t e = 0; e < g.numel(); ++e) write_element(raw_.data(), g.dtype, e, mean[e]);
    engine_.upload_gradient(i, raw_.data());
  }
  if (!reduced_in_step_) ++all_reduces_;
}

void GradientStage::add_micro_batch(int64_t k) {
  if (!active_ || !device_.empty()) return;
  if (sharded()) {
    if (reduced_in_step_) add_reduced(k);
    else add_sharded(k);
    return;
  }
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
  if (sharded()) {
    finish_sharded();
    return;
  }
  if (!device_.empty()) {
    timed(all_reduce_seconds_, [&] { engine_.average_gradients_on_device(); });
    if (!reduced_in_step_) ++all_reduces_;  // ZeRO-3's step reduced them (its own collectives' account)
    return;
  }
  if (comm_.size() > 1) {
    timed(all_reduce_seconds_, [&] { comm_.all_reduce_sum(sum_.data(), numel_); });
    ++all_reduces_;
  }
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
