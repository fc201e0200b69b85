// An ELF object file of constant byte arrays, for programs whose code is not
// LLVM's: the CUDA backend links its program description, cubin and PTX into
// a trainer this way (codegen/cuda/build.h).
//
// For each symbol NAME the object exports, with C linkage,
//     const char    NAME[]       the bytes, then one NUL (so text can be
//                                 used as a C string), aligned to 64 bytes
//     const int64_t NAME_size    the number of bytes, without the NUL
// and is built for the host (codegen/host/target_machine.h).
#pragma once

#include <string>
#include <vector>

namespace napkin::codegen::host {

struct DataSymbol {
  std::string name;
  std::string bytes;
};

// The object's bytes. Throws std::runtime_error if LLVM has no host target.
std::string emit_data_object(const std::vector<DataSymbol>& symbols, const std::string& module_name);

}  // namespace napkin::codegen::host
