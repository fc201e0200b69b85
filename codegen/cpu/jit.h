// The CPU backend's code, compiled in process (ORC LLJIT) instead of into an
// object file: tests run a plan's kernels next to the reference interpreter
// without linking an executable per model. Same module, same O3 pipeline,
// same host CPU as `napkin build`.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "codegen/cpu/cpu_backend.h"

namespace llvm::orc {
class LLJIT;
}

namespace napkin::codegen::cpu {

class JitModule {
 public:
  // Optimizes m and compiles it. host_symbols: addresses of the functions the
  // kernels call outside libm/libmvec (napkin_rt_bad_index).
  JitModule(CpuModule m, const std::map<std::string, void*>& host_symbols);
  ~JitModule();
  // The address of an exported symbol (napkin_kernel_fns, ...); internal
  // error if absent.
  void* lookup(const std::string& name);

 private:
  std::unique_ptr<llvm::orc::LLJIT> jit_;
};

}  // namespace napkin::codegen::cpu
