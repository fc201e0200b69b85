// `napkin train`'s cache of built trainers: $XDG_CACHE_HOME/napkin (or
// ~/.cache/napkin) / KEY / trainer, KEY the FNV-1a of everything the trainer
// depends on: the training step, the target, this compiler and runtime (a
// rebuilt napkin builds afresh) and the device table with the local device
// file's rows (the trainer carries its device's figures: a `napkin devices
// --measure` builds afresh). trainer.sum beside it holds the FNV-1a of the
// trainer's bytes, so a truncated or damaged trainer is rebuilt, not run.
#pragma once

#include <filesystem>
#include <optional>
#include <string>

#include "ir/graph.h"

namespace napkin::tools {

// The directory the cache lives in.
std::filesystem::path trainer_cache_dir();

// The path of g's trainer for `target` ("cpu" or "cuda"), built now (and
// said so on stdout) when the cache has no sound one. nullopt when building
// failed with an error the user can act on (printed on stderr).
std::optional<std::filesystem::path> cached_trainer(const ir::Graph& g, const std::string& target);

}  // namespace napkin::tools
