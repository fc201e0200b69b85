#include "runtime/cpu_engine.h"

#include <fmt/format.h>

#include <cstring>

namespace napkin::runtime {

std::string CpuEngine::describe() const {
  return fmt::format("{} thread{}", ex_.threads(), ex_.threads() == 1 ? "" : "s");
}

void CpuEngine::download_gradients(char* dst) {
  for (const GradientSpec& g : ex_.program().gradients) {
    std::memcpy(dst, ex_.arena() + g.offset, static_cast<size_t>(g.bytes));
    dst += g.bytes;
  }
}

void CpuEngine::upload_gradients(const char* src) {
  for (const GradientSpec& g : ex_.program().gradients) {
    std::memcpy(ex_.arena() + g.offset, src, static_cast<size_t>(g.bytes));
    src += g.bytes;
  }
}

void CpuEngine::download_gradient(size_t index, char* dst) {
  const GradientSpec& g = ex_.program().gradients.at(index);
  std::memcpy(dst, ex_.arena() + g.offset, static_cast<size_t>(g.bytes));
}

void CpuEngine::upload_gradient(size_t index, const char* src) {
  const GradientSpec& g = ex_.program().gradients.at(index);
  std::memcpy(ex_.arena() + g.offset, src, static_cast<size_t>(g.bytes));
}

void CpuEngine::zero_gradient(size_t index) {
  const GradientSpec& g = ex_.program().gradients.at(index);
  ex_.zero(g.offset, g.bytes);
}

void CpuEngine::inspect_each_kernel(std::function<void(int kernel, const char* output)> inspect) {
  ex_.after_kernel = [this, inspect = std::move(inspect)](int i) {
    inspect(i, ex_.arena() + ex_.program().kernels[i].out_offset);
  };
}

}  // namespace napkin::runtime
