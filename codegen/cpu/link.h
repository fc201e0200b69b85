// Links a generated object file with the runtime into a standalone trainer
// executable, with the C++ compiler napkin was built with as the linker
// driver. The runtime library, trainer main and BLAS paths are those of this
// napkin build (recorded by CMake in link_config.h).
#pragma once

#include <string>

namespace napkin::codegen::cpu {

// Writes the object to `object_path`, links `executable`. Throws
// std::runtime_error with the linker's output if linking fails.
void link_trainer(const std::string& object_bytes, const std::string& object_path, const std::string& executable);

// Runs the C++ compiler napkin was built with as the linker driver on
// `inputs` (shell words: objects, archives, flags) into `executable`; the
// CUDA backend links its trainers with this too. Throws like link_trainer.
void link_executable(const std::string& inputs, const std::string& executable);

// Writes `bytes` to `path` (replacing it). Throws std::runtime_error when it
// cannot: the builds write objects, --emit-* files and sources with it.
void write_file(const std::string& path, const std::string& bytes);

// `s` as one shell word.
std::string shell_quoted(const std::string& s);

// The libraries a generated kernel calls besides the runtime (libmvec for
// vector exp/log), as linker flags.
const char* kernel_link_flags();

}  // namespace napkin::codegen::cpu
