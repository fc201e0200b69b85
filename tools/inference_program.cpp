#include "tools/inference_program.h"

#include <fmt/format.h>

#include "frontend/frontend.h"
#include "passes/derive_inference.h"
#include "passes/pipeline.h"
#include "tools/trainer_build.h"

namespace napkin::tools {

std::optional<ir::Graph> inference_graph(const std::string& path, const std::map<std::string, int64_t>& dims,
                                         int64_t batch, ir::Diagnostics& diag) {
  frontend::LoadOptions options;
  options.dim_overrides = dims;
  std::optional<ir::Graph> forward = frontend::load_model_file(path, diag, options);
  if (!forward) return std::nullopt;
  ir::Graph g = *forward;
  std::string why;
  std::optional<passes::LanguageModel> lm = passes::find_language_model(*forward, &why);
  if (lm && batch > 0 && batch != lm->batch) {
    if (lm->batch_dim.empty()) {
      diag.error({}, fmt::format("napkin sample --batch {}: the tokens' batch axis of '{}' has no dim name to set",
                                 batch, forward->name));
      return std::nullopt;
    }
    options.dim_overrides[lm->batch_dim] = batch;
    std::optional<ir::Graph> rebatched = frontend::load_model_file(path, diag, options);
    if (!rebatched) return std::nullopt;
    g = std::move(*rebatched);
  }
  if (!passes::run_inference_pipeline(g, diag)) return std::nullopt;
  g.config = forward->config;
  return g;
}

std::optional<InferenceProgram> inference_program(const std::string& path, const std::map<std::string, int64_t>& dims,
                                                  int64_t batch, ir::Diagnostics& diag, const passes::MemoryBudget& budget) {
  std::optional<ir::Graph> g = inference_graph(path, dims, batch, diag);
  if (!g) return std::nullopt;
  frontend::LoadOptions options;
  options.dim_overrides = dims;
  std::optional<ir::Graph> training = frontend::load_model_file(path, diag, options);
  // The same pipeline `napkin train` builds its trainer with, so the hashes agree.
  if (!training || !passes::run_training_pipeline(*training, diag, {}, budget)) return std::nullopt;
  g->config.train.memory_budget = budget.bytes;  // what the checkpoints' hash was built under, to name it
  return InferenceProgram{std::move(*g), model_hash(*training)};
}

std::optional<ir::Graph> trainer_sampler(const std::string& path, const std::map<std::string, int64_t>& dims) {
  ir::Diagnostics quiet;
  return inference_graph(path, dims, 1, quiet);
}

}  // namespace napkin::tools
