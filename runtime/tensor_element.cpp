#include "runtime/tensor_element.h"

#include "runtime/float_formats.h"

namespace napkin::runtime {

double read_element(const char* p, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::F32: return reinterpret_cast<const float*>(p)[i];
    case DType::F64: return reinterpret_cast<const double*>(p)[i];
    case DType::BF16: return bf16_bits_to_float(reinterpret_cast<const uint16_t*>(p)[i]);
    case DType::F16: return f16_bits_to_float(reinterpret_cast<const uint16_t*>(p)[i]);
    case DType::F8E4M3: return f8e4m3_bits_to_float(reinterpret_cast<const uint8_t*>(p)[i]);
    case DType::F8E5M2: return f8e5m2_bits_to_float(reinterpret_cast<const uint8_t*>(p)[i]);
    case DType::I32: return reinterpret_cast<const int32_t*>(p)[i];
    case DType::I64: return static_cast<double>(reinterpret_cast<const int64_t*>(p)[i]);
    case DType::Bool: return p[i] != 0;
    case DType::U8: return reinterpret_cast<const uint8_t*>(p)[i];
    case DType::U16: return reinterpret_cast<const uint16_t*>(p)[i];
    case DType::U32: return reinterpret_cast<const uint32_t*>(p)[i];
  }
  return 0;
}

void write_element(char* p, DType dtype, int64_t i, double v) {
  switch (dtype) {
    case DType::F32: reinterpret_cast<float*>(p)[i] = static_cast<float>(v); return;
    case DType::F64: reinterpret_cast<double*>(p)[i] = v; return;
    case DType::BF16: reinterpret_cast<uint16_t*>(p)[i] = float_to_bf16_bits(static_cast<float>(v)); return;
    case DType::F16: reinterpret_cast<uint16_t*>(p)[i] = float_to_f16_bits(static_cast<float>(v)); return;
    case DType::F8E4M3: reinterpret_cast<uint8_t*>(p)[i] = float_to_f8e4m3_bits(static_cast<float>(v)); return;
    case DType::F8E5M2: reinterpret_cast<uint8_t*>(p)[i] = float_to_f8e5m2_bits(static_cast<float>(v)); return;
    case DType::I32: reinterpret_cast<int32_t*>(p)[i] = static_cast<int32_t>(v); return;
    case DType::I64: reinterpret_cast<int64_t*>(p)[i] = static_cast<int64_t>(v); return;
    case DType::Bool: p[i] = v != 0; return;
    case DType::U8: reinterpret_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(v); return;
    case DType::U16: reinterpret_cast<uint16_t*>(p)[i] = static_cast<uint16_t>(v); return;
    case DType::U32: reinterpret_cast<uint32_t*>(p)[i] = static_cast<uint32_t>(v); return;
  }
}

}  // namespace napkin::runtime
