// The rng tensor (docs/runtime.md): what a program's random ops (dropout)
// read besides their operands. The trainer writes it before every forward:
// the run's seed, the step and whether the forward trains, so a mask is a
// pure function of (seed, step, op, element) and a resumed run draws the same.
#pragma once

#include <cstdint>

#include "runtime/engine.h"

namespace napkin::runtime {

// Writes runtime::rng_tensor_words(seed, step, training) into the program's
// rng tensor on the engine's host side (run_forward uploads it); nothing when
// the program has none. `step`: the 0-based index of the training step (an
// eval forward passes the step it follows; `training` false turns dropout off).
void set_rng(Engine& engine, uint64_t seed, int64_t step, bool training);

}  // namespace napkin::runtime
