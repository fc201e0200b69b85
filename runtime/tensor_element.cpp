#include "runtime/tensor_element.h"

#include "runtime/error.h"
#include "runtime/float_formats.h"

namespace napkin::runtime {

double read_element(const char* p, const std::string& dtype, int64_t i) {
  if (dtype == "f32") return reinterpret_cast<const float*>(p)[i];
  if (dtype == "f64") return reinterpret_cast<const double*>(p)[i];
  if (dtype == "bf16") return bf16_bits_to_float(reinterpret_cast<const uint16_t*>(p)[i]);
  if (dtype == "f16") return f16_bits_to_float(reinterpret_cast<const uint16_t*>(p)[i]);
  if (dtype == "f8e4m3") return f8e4m3_bits_to_float(reinterpret_cast<const uint8_t*>(p)[i]);
  if (dtype == "f8e5m2") return f8e5m2_bits_to_float(reinterpret_cast<const uint8_t*>(p)[i]);
  if (dtype == "i32") return reinterpret_cast<const int32_t*>(p)[i];
  if (dtype == "i64") return static_cast<double>(reinterpret_cast<const int64_t*>(p)[i]);
  if (dtype == "bool") return p[i] != 0;
  throw Error("cannot read a " + dtype + " element");
}

void write_element(char* p, const std::string& dtype, int64_t i, double v) {
  if (dtype == "f32") reinterpret_cast<float*>(p)[i] = static_cast<float>(v);
  else if (dtype == "f64") reinterpret_cast<double*>(p)[i] = v;
  else if (dtype == "bf16") reinterpret_cast<uint16_t*>(p)[i] = float_to_bf16_bits(static_cast<float>(v));
  else if (dtype == "f16") reinterpret_cast<uint16_t*>(p)[i] = float_to_f16_bits(static_cast<float>(v));
  else if (dtype == "f8e4m3") reinterpret_cast<uint8_t*>(p)[i] = float_to_f8e4m3_bits(static_cast<float>(v));
  else if (dtype == "f8e5m2") reinterpret_cast<uint8_t*>(p)[i] = float_to_f8e5m2_bits(static_cast<float>(v));
  else if (dtype == "i32") reinterpret_cast<int32_t*>(p)[i] = static_cast<int32_t>(v);
  else if (dtype == "i64") reinterpret_cast<int64_t*>(p)[i] = static_cast<int64_t>(v);
  else if (dtype == "bool") p[i] = v != 0;
  else throw Error("cannot write a " + dtype + " element");
}

int64_t element_bytes(const std::string& dtype) {
  if (dtype == "f64" || dtype == "i64") return 8;
  if (dtype == "f32" || dtype == "i32") return 4;
  if (dtype == "bf16" || dtype == "f16") return 2;
  if (dtype == "f8e4m3" || dtype == "f8e5m2" || dtype == "bool") return 1;
  throw Error("unknown dtype " + dtype);
}

}  // namespace napkin::runtime
