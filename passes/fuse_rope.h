// Rotary embeddings fused into attention: the rope a Llama applies to its
// queries and keys right before attention,
//
//   attention(rope(q), rope(k), v)      q [B, Hq, T, D], k and v [B, Hk, S, D]
//
// becomes attention(q, k, v) with the ropes' parameters as its rope_*
// attributes (ir/loop.h AttentionParams::rope): the attention kernels rotate
// q and k as they load them (and its gradient rotates dq and dk back), so the
// rotation has no kernel and no copy of q or k of its own, forward or
// backward.
//
// A site is a forward attention node without rope_* attributes. It is
// rewritten iff all of these hold:
//  - its q and its k are each the output of a rope node (the same node may
//    give both), read by nothing but this attention as q and k (not by another
//    node, not as v, not a step output);
//  - the two ropes have equal parameters (style, theta, the frequency
//    scaling), rotate axis 3 (head_dim) by the index of axis 2 (the sequence)
//    of their rank-4 operand, take no explicit positions and are not inverse;
//  - q and k have the same sequence length (T == S): the fused kernels put
//    query row i at position i + S - T, the standalone rope at i.
// Anything else stays as it is: the standalone rope kernel runs. The ropes
// the rewrite bypasses are left for the DCE after it. Runs right after
// fuse_attention, on the forward graph, before mixed precision and autodiff.
#pragma once

#include <memory>

#include "passes/pass.h"

namespace napkin::passes {

std::unique_ptr<Pass> make_fuse_rope_pass();

}  // namespace napkin::passes
