// Building a trainer from the driver: the model hash a trainer's checkpoints
// carry, and one way to call either backend's build that turns the failures
// a user can act on into a message.
#pragma once

#include <iostream>
#include <optional>
#include <stdexcept>
#include <string>

#include "ir/graph.h"
#include "ir/internal_check.h"

namespace napkin::tools {

// What a checkpoint must match: the training step itself (ops, shapes, names,
// optimizer), not the YAML's comments or layout.
std::string model_hash(const ir::Graph& g);

// Runs `build` (codegen::cpu::build_cpu_trainer or
// codegen::cuda::build_cuda_trainer); a failure the user can act on (the
// linker's, an unwritable output, a bad --arch) is printed and gives
// nullopt. Internal errors propagate.
template <typename Build, typename Options>
auto build_or_report(Build build, const ir::Graph& g, const Options& options)
    -> std::optional<decltype(build(g, options))> {
  try {
    return build(g, options);
  } catch (const ir::InternalError&) {
    throw;
  } catch (const std::runtime_error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return std::nullopt;
  }
}

}  // namespace napkin::tools
