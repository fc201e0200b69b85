// The element types of runtime/gemm.h by name and size. In a file of their
// own, without oneDNN: the CUDA runtime reads them too, and a CUDA trainer
// must not need oneDNN to load (tests/e2e/cuda_build_test.cpp).
#include <string>

#include "runtime/error.h"
#include "runtime/gemm.h"

namespace napkin::runtime {

GemmType gemm_type(DType dtype) {
  if (dtype == DType::F32) return GemmType::F32;
  if (dtype == DType::F64) return GemmType::F64;
  if (dtype == DType::BF16) return GemmType::BF16;
  if (dtype == DType::F16) return GemmType::F16;
  throw Error("no CPU matmul for " + std::string(dtype_name(dtype)) + " operands");
}

size_t gemm_type_bytes(GemmType t) {
  switch (t) {
    case GemmType::F64: return 8;
    case GemmType::F32: return 4;
    case GemmType::BF16:
    case GemmType::F16: return 2;
  }
  return 0;
}

const char* gemm_type_name(GemmType t) {
  switch (t) {
    case GemmType::F32: return "f32";
    case GemmType::F64: return "f64";
    case GemmType::BF16: return "bf16";
    case GemmType::F16: return "f16";
  }
  return "?";
}

}  // namespace napkin::runtime
