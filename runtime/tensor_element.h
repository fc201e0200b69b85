// One element of a tensor in host memory, by its dtype name as the program
// writes it: what init, the NaN watch and the tests read and write.
#pragma once

#include <cstdint>
#include <string>

namespace napkin::runtime {

// Reads element i of a tensor of `dtype` at `p` as double (f64, f32, bf16,
// f16, f8e4m3, f8e5m2, i32, i64, bool); writes likewise, rounding to nearest
// even (through float32: exact for the narrow formats only from f32 values).
double read_element(const char* p, const std::string& dtype, int64_t i);
void write_element(char* p, const std::string& dtype, int64_t i, double v);
// Bytes per element of those dtypes; Error for another.
int64_t element_bytes(const std::string& dtype);

}  // namespace napkin::runtime
