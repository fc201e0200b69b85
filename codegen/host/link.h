// The host toolchain both backends link trainers with: the C++ compiler
// napkin was built with, as the linker driver (recorded by CMake in
// host_config.h), and the file writing their builds share.
#pragma once

#include <string>

namespace napkin::codegen::host {

// Links `object` (an object file's bytes) with `libraries` (shell words:
// objects, archives, flags) into `executable`. The object and the linker's
// output are written in a private directory beside `executable` (mkdtemp,
// mode 0700: beside it, so that the result renames onto it within one file
// system), removed with everything in it on every path; the finished
// executable is renamed over `executable`. So nothing else near it is
// written or removed (`X.o` is not napkin's), and a failed build leaves
// `executable` as it was. Throws std::runtime_error with the linker's output
// if linking fails, or naming what could not be written.
void link_executable(const std::string& object, const std::string& libraries, const std::string& executable);

// Writes `bytes` to `path` (replacing it). Throws std::runtime_error when it
// cannot: the builds write objects, --emit-* files and sources with it.
void write_file(const std::string& path, const std::string& bytes);

// `s` as one shell word.
std::string shell_quoted(const std::string& s);

}  // namespace napkin::codegen::host
