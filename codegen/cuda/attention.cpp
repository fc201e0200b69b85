// Fused attention as CUDA C (ir/loop.h's AttentionParams).
#include "codegen/cuda/emit.h"
#include "ir/internal_check.h"

namespace napkin::codegen::cuda::detail {

EmittedKernel emit_attention(const Kernel& k) {
  NAPKIN_INTERNAL_CHECK(false, "CUDA attention ({}) is not emitted yet", k.name);
  return {};
}

}  // namespace napkin::codegen::cuda::detail
