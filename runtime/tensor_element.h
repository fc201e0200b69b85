// One element of a tensor in host memory, by its dtype: what init, the NaN
// watch and the tests read and write.
#pragma once

#include <cstdint>

#include "runtime/tensor_types.h"

namespace napkin::runtime {

// Reads element i of a tensor of `dtype` at `p` as double; writes likewise,
// rounding to nearest even (through float32: exact for the narrow formats
// only from f32 values).
double read_element(const char* p, DType dtype, int64_t i);
void write_element(char* p, DType dtype, int64_t i, double v);

}  // namespace napkin::runtime
