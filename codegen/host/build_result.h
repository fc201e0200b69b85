// What a trainer build did, whichever backend built it: the CPU build
// returns it, the CUDA build (codegen/cuda/build.h) extends it.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace napkin::codegen::host {

struct BuildResult {
  int64_t arena_bytes = 0;
  int kernels = 0, matmul_kernels = 0;
  int functions = 0;  // the distinct functions of generated code the step's kernels run
  std::vector<std::pair<std::string, double>> seconds;  // per step of the build
};

}  // namespace napkin::codegen::host
