// The runtime's attention against a KV cache: the CPU kernel of a
// CachedAttention plan kernel (codegen/plan.h; the math is ir/loop.h's
// CachedAttentionParams), the decode step of `napkin sample`.
//
//   (q, k, v, k_cache, v_cache, positions) -> o, writing k and v into the caches
//
// q, o: [batch, heads, rows, head_dim]; k, v: [batch, kv_heads, rows,
// head_dim]; the caches [batch, kv_heads, context, head_dim]; positions
// `rows` i32 (or i64) in [0, context). Every tensor is contiguous along
// head_dim; its batch, head and row strides (in elements) are the
// descriptor's.
//
// First the new rows are copied into the caches at their positions (k
// rotated there, with rope); then query row i attends to cache rows 0 ..
// positions[i]. Where the positions are 0, 1, ..., rows - 1 with rows > 1 (a
// prefill), that is causal attention of the queries over the new rows, run by
// runtime/attention.h's FlashAttention kernel (which rotates q and k as it
// loads them); otherwise (a decode step) each (batch, head, row) is
// one work item: its scores in f32 (f64 for f64), their softmax, and the sum
// of the value rows in order, so results do not depend on the thread count.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "runtime/attention.h"
#include "runtime/gemm.h"
#include "runtime/thread_pool.h"

namespace napkin::runtime {

struct CachedAttentionDesc {
  int64_t batch = 1, heads = 1, kv_heads = 1, rows = 1, context = 1, head_dim = 1;
  double scale = 1;
  bool positions_i64 = false;
  AttentionDesc::Strides q, k, v, k_cache, v_cache, o;
  // Rotary embeddings (rope->dim == head_dim): q and the new k rotated at
  // their rows' positions, k before it is written into the cache (which so
  // holds rotated keys).
  std::optional<RopeDesc> rope;
  bool operator==(const CachedAttentionDesc&) const = default;
};

class CachedAttention {
 public:
  // Validates the descriptor (throws runtime::Error naming the problem).
  CachedAttention(CachedAttentionDesc desc, GemmType type);
  ~CachedAttention();
  CachedAttention(CachedAttention&&) noexcept;

  // Throws runtime::Error for a position outside [0, context).
  void run(const void* q, const void* k, const void* v, void* k_cache, void* v_cache, const void* positions, void* o,
           ThreadPool& pool) const;

  const CachedAttentionDesc& desc() const { return d_; }

 private:
  CachedAttentionDesc d_;
  GemmType type_;
  std::optional<RopeTable> rope_;          // positions [0, context)
  std::unique_ptr<Attention> prefill_;     // the causal kernel over the new rows (rows > 1), rotating as it loads
  mutable std::vector<float> prefill_lse_;  // its lse, which nothing reads
};

}  // namespace napkin::runtime
