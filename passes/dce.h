// Dead code elimination.
//
// A node is live if one of its outputs is a graph output (the loss, and later
// the optimizer's updates) or is read by a live node. Everything else is erased:
// a forward value no loss depends on costs nothing and must not be counted.
#pragma once

#include <memory>

#include "passes/pass.h"

namespace napkin::passes {

std::unique_ptr<Pass> make_dce_pass();

}  // namespace napkin::passes
