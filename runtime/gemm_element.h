// One element of a tensor whose element type is a GemmType (runtime/gemm.h),
// for the kernels that work element by element (the classifier's row math,
// cached attention): widened exactly to the arithmetic type A, and rounded
// back to nearest even on store.
#pragma once

#include <cstdint>

#include "runtime/float_formats.h"
#include "runtime/gemm.h"

namespace napkin::runtime {

template <class A>
A load_element(GemmType t, const void* p, int64_t i) {
  switch (t) {
    case GemmType::F32: return static_cast<A>(static_cast<const float*>(p)[i]);
    case GemmType::F64: return static_cast<A>(static_cast<const double*>(p)[i]);
    case GemmType::BF16: return static_cast<A>(bf16_bits_to_float(static_cast<const uint16_t*>(p)[i]));
    case GemmType::F16: return static_cast<A>(f16_bits_to_float(static_cast<const uint16_t*>(p)[i]));
  }
  return 0;
}

template <class A>
void store_element(GemmType t, void* p, int64_t i, A v) {
  switch (t) {
    case GemmType::F32: static_cast<float*>(p)[i] = static_cast<float>(v); return;
    case GemmType::F64: static_cast<double*>(p)[i] = static_cast<double>(v); return;
    case GemmType::BF16: static_cast<uint16_t*>(p)[i] = float_to_bf16_bits(static_cast<float>(v)); return;
    case GemmType::F16: static_cast<uint16_t*>(p)[i] = float_to_f16_bits(static_cast<float>(v)); return;
  }
}

}  // namespace napkin::runtime
