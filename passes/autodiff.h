// Reverse-mode automatic differentiation of the forward graph.
//
// Terms:
//  - the loss: the graph output named "loss", a floating scalar.
//  - a value "needs a gradient" iff it is floating, depends on some parameter
//    (through floating values only) and the loss depends on it through such a
//    path. Exactly these values get gradients; nothing else is computed.
//  - the gradient (adjoint) of a value v: d(loss)/d(v), a value of v's type.
//  - a backward node: one autodiff adds; its phase is Phase::Backward, and it
//    carries the YAML location and scope of the forward node it differentiates,
//    whose id is its origin (Node::origin).
//  - a saved activation: a forward buffer that some backward node reads, so
//    the forward must keep it alive until the backward has used it.
//
// The pass appends, after the forward schedule, the backward nodes built by each
// op's VJP (ir/vjp.cpp) in reverse schedule order, and one graph output
// ("grad.<param>", value) per parameter that has a gradient, in g.params order;
// that value is a contiguous buffer of its own, named "grad.<param>". Parameters
// the loss does not depend on get no output. docs/autodiff.md has the rules.
#pragma once

#include <memory>
#include <vector>

#include "passes/pass.h"

namespace napkin::passes {

std::unique_ptr<Pass> make_autodiff_pass();

// The forward buffers (owning values, never params or inputs) that
// backward-phase nodes read, in forward schedule order of their producers.
std::vector<ir::ValueId> saved_activations(const ir::Graph& g);

}  // namespace napkin::passes
