// The inference program `napkin sample` builds (passes/derive_inference.h),
// and the hash of the training step whose checkpoints it loads.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "ir/diagnostics.h"
#include "ir/graph.h"
#include "passes/recompute.h"

namespace napkin::tools {

// The model's inference graph at `dims` with its batch dim at `batch` (0:
// the model's). It keeps the lowering at `dims`' config (its checkpoint dir,
// not a --dims variant's of the batch). Errors go to diag.
std::optional<ir::Graph> inference_graph(const std::string& path, const std::map<std::string, int64_t>& dims,
                                         int64_t batch, ir::Diagnostics& diag);

struct InferenceProgram {
  ir::Graph graph;         // prefill and decode, over the model's parameters
  std::string model_hash;  // the training step's (tools/trainer_build.h): its checkpoints carry it
};

// inference_graph, and the hash of the training step at `dims` under
// `budget` (as `napkin train --memory-budget` built it): what a sampler
// that loads checkpoints needs.
std::optional<InferenceProgram> inference_program(const std::string& path, const std::map<std::string, int64_t>& dims,
                                                  int64_t batch, ir::Diagnostics& diag,
                                                  const passes::MemoryBudget& budget = {});

// The sampler program a CPU trainer carries for --sample-every: the model's
// inference graph at batch 1, or nullopt (no message) when napkin sample
// cannot derive one (not a language model, or ops that mix positions).
std::optional<ir::Graph> trainer_sampler(const std::string& path, const std::map<std::string, int64_t>& dims);

}  // namespace napkin::tools
