// The shapes and strides of one fused attention (runtime/attention.h has the
// tensors' layout), apart from the kernel so that the kernels' variants
// (runtime/attention_amx.h) read it without including the kernel that picks
// them.
#pragma once

#include <cstdint>
#include <optional>

#include "runtime/rope.h"

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
  // Rotary embeddings applied to q and k as they are loaded (rope->dim ==
  // head_dim): query row i at position i + kv_len - q_len, key row j at j.
  // The backward's dq and dk are the gradients of the unrotated q and k
  // (rotated back by the negated angles before they are stored).
  std::optional<RopeDesc> rope;
  bool operator==(const AttentionDesc&) const = default;
};

}  // namespace napkin::runtime
