// The runtime's fused attention: the CPU kernel of an Attention plan kernel
// (codegen/plan.h; the math is ir/loop.h's AttentionParams), described once
// at start-up (shapes and strides are static) and run every step, like Gemm.
//
//   forward   (q, k, v) -> o, lse
//   backward  (q, k, v, o, lse, do) -> dq, dk, dv
//
// q, o, do, dq: [batch, heads, q_len, head_dim]; k, v, dk, dv: [batch,
// kv_heads, kv_len, head_dim]; lse: [batch, heads, q_len] f32, contiguous.
// Every tensor is contiguous along head_dim; its batch, head and row strides
// (in elements) are the descriptor's. Query head h reads kv head
// h / (heads / kv_heads).
//
// Algorithm: FlashAttention-2 on cache-sized tiles. Forward keeps a running
// max and sum per query row (online softmax) over key blocks and never holds
// more than one tile of scores; backward recomputes each tile's scores from
// q, k and lse. Causal: key blocks wholly above the diagonal are skipped, not
// masked. Work is split across the pool by (batch, kv head) and query block;
// every output element is summed in an order fixed by the shape alone, so
// results are bit-identical for any thread count, run to run.
//
// Types: all of q, k, v, o, do, dq, dk, dv share one element type (f32, f64,
// bf16 or f16); arithmetic is f32 (f64 for f64), low-precision values are
// widened exactly on load and rounded to nearest even on store.
#pragma once

#include <cstdint>
#include <memory>

#include "runtime/gemm.h"
#include "runtime/thread_pool.h"

namespace napkin::runtime {

struct AttentionDesc {
  int64_t batch = 1, heads = 1, kv_heads = 1, q_len = 1, kv_len = 1, head_dim = 1;
  bool causal = true;  // key j visible to query i iff j <= i + kv_len - q_len (needs q_len <= kv_len)
  double scale = 1;
  struct Strides {
    int64_t batch = 0, head = 0, row = 0;
    bool operator==(const Strides&) const = default;
  };
  Strides q, k, v, o, d_o, dq, dk, dv;  // forward uses q, k, v, o
  bool operator==(const AttentionDesc&) const = default;
};

class Attention {
 public:
  // Validates the descriptor (throws runtime::Error naming the problem).
  Attention(AttentionDesc desc, GemmType type);
  ~Attention();
  Attention(Attention&&) noexcept;

  void forward(const void* q, const void* k, const void* v, void* o, float* lse, ThreadPool& pool) const;
  void backward(const void* q, const void* k, const void* v, const void* o, const float* lse, const void* d_o,
                void* dq, void* dk, void* dv, ThreadPool& pool) const;

  const AttentionDesc& desc() const { return d_; }
  GemmType type() const { return type_; }

 private:
  struct Impl;
  AttentionDesc d_;
  GemmType type_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace napkin::runtime
