#include "ir/dtype.h"

#include <doctest/doctest.h>

#include <cfloat>
#include <string>

#include "ir/internal_check.h"

using napkin::ir::DType;
using napkin::ir::float_info;

TEST_CASE("dtype sizes and canonical names") {
  CHECK(napkin::ir::dtype_size(DType::F64) == 8);
  CHECK(napkin::ir::dtype_size(DType::F32) == 4);
  CHECK(napkin::ir::dtype_size(DType::F16) == 2);
  CHECK(napkin::ir::dtype_size(DType::BF16) == 2);
  CHECK(napkin::ir::dtype_size(DType::F8E4M3) == 1);
  CHECK(napkin::ir::dtype_size(DType::F8E5M2) == 1);
  CHECK(napkin::ir::dtype_size(DType::I32) == 4);
  CHECK(napkin::ir::dtype_size(DType::I64) == 8);
  CHECK(napkin::ir::dtype_size(DType::Bool) == 1);
  CHECK(napkin::ir::dtype_name(DType::BF16) == "bf16");
  CHECK(napkin::ir::dtype_name(DType::F8E4M3) == "f8e4m3");
}

TEST_CASE("every canonical name parses back to its dtype") {
  for (DType t : napkin::ir::kAllDTypes) {
    CAPTURE(napkin::ir::dtype_name(t));
    CHECK(napkin::ir::parse_dtype(napkin::ir::dtype_name(t)) == t);
    CHECK(napkin::ir::dtype_names_list().find(napkin::ir::dtype_name(t)) != std::string::npos);
  }
}

TEST_CASE("aliases parse, case-insensitively - unknown names do not") {
  CHECK(napkin::ir::parse_dtype("float32") == DType::F32);
  CHECK(napkin::ir::parse_dtype("FP32") == DType::F32);
  CHECK(napkin::ir::parse_dtype("half") == DType::F16);
  CHECK(napkin::ir::parse_dtype("bfloat16") == DType::BF16);
  CHECK(napkin::ir::parse_dtype("float8_e4m3fn") == DType::F8E4M3);
  CHECK(napkin::ir::parse_dtype("fp8_e5m2") == DType::F8E5M2);
  CHECK(napkin::ir::parse_dtype("int64") == DType::I64);
  CHECK_FALSE(napkin::ir::parse_dtype("f12").has_value());
  CHECK_FALSE(napkin::ir::parse_dtype("").has_value());
  CHECK(napkin::ir::dtype_names_list().find("bfloat16") != std::string::npos);
}

TEST_CASE("is_floating / is_integer") {
  CHECK(napkin::ir::is_floating(DType::F8E5M2));
  CHECK_FALSE(napkin::ir::is_floating(DType::I32));
  CHECK_FALSE(napkin::ir::is_floating(DType::Bool));
  CHECK(napkin::ir::is_integer(DType::I64));
  CHECK_FALSE(napkin::ir::is_integer(DType::Bool));
  CHECK_FALSE(napkin::ir::is_integer(DType::F32));
}

// The values torch.finfo prints in CS336 lecture 2 (6 significant digits).
TEST_CASE("finfo matches the lecture's torch.finfo output") {
  const auto approx = [](double v) { return doctest::Approx(v).epsilon(1e-5); };
  const auto f32 = float_info(DType::F32);
  CHECK(f32.eps == approx(1.19209e-07));
  CHECK(f32.max == approx(3.40282e+38));
  const auto f16 = float_info(DType::F16);
  CHECK(f16.eps == approx(0.000976562));
  CHECK(f16.max == 65504);
  CHECK(f16.smallest_normal == approx(6.10352e-05));
  const auto bf16 = float_info(DType::BF16);
  CHECK(bf16.eps == 0.0078125);
  CHECK(bf16.max == approx(3.38953e+38));
}

TEST_CASE("finfo of f32 and f64 equals the C++ limits exactly") {
  const auto f32 = float_info(DType::F32);
  CHECK(f32.eps == FLT_EPSILON);
  CHECK(f32.max == FLT_MAX);
  CHECK(f32.smallest_normal == FLT_MIN);
  CHECK(f32.smallest_subnormal == FLT_TRUE_MIN);
  const auto f64 = float_info(DType::F64);
  CHECK(f64.bits == 64);
  CHECK(f64.eps == DBL_EPSILON);
  CHECK(f64.max == DBL_MAX);
  CHECK(f64.smallest_normal == DBL_MIN);
  CHECK(f64.smallest_subnormal == DBL_TRUE_MIN);
}

// OCP 8-bit floating point spec, table 1.
TEST_CASE("fp8 finfo follows the OCP spec") {
  const auto e4m3 = float_info(DType::F8E4M3);
  CHECK(e4m3.bits == 8);
  CHECK(e4m3.exponent_bits == 4);
  CHECK(e4m3.mantissa_bits == 3);
  CHECK(e4m3.max == 448);
  CHECK(e4m3.eps == 0.125);
  CHECK(e4m3.smallest_normal == 0.015625);     // 2^-6
  CHECK(e4m3.smallest_subnormal == 0.001953125);  // 2^-9
  CHECK_FALSE(e4m3.has_infinity);
  const auto e5m2 = float_info(DType::F8E5M2);
  CHECK(e5m2.max == 57344);
  CHECK(e5m2.eps == 0.25);
  CHECK(e5m2.smallest_normal == 0.00006103515625);       // 2^-14
  CHECK(e5m2.smallest_subnormal == 0.0000152587890625);  // 2^-16
  CHECK(e5m2.has_infinity);
}

TEST_CASE("float_info of a non-floating dtype is an internal error") {
  CHECK_THROWS_AS(float_info(DType::I32), napkin::ir::InternalError);
  CHECK_THROWS_AS(float_info(DType::Bool), napkin::ir::InternalError);
}
