// Helpers for tests: build a forward or training graph from inline YAML,
// failing the test (with the rendered diagnostics) if the model does not
// compile; read files of the source tree; list the built-in models.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "frontend/frontend.h"
#include "ir/graph.h"
#include "passes/autodiff.h"
#include "passes/dce.h"
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

// Runs the training pipeline with `pipeline` on a loaded model; REQUIREs that
// it loaded and compiled. `pipeline_result`, when given, gets what the passes did.
inline void require_training_pipeline(std::optional<ir::Graph>& g, ir::Diagnostics& diag,
                                      const passes::PipelineOptions& pipeline, passes::PipelineResult* pipeline_result) {
  std::optional<passes::PipelineResult> result = g ? passes::run_training_pipeline(*g, diag, pipeline) : std::nullopt;
  INFO(diag.render());
  REQUIRE(g.has_value());
  REQUIRE_FALSE(diag.has_errors());
  if (pipeline_result) *pipeline_result = std::move(*result);
}

// Lowers `yaml` and runs the training pipeline (autodiff, optimizer); CHECKs
// that there were no errors. `pipeline_result`, when given, gets what the passes did.
inline ir::Graph compile_training(const std::string& yaml, const std::string& name = "inline.yaml",
                                   const passes::PipelineOptions& pipeline = {},
                                   passes::PipelineResult* pipeline_result = nullptr) {
  ir::Diagnostics diag;
  std::optional<ir::Graph> g = frontend::load_model_text(yaml, name, diag);
  require_training_pipeline(g, diag, pipeline, pipeline_result);
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

// The text of a file of the source tree ("models/gpt.yaml"); REQUIREs that it reads.
inline std::string read_source(const std::string& relative) {
  std::ifstream in(source_path(relative), std::ios::binary);
  REQUIRE_MESSAGE(in, "cannot read " << relative);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// models/*.yaml, sorted; REQUIREs at least the five built-in models.
inline std::vector<std::filesystem::path> model_files() {
  std::vector<std::filesystem::path> models;
  for (const auto& entry : std::filesystem::directory_iterator(source_path("models")))
    if (entry.path().extension() == ".yaml") models.push_back(entry.path());
  std::sort(models.begin(), models.end());
  REQUIRE(models.size() >= 5);
  return models;
}

// Dims of each built-in model small enough for the float64 interpreter, large
// enough to keep every axis distinct and more than one layer / head. A new
// model needs an entry (the numeric tests fail without one).
inline const std::map<std::string, std::map<std::string, int64_t>>& small_dims() {
  static const std::map<std::string, std::map<std::string, int64_t>> dims = {
      {"cruncher", {{"batch", 4}, {"d", 8}, {"layers", 2}}},
      {"gpt", {{"batch", 2}, {"seq", 8}, {"vocab", 16}, {"d", 32}, {"heads", 2}, {"layers", 2}}},
      {"gpt2-124m", {{"batch", 2}, {"seq", 8}, {"vocab", 16}, {"d", 32}, {"heads", 2}, {"layers", 2}}},
      {"linear", {{"batch", 4}, {"d", 8}, {"k", 3}}},
      {"llama", {{"batch", 2}, {"seq", 8}, {"vocab", 37}, {"d", 16}, {"heads", 4}, {"kv_heads", 2}, {"hidden", 24}, {"layers", 2}}},
      {"llama-bpe", {{"batch", 2}, {"seq", 8}, {"vocab", 300}, {"d", 16}, {"heads", 4}, {"kv_heads", 2}, {"hidden", 24}, {"layers", 2}}},
      {"llama3-8b", {{"batch", 2}, {"seq", 8}, {"vocab", 37}, {"d", 16}, {"heads", 4}, {"kv_heads", 2}, {"hidden", 24}, {"layers", 2}}},
      {"lm-gqa", {{"batch", 2}, {"seq", 8}, {"vocab", 37}, {"d", 16}, {"heads", 4}, {"kv_heads", 2}, {"hidden", 24}, {"layers", 2}}},
      {"mixtral-8x7b", {{"batch", 2}, {"seq", 8}, {"vocab", 37}, {"d", 16}, {"heads", 4}, {"kv_heads", 2}, {"experts", 4},
                        {"expert_hidden", 24}, {"layers", 2}}},
      {"mlp", {{"batch", 4}, {"d_in", 8}, {"hidden", 16}, {"classes", 5}}},
      {"moe", {{"batch", 2}, {"seq", 8}, {"vocab", 37}, {"d", 16}, {"heads", 4}, {"kv_heads", 2}, {"experts", 4},
               {"expert_hidden", 24}, {"layers", 2}}},
  };
  return dims;
}

// A model file through the training pipeline with `options` (dims) and
// `pipeline`, with the file's precision policy or `precision` instead;
// `pipeline_result`, when given, gets what the passes did.
inline ir::Graph compile_model_file(const std::filesystem::path& model, const frontend::LoadOptions& options,
                                    std::optional<ir::PrecisionPolicy> precision = std::nullopt,
                                    const passes::PipelineOptions& pipeline = {},
                                    passes::PipelineResult* pipeline_result = nullptr) {
  ir::Diagnostics diag;
  std::optional<ir::Graph> g = frontend::load_model_file(model.string(), diag, options);
  if (g && precision) g->config.precision.policy = *precision, g->config.precision.fp32.clear();
  require_training_pipeline(g, diag, pipeline, pipeline_result);
  return std::move(*g);
}

// models/<stem>.yaml at small_dims() through the training pipeline, with the
// file's precision policy or `precision` instead.
inline ir::Graph compile_small_model(const std::filesystem::path& model,
                                     std::optional<ir::PrecisionPolicy> precision = std::nullopt,
                                     const passes::PipelineOptions& pipeline = {},
                                     passes::PipelineResult* pipeline_result = nullptr) {
  const std::string stem = model.stem().string();
  auto dims = small_dims().find(stem);
  REQUIRE_MESSAGE(dims != small_dims().end(), "add small dims for models/" << stem << ".yaml to small_dims() in tests/support/test_models.h");
  frontend::LoadOptions options;
  options.dim_overrides = dims->second;
  return compile_model_file(model, options, precision, pipeline, pipeline_result);
}

// autodiff then dce, as the training pipeline runs them (the manager verifies
// the graph after each); REQUIREs that autodiff reports no error.
inline void differentiate(ir::Graph& g) {
  ir::Diagnostics diag;
  passes::PassManager pm({});
  pm.add(passes::make_autodiff_pass());
  pm.add(passes::make_dce_pass());
  bool ok = pm.run(g, diag);
  INFO(diag.render());
  REQUIRE(ok);
}

}  // namespace napkin::testing
