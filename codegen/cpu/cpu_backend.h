// The CPU backend: a kernel plan -> an LLVM module -> optimized machine code,
// either as an object file (linked into a standalone trainer by
// codegen/cpu/link.h) or JIT-compiled in process (tests).
//
// The module holds each distinct loop kernel's code once (codegen/cpu/kernels.h;
// kernels that differ only in their operands' byte offsets, as a
// transformer's layers do, share it: cpu_backend.cpp), and three exported
// tables the runtime reads (runtime/program.h):
//   napkin_kernel_fns        [kernels] {ptr, ptr}: each loop kernel's code and
//                            its operands' byte offsets, which the runtime
//                            passes to it (runtime/executor.h KernelCode);
//                            nulls for the kinds the runtime runs itself
//   napkin_program_json      the program description (codegen/program_json.h)
//   napkin_program_json_size its length in bytes (i64)
// A language model's trainer also carries its sampler program (the trainer's
// --sample-every, runtime/sampler.h) under the prefix napkin_sampler_:
// napkin_sampler_kernel_fns, napkin_sampler_program_json(_size).
// Code is generated for the host CPU (AVX-512 here) and optimized with LLVM's
// O3 pipeline, with glibc's libmvec as the vector math library.
#pragma once

#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "codegen/cpu/kernels.h"
#include "codegen/plan.h"

namespace llvm {
class TargetMachine;
}

namespace napkin::codegen::cpu {

struct CpuModule {
  std::unique_ptr<llvm::LLVMContext> context;
  std::unique_ptr<llvm::Module> module;
  std::vector<LoopInfo> loops;  // per kernel; {1, false} for Gemm kernels
  // The loop kernels' code, each once (its key: cpu_backend.cpp), of every program in the module.
  std::unordered_map<std::string, llvm::Function*> bodies;
};

// The kernels of `plan` as an unoptimized module (the tables still lack the
// program JSON: add it with add_program_json once the loop info is known).
CpuModule emit_module(const KernelPlan& plan, const std::string& name);
void add_program_json(CpuModule& m, const std::string& json);
// A second program in the same module: its kernels, table `<prefix>_kernel_fns`
// and JSON `<prefix>_program_json(_size)`; returns its loop info.
std::vector<LoopInfo> add_program(CpuModule& m, const KernelPlan& plan, const std::string& prefix);
void add_program_json(CpuModule& m, const std::string& json, const std::string& prefix);

// Verifies the module (internal error if invalid) and runs the O3 pipeline.
void optimize(CpuModule& m, llvm::TargetMachine& tm);
// Machine code for the module as an ELF object file's bytes.
std::string emit_object(CpuModule& m, llvm::TargetMachine& tm);

// The module's LLVM IR as text (napkin build --emit-llvm).
std::string module_text(const CpuModule& m);

}  // namespace napkin::codegen::cpu
