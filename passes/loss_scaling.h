// Dynamic loss scaling for fp16-mixed, inside the graph (the algorithm of
// torch.cuda.amp.GradScaler, with precision.loss_scale's settings). f16 has
// 5 exponent bits: gradients below 2^-24 flush to zero. Scaling the loss by S
// before the backward scales every gradient by S, lifting small ones into
// range; the optimizer then sees them divided by S again.
//
// Terms (every value here is a scalar; nothing is done for other policies):
//  - state `loss_scale.scale` (f32) and `loss_scale.good_steps` (i64): State
//    values, which are zero before the first step; the scale in effect is
//      S = where(scale == 0, init, scale)
//    so the first step uses loss_scale.init (a scale is never 0 afterwards:
//    it only ever takes positive factors).
//  - seeding: the backward starts from d(loss) = S instead of 1, so each
//    gradient autodiff computes is S times the true one.
//  - unscaled gradient of parameter p: g_p = grad_S(p) · (1/S) in f32, which
//    becomes the output "grad.<p>" that the optimizer reads (clipping then
//    sees true gradients, as with GradScaler.unscale_ before clipping).
//  - found_inf: some g_p has an Inf or NaN element, computed as
//    v = Σ_p Σ reduce_sum(g_p · 0), found_inf = (v != v): x · 0 is 0 for
//    finite x and NaN for ±Inf and NaN, and NaN propagates through the sums.
//    v goes through all_reduce_sum before the test: summed over the ranks'
//    shards of the gradients under ZeRO-2 (the identity elsewhere), so an
//    overflow on any rank skips the update on all of them.
//    (Needs IEEE semantics: no fast-math nnan/ninf in a backend.)
//    Outputs "loss_scale.found_inf" (bool) and "loss_scale.scale" (S).
//    The unscaling is backward work; found_inf is the optimizer phase's, so
//    it reads the gradients after a step's micro-batches and ranks are
//    averaged (runtime/gradient_stage.h): every rank skips together.
//  - skip: after the optimizer, every update target T <- V becomes
//    T <- where(found_inf, T, V): on Inf/NaN the parameters, the optimizer
//    state and its step counter keep their old values.
//  - scale update (itself never skipped):
//      found_inf:  scale <- S · backoff,           good_steps <- 0
//      otherwise:  n = good_steps + 1;
//                  n == growth_interval: scale <- S · growth when that is
//                  finite (else S), good_steps <- 0
//                  else: scale <- S, good_steps <- n
//
// Two passes, because the optimizer pass sits between the halves:
// make_loss_scaling_pass (after autodiff: seed, unscale, found_inf) and
// make_skip_nonfinite_updates_pass (after the optimizer: skip, scale update).
#pragma once

#include <memory>

#include "passes/pass.h"

namespace napkin::passes {

std::unique_ptr<Pass> make_loss_scaling_pass();
std::unique_ptr<Pass> make_skip_nonfinite_updates_pass();

}  // namespace napkin::passes
