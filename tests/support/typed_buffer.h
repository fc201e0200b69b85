// A host buffer of one runtime element type (f64, f32, bf16, f16), read and
// written as double: the runtime kernels' tests fill their operands and read
// their results through it.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "runtime/float_formats.h"
#include "runtime/gemm.h"

namespace napkin::testing {

struct TypedBuffer {
  runtime::GemmType type;
  std::vector<unsigned char> bytes;
  TypedBuffer(runtime::GemmType t, size_t n) : type(t), bytes(n * runtime::gemm_type_bytes(t)) {}
  void* data() { return bytes.data(); }
  size_t size() const { return bytes.size() / runtime::gemm_type_bytes(type); }
  double get(size_t i) const {
    using runtime::GemmType;
    switch (type) {
      case GemmType::F64: { double x; std::memcpy(&x, &bytes[i * 8], 8); return x; }
      case GemmType::F32: { float x; std::memcpy(&x, &bytes[i * 4], 4); return x; }
      case GemmType::BF16: { uint16_t x; std::memcpy(&x, &bytes[i * 2], 2); return runtime::bf16_bits_to_float(x); }
      case GemmType::F16: { uint16_t x; std::memcpy(&x, &bytes[i * 2], 2); return runtime::f16_bits_to_float(x); }
    }
    return 0;
  }
  // Stores x rounded to the type (nearest even) and returns the stored value.
  double set(size_t i, double x) {
    using runtime::GemmType;
    switch (type) {
      case GemmType::F64: std::memcpy(&bytes[i * 8], &x, 8); break;
      case GemmType::F32: { float f = float(x); std::memcpy(&bytes[i * 4], &f, 4); break; }
      case GemmType::BF16: { uint16_t h = runtime::float_to_bf16_bits(float(x)); std::memcpy(&bytes[i * 2], &h, 2); break; }
      case GemmType::F16: { uint16_t h = runtime::float_to_f16_bits(float(x)); std::memcpy(&bytes[i * 2], &h, 2); break; }
    }
    return get(i);
  }
};

}  // namespace napkin::testing
