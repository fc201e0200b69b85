// `napkin build --target cpu`: a training graph -> a standalone trainer
// executable. The steps, in order: kernel plan, LLVM module, program
// description, O3, object file, link (each timed for --time-passes).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "codegen/host/build_result.h"
#include "ir/graph.h"

namespace napkin::codegen::cpu {

struct BuildOptions {
  std::string output;         // the executable
  std::string model_hash;     // written into the program; checkpoints check it
  std::string device = "cpu";  // MFU is measured against its peak
  std::string emit_llvm;      // also write the optimized LLVM IR here ("" : no)
  std::string emit_program;   // also write the program JSON here ("" : no)
  // A language model's inference program (passes/derive_inference.h), built
  // into the same executable for the trainer's --sample-every; null: none.
  const ir::Graph* sampler = nullptr;
};

using host::BuildResult;

// Throws std::runtime_error (linker failure, unwritable output).
BuildResult build_cpu_trainer(const ir::Graph& g, const BuildOptions& options);

}  // namespace napkin::codegen::cpu
