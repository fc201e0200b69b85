// Attention fusion: the spelled-out attention a model writes,
//
//   scores = einsum(q, k, "b h i d, b h j d -> b h i j") * scale   (or / c, any chain of scalar factors)
//   att    = softmax(causal_mask(scores), axis=-1)                 (causal_mask optional)
//   y      = einsum(att, v, "b h i j, b h j d -> b h i d")
//
// becomes one attention(q, k, v) node (ir/loop.h's AttentionParams), so no
// [b, h, i, j] value is left in the step: its backward is one attention_grad
// that recomputes the scores. Axis orders of q, k, v and y other than these
// are taken through permute views. It runs on the forward graph before mixed
// precision, so the fused node gets the policy's casts like any contraction.
//
// A site is each softmax over the last axis whose input comes (through
// scalar scales and an optional causal_mask) from an einsum: the pass fuses it
// or says why not (a score or probability read by another op, a mask other
// than causal_mask, keys and values of different head_dim, ...).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "passes/pass.h"

namespace napkin::passes {

struct AttentionSite {
  ir::SourceLoc loc;   // the softmax's
  std::string scope;   // "blocks.3"
  bool fused = false;
  std::string reason;  // why not, when not fused
};

// `sites` gets one entry per site, in schedule order.
std::unique_ptr<Pass> make_fuse_attention_pass(std::vector<AttentionSite>& sites);

}  // namespace napkin::passes
