// The host toolchain both backends link trainers with: the C++ compiler
// napkin was built with, as the linker driver (recorded by CMake in
// host_config.h), and the file writing their builds share.
#pragma once

#include <string>

namespace napkin::codegen::host {

// Runs the linker driver on `inputs` (shell words: objects, archives, flags)
// into `executable`. Throws std::runtime_error with the linker's output if
// linking fails.
void link_executable(const std::string& inputs, const std::string& executable);

// Writes `bytes` to `path` (replacing it). Throws std::runtime_error when it
// cannot: the builds write objects, --emit-* files and sources with it.
void write_file(const std::string& path, const std::string& bytes);

// `s` as one shell word.
std::string shell_quoted(const std::string& s);

}  // namespace napkin::codegen::host
