// Classifier fusion: the language-model head a model writes,
//
//   logits = einsum(x, w, "b s d, v d -> b s v")     (or w as [d, v]; matmul too)
//   loss   = cross_entropy(logits, targets)         (through the policy's promotion cast)
//
// becomes one linear_cross_entropy(x, w, targets) node (ir/loop.h's
// ClassifierParams), so the [rows, V] logits are never stored, in the forward
// or (through its one linear_cross_entropy_grad) the backward: for GPT-2's
// 50257-way head at 8x1024 tokens that is 1.5 GiB of f32 logits and as much
// of their gradient. It runs after the precision policy, on the operands as
// the matmul had them (bf16 under bf16-mixed), so the fused kernel rounds the
// logits as that matmul stored them and the numbers do not move.
//
// A site is each cross_entropy of the forward; the pass fuses it or says why
// not (logits read by another op, logits not made by a contraction with a 2-D
// operand, a loss computed in the low dtype, ...).
#pragma once

#include <memory>
#include <vector>

#include "passes/fuse_attention.h"
#include "passes/pass.h"

namespace napkin::passes {

// Where the rewrite happened or why not; the same fields as an attention site.
using ClassifierSite = AttentionSite;

// `sites` gets one entry per cross_entropy, in schedule order.
std::unique_ptr<Pass> make_fuse_classifier_pass(std::vector<ClassifierSite>& sites);

}  // namespace napkin::passes
