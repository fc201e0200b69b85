// The generated trainer's main program: flags, init, data, the step loop,
// progress and metrics, eval, checkpoints and resume. A trainer executable is
// its kernels (an object file napkin generated) + this + the rest of runtime/.
#pragma once

#include <cstddef>

#include "runtime/executor.h"

namespace napkin::runtime {

// Runs the trainer with the program description and kernel table its object
// file exports; returns the process exit status (0 ok, 1 a user error such as
// a bad flag, missing data or a NaN loss, 130 interrupted after saving).
int trainer_main(int argc, char** argv, const char* program_json, size_t program_json_size, const KernelFn* kernels);

}  // namespace napkin::runtime
