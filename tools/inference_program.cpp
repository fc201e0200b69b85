#include "tools/inference_program.h"

#include <fmt/format.h>

#include "frontend/frontend.h"
#include "passes/derive_inference.h"
#include "passes/pipeline.h"
#include "tools/trainer_build.h"

namespace napkin::tools {

std::optional<InferenceProgram> inference_program(const std::string& path, const std::map<std::string, int64_t>& dims,
                                                  int64_t batch, ir::Diagnostics& diag, const passes::MemoryBudget& budget) {
  frontend::LoadOptions options;
  options.dim_overrides = dims;
  std::optional<ir::Graph> forward = frontend::load_model_file(path, diag, options);
  if (!forward) return std::nullopt;
  ir::Graph training = *forward;
  // The same pipeline `napkin train` builds its trainer with, so the hashes agree.
  if (!passes::run_training_pipeline(training, diag, {}, budget)) return std::nullopt;
  InferenceProgram out{*forward, model_hash(training)};

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
    rebatched->config = forward->config;
    out.graph = std::move(*rebatched);
  }
  if (!passes::run_inference_pipeline(out.graph, diag)) return std::nullopt;
  out.graph.config = forward->config;
  return out;
}

std::optional<ir::Graph> trainer_sampler(const std::string& path, const std::map<std::string, int64_t>& dims) {
  ir::Diagnostics quiet;
  std::optional<InferenceProgram> p = inference_program(path, dims, 1, quiet);
  if (!p) return std::nullopt;
  return std::move(p->graph);
}

}  // namespace napkin::tools
