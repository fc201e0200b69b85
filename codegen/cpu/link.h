// Links a generated object file with the runtime into a standalone CPU
// trainer executable (the host toolchain, codegen/host/link.h). The runtime
// library, trainer main and BLAS paths are those of this napkin build
// (recorded by CMake in link_config.h).
#pragma once

#include <string>

namespace napkin::codegen::cpu {

// Links the object (its bytes) into `executable` (host::link_executable:
// nothing but `executable` is written). Throws std::runtime_error with the
// linker's output if linking fails.
void link_trainer(const std::string& object_bytes, const std::string& executable);

// The libraries a generated kernel calls besides the runtime (libmvec for
// vector exp/log), as linker flags.
const char* kernel_link_flags();

}  // namespace napkin::codegen::cpu
