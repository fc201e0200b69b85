#include "runtime/cpu_engine.h"

#include <fmt/format.h>

namespace napkin::runtime {

std::string CpuEngine::describe() const {
  return fmt::format("{} thread{}", ex_.threads(), ex_.threads() == 1 ? "" : "s");
}

void CpuEngine::inspect_each_kernel(std::function<void(int kernel, const char* output)> inspect) {
  ex_.after_kernel = [this, inspect = std::move(inspect)](int i) {
    inspect(i, ex_.arena() + ex_.program().kernels[i].out_offset);
  };
}

}  // namespace napkin::runtime
