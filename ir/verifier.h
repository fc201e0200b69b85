// The IR verifier: structural invariants every pass must preserve. It runs
// after every pass; a violation is a compiler bug, reported as an internal error.
//
// Checked: ids in range; each live node scheduled once and after the producers of
// its inputs (the schedule is topological); arity; every output's type equals what
// the op's shape rule says now; views alias their input's buffer and non-views own
// theirs; layouts have one stride per axis; graph outputs are defined.
#pragma once

#include <string>
#include <vector>

#include "ir/graph.h"

namespace napkin::ir {

// Returns one message per violated invariant; empty means the graph is well formed.
std::vector<std::string> verify(const Graph& g);

}  // namespace napkin::ir
