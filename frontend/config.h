// The training sections of a model file: optimizer, precision and train.
// Internal to frontend/. Each reader validates every key and value and fills
// the TrainingConfig that later stages give meaning to.
#pragma once

#include <yaml-cpp/yaml.h>

#include <string>
#include <vector>

#include "frontend/yaml_context.h"
#include "ir/graph.h"

namespace napkin::frontend {

// `param_names`: the model's parameters, against which each no_decay pattern
// must match at least one; null skips that check (after an earlier error some
// parameters may be missing, and a pattern naming one is not at fault).
void read_optimizer(const YAML::Node& node, YamlContext& ctx, ir::OptimizerConfig& out,
                    const std::vector<std::string>* param_names);
void read_precision(const YAML::Node& node, YamlContext& ctx, ir::PrecisionConfig& out);
// Needs the graph to check that data sources match the model's inputs.
void read_train(const YAML::Node& node, YamlContext& ctx, const ir::Graph& g, ir::TrainConfig& out);

}  // namespace napkin::frontend
