// fuse-elementwise's counted steps (passes/fuse_elementwise.h's work
// counter) per node of a graph: what the scaling tests compare at two sizes
// instead of a clock.
#pragma once

#include <doctest/doctest.h>

#include <cstdint>

#include "ir/diagnostics.h"
#include "ir/graph.h"
#include "ir/verifier.h"
#include "passes/fuse_elementwise.h"

namespace napkin::testing {

// Runs the pass on g (which it fuses) and returns its steps per node.
inline double fuse_work_per_node(ir::Graph& g) {
  int64_t work = 0;
  ir::Diagnostics diag;
  passes::make_fuse_elementwise_pass(&work)->run(g, diag);
  REQUIRE(ir::verify(g).empty());
  return static_cast<double>(work) / g.num_nodes();
}

}  // namespace napkin::testing
