// Helpers for tests: build a forward graph from inline YAML, failing the test
// (with the rendered diagnostics) if the model does not compile.
#pragma once

#include <doctest/doctest.h>

#include <optional>
#include <string>

#include "frontend/frontend.h"
#include "ir/graph.h"
#include "passes/pipeline.h"

namespace napkin::testing {

// Lowers `yaml` and runs the forward pipeline; CHECKs that there were no errors.
inline ir::Graph compile(const std::string& yaml, const std::string& name = "inline.yaml") {
  ir::Diagnostics diag;
  std::optional<ir::Graph> g = frontend::load_model_text(yaml, name, diag);
  if (g) passes::run_forward_pipeline(*g, diag);
  INFO(diag.render());
  REQUIRE(g.has_value());
  REQUIRE_FALSE(diag.has_errors());
  return std::move(*g);
}

// Lowers `yaml` and runs the training pipeline (autodiff, optimizer); CHECKs
// that there were no errors.
inline ir::Graph compile_training(const std::string& yaml, const std::string& name = "inline.yaml") {
  ir::Diagnostics diag;
  std::optional<ir::Graph> g = frontend::load_model_text(yaml, name, diag);
  if (g) passes::run_training_pipeline(*g, diag);
  INFO(diag.render());
  REQUIRE(g.has_value());
  REQUIRE_FALSE(diag.has_errors());
  return std::move(*g);
}

// Lowers `yaml` expecting errors; returns the rendered diagnostics.
inline std::string compile_errors(const std::string& yaml, const std::string& name = "inline.yaml") {
  ir::Diagnostics diag;
  std::optional<ir::Graph> g = frontend::load_model_text(yaml, name, diag);
  CHECK_FALSE(g.has_value());
  CHECK(diag.has_errors());
  return diag.render();
}

inline std::string source_path(const std::string& relative) { return std::string(NAPKIN_SOURCE_DIR) + "/" + relative; }

}  // namespace napkin::testing
