// `napkin train`'s cache of built trainers: $XDG_CACHE_HOME/napkin (or
// ~/.cache/napkin) / KEY / trainer, KEY the FNV-1a of everything the trainer
// depends on: the training step, the target, this compiler and runtime (a
// rebuilt napkin builds afresh) and the device table with the local device
// file's rows (the trainer carries its device's figures: a `napkin devices
// --measure` builds afresh). trainer.sum beside it holds the FNV-1a of the
// trainer's bytes, so a truncated or damaged trainer is rebuilt, not run.
// Without HOME and XDG_CACHE_HOME the cache is $TMPDIR/napkin-cache-UID.
// The cache runs what it finds, so it trusts only its own
// (codegen/host/private_cache.h): its directories are made mode 0700, and one
// owned by another user or writable by others is refused (a user error); a
// trainer not owned by the user, or writable by others, is rebuilt.
#pragma once

#include <filesystem>
#include <iostream>
#include <optional>
#include <string>

#include "ir/graph.h"

namespace napkin::tools {

// The directory the cache lives in.
std::filesystem::path trainer_cache_dir();

// The path of g's trainer for `target` ("cpu" or "cuda"), built now (and
// said so on stdout) when the cache has no sound one. nullopt when building
// failed, or the cache cannot be used, with an error the user can act on
// (printed on stderr).
// The executable of g for `target`, built once per (graph, target, napkin,
// runtime, device table, model hash) and kept in trainer_cache_dir().
// model_hash: what checkpoints must match ("": g's own, a trainer's; an
// inference program's is its training step's). Progress goes to `log`.
// sampler: a CPU trainer's sampler program (tools/inference_program.h), or null.
std::optional<std::filesystem::path> cached_trainer(const ir::Graph& g, const std::string& target,
                                                    const std::string& model_hash = "", std::ostream& log = std::cout,
                                                    const ir::Graph* sampler = nullptr);

}  // namespace napkin::tools
