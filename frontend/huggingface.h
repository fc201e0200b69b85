// The huggingface: section of a model file (docs/huggingface.md): the
// transformers class, config.json's values (expressions of dims) and which
// checkpoint tensor holds each parameter. Internal to frontend/.
#pragma once

#include <yaml-cpp/yaml.h>

#include <optional>

#include "frontend/dims.h"
#include "frontend/huggingface_map.h"
#include "frontend/yaml_context.h"
#include "ir/graph.h"

namespace napkin::frontend {

// Reads and checks the section, reporting every mistake with its line and
// column (nullopt after one). Needs the model's parameters (g.params, all of
// them lowered): each must be mapped exactly once. `params_complete` false
// (an earlier error may have left some undeclared) skips the checks that a
// pattern matches a parameter and that none is left unmapped.
std::optional<HuggingFaceMap> read_huggingface(const YAML::Node& node, YamlContext& ctx, const DimTable& dims,
                                               const ir::Graph& g, bool params_complete);

}  // namespace napkin::frontend
