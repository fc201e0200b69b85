// The host CPU as an LLVM target: the CPU backend compiles its kernels for
// it, and both backends emit their data objects (codegen/host/data_object.h)
// for it.
#pragma once

#include <llvm/IR/Module.h>
#include <llvm/Target/TargetMachine.h>

#include <memory>
#include <string>

namespace napkin::codegen::host {

// A TargetMachine for the host CPU (position-independent code, so the object
// links into a PIE executable). Throws std::runtime_error if LLVM has no
// target for this host.
std::unique_ptr<llvm::TargetMachine> host_target_machine();

// Machine code for `module` (already given tm's triple and data layout) as
// an ELF object file's bytes.
std::string emit_object(llvm::Module& module, llvm::TargetMachine& tm);

}  // namespace napkin::codegen::host
