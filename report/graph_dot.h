// `napkin graph MODEL.yaml --dot`: the training step as a Graphviz digraph.
//
// Layout: one cluster per phase ("forward", "backward", "update" for the
// optimizer phase) holding its nodes; inside it one nested, filled cluster
// per fusion group (ir/fusion_group.h), labelled with its id and op count.
// A node is a box labelled op, output dtype and shape, and YAML line; views
// are dashed (they move no data), constants small. Params, state and inputs
// are ellipses outside the clusters. An edge runs from the node (or the
// param, state, input) making a value to each node reading it.
#pragma once

#include <string>

#include "ir/graph.h"

namespace napkin::report {

struct DotOptions {
  bool fusion_groups = true;  // false: draw every node on its own
};

std::string graph_dot(const ir::Graph& g, const DotOptions& options = {});

}  // namespace napkin::report
