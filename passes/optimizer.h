// The optimizer pass: appends the parameter update to a graph that autodiff
// has given gradients ("grad.<param>" outputs), so a whole training step is IR
// and everything it does is counted, planned and compiled like the rest.
//
// Terms:
//  - t: the step number of this update, 1 for the first. It is optimizer state
//    (`optimizer.step`, i64, zero at step 0) incremented by the graph itself.
//  - lr_t: the learning rate at step t from the schedule:
//      constant: lr · min(1, t / warmup)            (warmup = 0: lr)
//      cosine:   lr · t / warmup                    for t ≤ warmup, else
//                min_lr + ½(lr − min_lr)(1 + cos(π · min(1, (t − warmup) / (steps − warmup))))
//    where steps is train.steps (docs/training.md has the whole picture).
//  - g: a parameter's gradient, after global-norm clipping when grad_clip > 0:
//      g ← g · min(1, grad_clip / (‖all gradients‖₂ + 1e-6))   (torch.nn.utils.clip_grad_norm_)
//    where ‖all gradients‖₂² (the f32 sum of every gradient's squares) goes
//    through all_reduce_sum first: the sum over the ranks' shards when the
//    runtime shards the gradients (ZeRO-2), else the identity.
//  - wd: the weight decay of a parameter: 0 when its name matches a no_decay glob.
//
// The update rules follow torch.optim exactly (the lecture's hierarchy: momentum
// = SGD + an exponential average of gradients; AdaGrad = SGD + a sum of g²;
// RMSProp = AdaGrad with an exponential average; Adam = RMSProp + momentum):
//   sgd       g ← g + wd·p; with momentum μ: b ← μ·b + g, g ← nesterov ? g + μ·b : b;  p ← p − lr_t·g
//   momentum  sgd with μ = 0.9 by default
//   adagrad   g ← g + wd·p; s ← s + g²;  p ← p − lr_t · g / (√s + ε)
//   rmsprop   g ← g + wd·p; v ← α·v + (1−α)·g²; with momentum μ: b ← μ·b + g/(√v + ε), p ← p − lr_t·b;
//             otherwise p ← p − lr_t · g / (√v + ε)
//   adam      g ← g + wd·p; m ← β₁m + (1−β₁)g; v ← β₂v + (1−β₂)g²;
//             p ← p − (lr_t / (1−β₁ᵗ)) · m / (√v / √(1−β₂ᵗ) + ε)
//   adamw     p ← p · (1 − lr_t·wd) first (decoupled), then adam with wd = 0
//
// State tensors are graph values of kind State named after the rule:
// `momentum.buf.<p>`, `adagrad.sum_sq.<p>`, `rmsprop.sq_avg.<p>`,
// `rmsprop.buf.<p>`, `adam.m.<p>`, `adam.v.<p>` (adam and adamw). Every new
// parameter and state value is a Graph::update. Scalars (t, lr_t, the bias
// corrections, the clip coefficient) are computed in f32; tensor arithmetic is
// in each parameter's dtype.
#pragma once

#include <memory>

#include "ir/glob.h"
#include "passes/pass.h"

namespace napkin::passes {

std::unique_ptr<Pass> make_optimizer_pass();

// How no_decay selects parameters (ir/glob.h).
using ir::glob_match;

}  // namespace napkin::passes
