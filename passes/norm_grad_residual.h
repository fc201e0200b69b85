// The residual stream's gradient added by the norm's gradient kernel: a
// pre-norm block's input x is read by the norm and by the residual add, so
// its gradient is the sum of the norm's dx and the residual's,
//
//   s = add(r, layernorm_grad(x, g, dy))   ->   s = layernorm_grad(x, g, dy, r)
//
// (rmsnorm_grad alike): the row kernel adds r as it stores dx, and dx is
// never stored on its own (GPT-2 124M: 24 such sums, 0.56 GiB a step). When
// dx is read only by the add, the add does not broadcast (r, dx and s one
// type), dx is f32 or f64 (the kernel adds in the compute type, as the add
// would: the same bits), and r is made before the norm's gradient runs.
// Runs after autodiff and the cast passes, before the optimizer pass.
#pragma once

#include <memory>

#include "passes/pass.h"

namespace napkin::passes {

std::unique_ptr<Pass> make_norm_grad_residual_pass();

}  // namespace napkin::passes
