// Dead code elimination.
//
// A node is live if one of its outputs is a graph output (the loss, and later
// the gradients) or the value of an update (the optimizer's new params and
// state), or is read by a live node. Everything else is erased:
// a forward value no loss depends on costs nothing and must not be counted.
#pragma once

#include <memory>

#include "passes/pass.h"

namespace napkin::passes {

std::unique_ptr<Pass> make_dce_pass();

// Warns about each parameter no scheduled node reads. Run after dce, it names
// exactly the parameters the loss does not depend on.
void warn_unused_params(const ir::Graph& g, ir::Diagnostics& diag);

}  // namespace napkin::passes
