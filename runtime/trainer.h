// The generated trainer's main program: flags, init, data, the step loop,
// progress and metrics, eval, checkpoints and resume. A trainer executable is
// its kernels (an object file napkin generated) + this + the rest of runtime/.
#pragma once

#include <cstddef>

#include "runtime/engine.h"

namespace napkin::runtime {

// The inference program a language model's CPU trainer also carries
// (codegen/cpu/build.h BuildOptions::sampler), for --sample-every; json
// null: none.
struct SamplerProgram {
  const char* json = nullptr;
  size_t size = 0;
  EngineFactory make_engine;
};

// Runs the trainer with the program description its object file exports;
// returns the process exit status (0 ok, 1 a user error such as a bad flag,
// missing data, a NaN loss or no GPU, 130 interrupted after saving). main()
// calls block_stop_signals() (runtime/stop_signals.h) before it, before any
// thread exists: the trainer takes SIGINT and SIGTERM on a thread of its own.
int trainer_main(int argc, char** argv, const char* program_json, size_t program_json_size,
                 const EngineFactory& make_engine, const SamplerProgram& sampler = {});

}  // namespace napkin::runtime
