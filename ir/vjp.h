// Vector-Jacobian products: the backward rule of every differentiable op.
//
// vjp_rule(op) is the VjpFn of the op table's row (see ir/op.h for the
// contract). Ops without one are the backward-only ops (softmax_grad, ...):
// autodiff reports an error if a gradient ever has to flow through them.
#pragma once

#include "ir/op.h"

namespace napkin::ir {

VjpFn vjp_rule(Op op);

}  // namespace napkin::ir
