#include "runtime/float_formats.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "ir/dtype.h"

namespace rt = napkin::runtime;
using napkin::ir::DType;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

float from_bits(uint32_t bits) { return std::bit_cast<float>(bits); }

// One narrow format seen through its conversions, so the checks below run on all four.
struct Format {
  std::string name;
  DType dtype;
  uint32_t codes;  // 2^bits
  std::function<uint32_t(float)> encode;
  std::function<float(uint32_t)> decode;
};

std::vector<Format> formats() {
  return {
      {"bf16", DType::BF16, 1u << 16, rt::float_to_bf16_bits,
       [](uint32_t c) { return rt::bf16_bits_to_float(uint16_t(c)); }},
      {"f16", DType::F16, 1u << 16, rt::float_to_f16_bits,
       [](uint32_t c) { return rt::f16_bits_to_float(uint16_t(c)); }},
      {"f8e4m3", DType::F8E4M3, 256, [](float x) { return rt::float_to_f8e4m3_bits(x); },
       [](uint32_t c) { return rt::f8e4m3_bits_to_float(uint8_t(c)); }},
      {"f8e5m2", DType::F8E5M2, 256, [](float x) { return rt::float_to_f8e5m2_bits(x); },
       [](uint32_t c) { return rt::f8e5m2_bits_to_float(uint8_t(c)); }},
  };
}

// The non-negative finite values of a format with their codes, ascending.
std::vector<std::pair<float, uint32_t>> positive_values(const Format& f) {
  std::vector<std::pair<float, uint32_t>> out;
  for (uint32_t c = 0; c < f.codes / 2; ++c)
    if (std::isfinite(f.decode(c))) out.emplace_back(f.decode(c), c);
  return out;
}

// Independent oracle: the nearest value by search, ties to the even code.
float nearest(const std::vector<std::pair<float, uint32_t>>& values, float x) {
  const float a = std::fabs(x);
  auto hi = std::lower_bound(values.begin(), values.end(), a,
                             [](const auto& v, float y) { return v.first < y; });
  if (hi->first == a || hi == values.begin()) return std::copysign(hi->first, x);
  auto lo = hi - 1;
  const double below = double(a) - lo->first, above = double(hi->first) - a;
  const bool take_hi = above < below || (above == below && hi->second % 2 == 0);
  return std::copysign(take_hi ? hi->first : lo->first, x);
}

}  // namespace

// CS336 lecture 2: fp16 underflows 1e-8 to zero; bf16 has fp32's range and keeps it.
TEST_CASE("1e-8 vanishes in fp16 but not in bf16") {
  CHECK(rt::round_to_f16(1e-8f) == 0.0f);
  CHECK(rt::round_to_bf16(1e-8f) == doctest::Approx(1e-8).epsilon(0.004));
  CHECK(rt::round_to_bf16(1e-8f) == from_bits(0x322C0000));  // torch: 1.0011717677116394e-08
}

TEST_CASE("ties round to the even neighbour") {
  // Halfway between 1 and 1 + eps goes down to 1; halfway above 1 + eps goes up.
  CHECK(rt::round_to_bf16(1.0f + 0x1p-8f) == 1.0f);
  CHECK(rt::round_to_bf16(1.0f + 3 * 0x1p-8f) == 1.0f + 0x1p-6f);
  CHECK(rt::round_to_bf16(std::nextafter(1.0f + 0x1p-8f, 2.0f)) == 1.0f + 0x1p-7f);
  CHECK(rt::round_to_f16(1.0f + 0x1p-11f) == 1.0f);
  CHECK(rt::round_to_f16(1.0f + 3 * 0x1p-11f) == 1.0f + 0x1p-9f);
  CHECK(rt::round_to_f8e4m3(1.0f + 0x1p-4f) == 1.0f);
  CHECK(rt::round_to_f8e4m3(1.0f + 3 * 0x1p-4f) == 1.25f);
  CHECK(rt::round_to_f8e5m2(1.0f + 0x1p-3f) == 1.0f);
  CHECK(rt::round_to_f8e5m2(-(1.0f + 3 * 0x1p-3f)) == -1.5f);
  // In the subnormal range too: 2^-25 is halfway between 0 and fp16's smallest 2^-24.
  CHECK(rt::round_to_f16(0x1p-25f) == 0.0f);
  CHECK(rt::round_to_f16(3 * 0x1p-25f) == 0x1p-23f);
  CHECK(rt::round_to_f16(std::nextafter(0x1p-25f, 1.0f)) == 0x1p-24f);
  // A subnormal that rounds up becomes the smallest normal.
  CHECK(rt::round_to_f16(0x1p-14f - 0x1p-26f) == 0x1p-14f);
  CHECK(rt::round_to_f8e4m3(0x1p-10f) == 0.0f);  // half of 2^-9, even -> 0
  CHECK(rt::round_to_f8e4m3(0x1p-9f) == 0x1p-9f);
}

TEST_CASE("overflow: inf for bf16, f16, e5m2 - NaN for e4m3 unless saturating") {
  CHECK(rt::round_to_f16(65504.0f) == 65504.0f);
  CHECK(rt::round_to_f16(65519.0f) == 65504.0f);
  CHECK(rt::round_to_f16(65520.0f) == kInf);  // the tie with 65536 goes to even: inf
  CHECK(rt::round_to_f16(-1e10f) == -kInf);
  CHECK(rt::round_to_bf16(std::numeric_limits<float>::max()) == kInf);
  CHECK(rt::round_to_bf16(-kInf) == -kInf);

  CHECK(rt::round_to_f8e4m3(464.0f) == 448.0f);  // tie: 448's mantissa 110 is even
  CHECK(std::isnan(rt::round_to_f8e4m3(465.0f)));
  CHECK(rt::float_to_f8e4m3_bits(-1000.0f) == 0xFF);
  CHECK(std::isnan(rt::round_to_f8e4m3(kInf)));
  CHECK(rt::round_to_f8e4m3(465.0f, true) == 448.0f);
  CHECK(rt::round_to_f8e4m3(-kInf, true) == -448.0f);

  CHECK(rt::round_to_f8e5m2(61439.0f) == 57344.0f);
  CHECK(rt::round_to_f8e5m2(61440.0f) == kInf);
  CHECK(rt::round_to_f8e5m2(-kInf) == -kInf);
  CHECK(rt::round_to_f8e5m2(1e6f, true) == 57344.0f);
  CHECK(rt::round_to_f8e5m2(-kInf, true) == -57344.0f);
  CHECK(rt::round_to_f8e5m2(100.0f, true) == 96.0f);  // saturation leaves finite values alone
}

TEST_CASE("NaN stays NaN with its sign - zero keeps its sign") {
  CHECK(rt::float_to_bf16_bits(kNaN) == 0x7FC0);
  CHECK(rt::float_to_bf16_bits(-kNaN) == 0xFFC0);
  CHECK(rt::float_to_f16_bits(kNaN) == 0x7E00);
  CHECK(rt::float_to_f16_bits(from_bits(0xFF800001)) == 0xFE00);  // signalling -> quiet
  CHECK(rt::float_to_f8e4m3_bits(kNaN) == 0x7F);
  CHECK(rt::float_to_f8e4m3_bits(-kNaN, true) == 0xFF);
  CHECK(rt::float_to_f8e5m2_bits(kNaN, true) == 0x7F);
  CHECK(std::isnan(rt::round_to_f16(from_bits(0x7FA5A5A5))));
  CHECK(rt::float_to_bf16_bits(-0.0f) == 0x8000);
  CHECK(rt::float_to_f16_bits(-0.0f) == 0x8000);
  CHECK(rt::float_to_f8e4m3_bits(-0.0f) == 0x80);
  CHECK(rt::float_to_f8e5m2_bits(-1e-30f) == 0x80);  // underflow keeps the sign
}

TEST_CASE("every bit pattern survives narrow -> float32 -> narrow") {
  for (const Format& f : formats()) {
    CAPTURE(f.name);
    int mismatches = 0;
    for (uint32_t code = 0; code < f.codes; ++code) {
      const float x = f.decode(code);
      const bool ok = std::isnan(x) ? std::isnan(f.decode(f.encode(x))) : f.encode(x) == code;
      mismatches += !ok;
    }
    CHECK(mismatches == 0);
  }
}

TEST_CASE("decoded values are ordered by code, and agree with float_info") {
  for (const Format& f : formats()) {
    CAPTURE(f.name);
    const auto values = positive_values(f);
    CHECK(std::adjacent_find(values.begin(), values.end(), [](const auto& a, const auto& b) {
            return !(a.first < b.first);
          }) == values.end());
    const auto info = napkin::ir::float_info(f.dtype);
    CHECK(values.back().first == info.max);
    CHECK(values[1].first == info.smallest_subnormal);
    CHECK(values[std::size_t(1) << info.mantissa_bits].first == info.smallest_normal);
    CHECK(std::isinf(f.decode(f.encode(kInf))) == info.has_infinity);
  }
}

// Random floats in each format's range against the search oracle above.
TEST_CASE("rounding matches the nearest representable value, ties to even") {
  std::mt19937 rng(20261121);
  for (const Format& f : formats()) {
    CAPTURE(f.name);
    const auto values = positive_values(f);
    const auto info = napkin::ir::float_info(f.dtype);
    const int lowest = std::ilogb(info.smallest_subnormal) - 2;
    const int highest = std::ilogb(info.max);
    std::uniform_int_distribution<int> exponent(std::max(lowest, -149), highest);
    std::uniform_int_distribution<size_t> index(0, values.size() - 2);
    int mismatches = 0;
    float first_bad = 0;
    for (int i = 0; i < 200000; ++i) {
      float x = std::ldexp(1.0f + float(rng() & 0x7FFFFF) * 0x1p-23f, exponent(rng));
      // Every fourth sample is a midpoint between neighbours, where ties are decided.
      if (i % 4 == 1) {
        const size_t k = index(rng);
        x = float((double(values[k].first) + values[k + 1].first) / 2);  // exact
      }
      if (i % 2) x = -x;
      if (std::fabs(x) > info.max) continue;
      if (f.decode(f.encode(x)) != nearest(values, x) && mismatches++ == 0) first_bad = x;
    }
    CAPTURE(first_bad);
    CHECK(mismatches == 0);
  }
}

// torch 1.13.1 (Debian's python3-torch, CPU) on 300 float32 values: edge cases
// (ties near 1, fp16/bf16 max and overflow, subnormal boundaries, 1e-8, +-0, +-inf),
// 120 random bit patterns and 150 randoms with exponents in fp16's range (seed
// 20261121). Made by converting with x.to(torch.bfloat16) and x.to(torch.float16),
// reading the bits through .view(torch.int16), and checking the one-element (scalar)
// path agreed with the vectorized one. NaNs are left out: torch's NaN bits differ
// between its own code paths (see float_formats.h).
namespace {
struct TorchCase {
  uint32_t f32;
  uint16_t bf16;
  uint16_t f16;
};
constexpr TorchCase kTorchCases[] = {
    {0x3F808000u, 0x3F80, 0x3C04},
    {0x3F818000u, 0x3F82, 0x3C0C},
    {0x3F800FFFu, 0x3F80, 0x3C00},
    {0x3F801000u, 0x3F80, 0x3C00},
    {0x3F803000u, 0x3F80, 0x3C02},
    {0x3F802000u, 0x3F80, 0x3C01},
    {0x477FE000u, 0x4780, 0x7BFF},
    {0x477FEFFFu, 0x4780, 0x7BFF},
    {0x477FF000u, 0x4780, 0x7C00},
    {0x477FFFFFu, 0x4780, 0x7C00},
    {0x47800000u, 0x4780, 0x7C00},
    {0x7F7F7FFFu, 0x7F7F, 0x7C00},
    {0x7F7F8000u, 0x7F80, 0x7C00},
    {0x7F7FFFFFu, 0x7F80, 0x7C00},
    {0x38800000u, 0x3880, 0x0400},
    {0x387FE000u, 0x3880, 0x0400},
    {0x33800000u, 0x3380, 0x0001},
    {0x33000000u, 0x3300, 0x0000},
    {0x33000001u, 0x3300, 0x0001},
    {0x33C00000u, 0x33C0, 0x0002},
    {0x32FFFFFFu, 0x3300, 0x0000},
    {0x00000001u, 0x0000, 0x0000},
    {0x00008000u, 0x0000, 0x0000},
    {0x00018000u, 0x0002, 0x0000},
    {0x007FFFFFu, 0x0080, 0x0000},
    {0x00800000u, 0x0080, 0x0000},
    {0x322BCC77u, 0x322C, 0x0000},
    {0x80000000u, 0x8000, 0x8000},
    {0x00000000u, 0x0000, 0x0000},
    {0x7F800000u, 0x7F80, 0x7C00},
    {0xFF800000u, 0xFF80, 0xFC00},
    {0xF0480FF9u, 0xF048, 0xFC00},
    {0x86DC283Cu, 0x86DC, 0x8000},
    {0x2CB6916Du, 0x2CB7, 0x0000},
    {0x47EAA099u, 0x47EB, 0x7C00},
    {0x593942A4u, 0x5939, 0x7C00},
    {0xCA118783u, 0xCA12, 0xFC00},
    {0x9BF13331u, 0x9BF1, 0x8000},
    {0x1509BB0Au, 0x150A, 0x0000},
    {0x56670B14u, 0x5667, 0x7C00},
    {0x12E1BC76u, 0x12E2, 0x0000},
    {0x01088475u, 0x0109, 0x0000},
    {0xF5EC52EDu, 0xF5EC, 0xFC00},
    {0x2E416788u, 0x2E41, 0x0000},
    {0x2909406Cu, 0x2909, 0x0000},
    {0x5C906158u, 0x5C90, 0x7C00},
    {0x59BA1B0Du, 0x59BA, 0x7C00},
    {0x2BB29976u, 0x2BB3, 0x0000},
    {0x2A095EE8u, 0x2A09, 0x0000},
    {0x985FB4E7u, 0x9860, 0x8000},
    {0x5D32FE61u, 0x5D33, 0x7C00},
    {0x64C7A500u, 0x64C8, 0x7C00},
    {0x59E2D153u, 0x59E3, 0x7C00},
    {0x58151A99u, 0x5815, 0x7C00},
    {0x9A1E40B4u, 0x9A1E, 0x8000},
    {0xE693AE2Du, 0xE694, 0xFC00},
    {0x1D8A4EACu, 0x1D8A, 0x0000},
    {0x3EAABE17u, 0x3EAB, 0x3556},
    {0x68B4AEF7u, 0x68B5, 0x7C00},
    {0xEB04B39Bu, 0xEB05, 0xFC00},
    {0x13E783E7u, 0x13E8, 0x0000},
    {0x78068577u, 0x7807, 0x7C00},
    {0x142C8364u, 0x142D, 0x0000},
    {0x53FE2E85u, 0x53FE, 0x7C00},
    {0x260DF254u, 0x260E, 0x0000},
    {0x178854F2u, 0x1788, 0x0000},
    {0x3B041641u, 0x3B04, 0x1821},
    {0xADD9CA88u, 0xADDA, 0x8000},
    {0x35C719C2u, 0x35C7, 0x0019},
    {0x5ED8ABCCu, 0x5ED9, 0x7C00},
    {0x00A154D8u, 0x00A1, 0x0000},
    {0xE8E3574Fu, 0xE8E3, 0xFC00},
    {0x59EC8712u, 0x59ED, 0x7C00},
    {0x855DBF55u, 0x855E, 0x8000},
    {0xC0290103u, 0xC029, 0xC148},
    {0xDCB0B82Eu, 0xDCB1, 0xFC00},
    {0xE7949B80u, 0xE795, 0xFC00},
    {0xA4FF91E3u, 0xA500, 0x8000},
    {0x6E704245u, 0x6E70, 0x7C00},
    {0x06762832u, 0x0676, 0x0000},
    {0x37A788D1u, 0x37A8, 0x014F},
    {0x320A88EAu, 0x320B, 0x0000},
    {0xDE1B1471u, 0xDE1B, 0xFC00},
    {0x9DDBEF12u, 0x9DDC, 0x8000},
    {0x2CD552A0u, 0x2CD5, 0x0000},
    {0x21E52F21u, 0x21E5, 0x0000},
    {0x4350CC17u, 0x4351, 0x5A86},
    {0x9EC04ECEu, 0x9EC0, 0x8000},
    {0xB600E612u, 0xB601, 0x8020},
    {0xD6846325u, 0xD684, 0xFC00},
    {0x9ED89EDDu, 0x9ED9, 0x8000},
    {0x5EE347DDu, 0x5EE3, 0x7C00},
    {0xE34ACB11u, 0xE34B, 0xFC00},
    {0x5FAC9CB6u, 0x5FAD, 0x7C00},
    {0x627BF322u, 0x627C, 0x7C00},
    {0x6F2C7A8Cu, 0x6F2C, 0x7C00},
    {0xEE889FE4u, 0xEE89, 0xFC00},
    {0x9545F0F3u, 0x9546, 0x8000},
    {0xA930D55Du, 0xA931, 0x8000},
    {0xE339D309u, 0xE33A, 0xFC00},
    {0x75927B0Fu, 0x7592, 0x7C00},
    {0x6E85DF08u, 0x6E86, 0x7C00},
    {0x43F2F193u, 0x43F3, 0x5F98},
    {0x84E0164Bu, 0x84E0, 0x8000},
    {0x050C86BDu, 0x050D, 0x0000},
    {0x381DF22Fu, 0x381E, 0x0278},
    {0x990D3CD8u, 0x990D, 0x8000},
    {0xB0CDF20Au, 0xB0CE, 0x8000},
    {0xFCC1C0C8u, 0xFCC2, 0xFC00},
    {0x3E7FB97Bu, 0x3E80, 0x33FE},
    {0xE07CB579u, 0xE07D, 0xFC00},
    {0x77CA4499u, 0x77CA, 0x7C00},
    {0xB5C34E7Eu, 0xB5C3, 0x8018},
    {0x86EA0214u, 0x86EA, 0x8000},
    {0x78F6D824u, 0x78F7, 0x7C00},
    {0x655C1D15u, 0x655C, 0x7C00},
    {0x7B7E8913u, 0x7B7F, 0x7C00},
    {0x761E07CBu, 0x761E, 0x7C00},
    {0x1DCD327Fu, 0x1DCD, 0x0000},
    {0xDBC52933u, 0xDBC5, 0xFC00},
    {0xA92FA271u, 0xA930, 0x8000},
    {0x9672BE1Au, 0x9673, 0x8000},
    {0xBDBCDA98u, 0xBDBD, 0xADE7},
    {0x5CBE4F50u, 0x5CBE, 0x7C00},
    {0xCF25E346u, 0xCF26, 0xFC00},
    {0xC44A66F4u, 0xC44A, 0xE253},
    {0xB18FBDB1u, 0xB190, 0x8000},
    {0x134B8DB4u, 0x134C, 0x0000},
    {0x6470FF1Fu, 0x6471, 0x7C00},
    {0x1E2ED6CBu, 0x1E2F, 0x0000},
    {0x761978DDu, 0x7619, 0x7C00},
    {0x57E485B6u, 0x57E5, 0x7C00},
    {0xFDF0A45Fu, 0xFDF1, 0xFC00},
    {0x4F859933u, 0x4F86, 0x7C00},
    {0xFD0B00EAu, 0xFD0B, 0xFC00},
    {0xD9855162u, 0xD985, 0xFC00},
    {0x18949A23u, 0x1895, 0x0000},
    {0x2E460A96u, 0x2E46, 0x0000},
    {0xF376BC25u, 0xF377, 0xFC00},
    {0x4EA9877Au, 0x4EAA, 0x7C00},
    {0xEC9A72F2u, 0xEC9A, 0xFC00},
    {0x310A853Eu, 0x310B, 0x0000},
    {0x43C20F56u, 0x43C2, 0x5E10},
    {0x01F72B0Au, 0x01F7, 0x0000},
    {0x93A9B8B6u, 0x93AA, 0x8000},
    {0x64E752CCu, 0x64E7, 0x7C00},
    {0x5FD11A32u, 0x5FD1, 0x7C00},
    {0x7A674D0Au, 0x7A67, 0x7C00},
    {0xCF00377Cu, 0xCF00, 0xFC00},
    {0xBBB3A32Au, 0xBBB4, 0x9D9D},
    {0x3C03E9D9u, 0x3C04, 0x201F},
    {0xC1D6BC1Bu, 0xC1D7, 0xCEB6},
    {0x43B4FD2Au, 0x43B5, 0x5DA8},
    {0xC65A51BDu, 0xC65A, 0xF2D3},
    {0x44426352u, 0x4442, 0x6213},
    {0xC84489E3u, 0xC845, 0xFC00},
    {0x429C5FC6u, 0x429C, 0x54E3},
    {0x4269C67Bu, 0x426A, 0x534E},
    {0x3DB0BCB5u, 0x3DB1, 0x2D86},
    {0x3C5F30EFu, 0x3C5F, 0x22FA},
    {0x455325C4u, 0x4553, 0x6A99},
    {0xB30535FCu, 0xB305, 0x8001},
    {0x4595D63Eu, 0x4596, 0x6CAF},
    {0xC6F7EF76u, 0xC6F8, 0xF7BF},
    {0xC14C07CAu, 0xC14C, 0xCA60},
    {0xC48E98C1u, 0xC48F, 0xE475},
    {0xC1BF093Du, 0xC1BF, 0xCDF8},
    {0xC5DB2260u, 0xC5DB, 0xEED9},
    {0x4856549Du, 0x4856, 0x7C00},
    {0x3C53E1AAu, 0x3C54, 0x229F},
    {0x3A89C972u, 0x3A8A, 0x144E},
    {0x33D98A07u, 0x33DA, 0x0002},
    {0xC387B2C9u, 0xC388, 0xDC3E},
    {0x38CE3227u, 0x38CE, 0x0672},
    {0x43059CDBu, 0x4306, 0x582D},
    {0x33B1BCF1u, 0x33B2, 0x0001},
    {0x39954342u, 0x3995, 0x0CAA},
    {0xC740F475u, 0xC741, 0xFA08},
    {0xC3951980u, 0xC395, 0xDCA9},
    {0xBC25D0B8u, 0xBC26, 0xA12F},
    {0x3B7CBDF8u, 0x3B7D, 0x1BE6},
    {0x4360A32Cu, 0x4361, 0x5B05},
    {0xC2E936A5u, 0xC2E9, 0xD74A},
    {0xB6474F82u, 0xB647, 0x8032},
    {0xC4F681BAu, 0xC4F7, 0xE7B4},
    {0xC1ED4321u, 0xC1ED, 0xCF6A},
    {0xBB2814A8u, 0xBB28, 0x9941},
    {0xB9396F7Du, 0xB939, 0x89CB},
    {0x436A8BEAu, 0x436B, 0x5B54},
    {0xB8D51132u, 0xB8D5, 0x86A9},
    {0x3AED2028u, 0x3AED, 0x1769},
    {0xB5CEF755u, 0xB5CF, 0x801A},
    {0x39C92438u, 0x39C9, 0x0E49},
    {0xB87E69C0u, 0xB87E, 0x83FA},
    {0xBA25E337u, 0xBA26, 0x912F},
    {0xB9A96A0Cu, 0xB9A9, 0x8D4B},
    {0x3B4C03C1u, 0x3B4C, 0x1A60},
    {0xBEAFD834u, 0xBEB0, 0xB57F},
    {0xB403BBB3u, 0xB404, 0x8002},
    {0xB69E9FDEu, 0xB69F, 0x804F},
    {0xC041E257u, 0xC042, 0xC20F},
    {0xBE4B0D91u, 0xBE4B, 0xB258},
    {0x46B13392u, 0x46B1, 0x758A},
    {0xB4E79333u, 0xB4E8, 0x8007},
    {0x3DD6BC2Du, 0x3DD7, 0x2EB6},
    {0x4420C4BCu, 0x4421, 0x6106},
    {0x3BCDCFD1u, 0x3BCE, 0x1E6E},
    {0xB571C35Bu, 0xB572, 0x800F},
    {0xC03BB169u, 0xC03C, 0xC1DE},
    {0x33BB5464u, 0x33BB, 0x0001},
    {0x45B65FA8u, 0x45B6, 0x6DB3},
    {0x362FAC87u, 0x3630, 0x002C},
    {0x3843C72Cu, 0x3844, 0x030F},
    {0xC667AA2Eu, 0xC668, 0xF33D},
    {0x41689606u, 0x4169, 0x4B45},
    {0x332F6B13u, 0x332F, 0x0001},
    {0xBA40A57Eu, 0xBA41, 0x9205},
    {0x437A3FB6u, 0x437A, 0x5BD2},
    {0x400D279Cu, 0x400D, 0x4069},
    {0x3CE695A0u, 0x3CE7, 0x2735},
    {0x47A557E7u, 0x47A5, 0x7C00},
    {0x472D97B1u, 0x472E, 0x796D},
    {0x43A1671Fu, 0x43A1, 0x5D0B},
    {0x3B9EFC18u, 0x3B9F, 0x1CF8},
    {0x4418C93Bu, 0x4419, 0x60C6},
    {0x46325E2Du, 0x4632, 0x7193},
    {0xBBBFD915u, 0xBBC0, 0x9DFF},
    {0xC56A8C8Au, 0xC56B, 0xEB54},
    {0x41B83490u, 0x41B8, 0x4DC2},
    {0xB872A1D9u, 0xB873, 0x83CB},
    {0x39FC7C4Fu, 0x39FC, 0x0FE4},
    {0x48263718u, 0x4826, 0x7C00},
    {0x396A5679u, 0x396A, 0x0B53},
    {0x3BC442DCu, 0x3BC4, 0x1E22},
    {0x3D5D4BB7u, 0x3D5D, 0x2AEA},
    {0x398F126Fu, 0x398F, 0x0C79},
    {0xB3446DDDu, 0xB344, 0x8001},
    {0xC12BF9DAu, 0xC12C, 0xC960},
    {0x42E7BD9Bu, 0x42E8, 0x573E},
    {0xBAD19FBAu, 0xBAD2, 0x968D},
    {0x43E5CE8Fu, 0x43E6, 0x5F2E},
    {0xBE884930u, 0xBE88, 0xB442},
    {0x4092AFD7u, 0x4093, 0x4495},
    {0x32921E41u, 0x3292, 0x0000},
    {0x358623C1u, 0x3586, 0x0011},
    {0xBCF34C06u, 0xBCF3, 0xA79A},
    {0x387CF1A7u, 0x387D, 0x03F4},
    {0x43ADEA22u, 0x43AE, 0x5D6F},
    {0x3A6B9E03u, 0x3A6C, 0x135D},
    {0xB4B51820u, 0xB4B5, 0x8006},
    {0x3B255399u, 0x3B25, 0x192B},
    {0x3A00FBFEu, 0x3A01, 0x1008},
    {0xBF9287E0u, 0xBF93, 0xBC94},
    {0x3CB4FD97u, 0x3CB5, 0x25A8},
    {0xC297E32Fu, 0xC298, 0xD4BF},
    {0x4187429Du, 0x4187, 0x4C3A},
    {0xC6F6C521u, 0xC6F7, 0xF7B6},
    {0x45D1A563u, 0x45D2, 0x6E8D},
    {0x442004E6u, 0x4420, 0x6100},
    {0xB7AA9C85u, 0xB7AB, 0x8155},
    {0x33E20765u, 0x33E2, 0x0002},
    {0x43A11419u, 0x43A1, 0x5D09},
    {0x345A4EE0u, 0x345A, 0x0003},
    {0xB84D6AC3u, 0xB84D, 0x8336},
    {0x36604675u, 0x3660, 0x0038},
    {0xBD4AEB87u, 0xBD4B, 0xAA57},
    {0x41738277u, 0x4174, 0x4B9C},
    {0xBC4ED43Du, 0xBC4F, 0xA277},
    {0x42EBBABFu, 0x42EC, 0x575E},
    {0x36C6DA5Fu, 0x36C7, 0x0063},
    {0x34279289u, 0x3428, 0x0003},
    {0x41B9F411u, 0x41BA, 0x4DD0},
    {0x3CB44004u, 0x3CB4, 0x25A2},
    {0xC6FCDD10u, 0xC6FD, 0xF7E7},
    {0x4800F3A0u, 0x4801, 0x7C00},
    {0x3284DFEEu, 0x3285, 0x0000},
    {0x3E31ECABu, 0x3E32, 0x318F},
    {0x401F3D30u, 0x401F, 0x40FA},
    {0xB295738Bu, 0xB295, 0x8000},
    {0xBE3396E1u, 0xBE34, 0xB19D},
    {0xB37B4A06u, 0xB37B, 0x8001},
    {0x3A78ED5Au, 0x3A79, 0x13C7},
    {0xC1F7B73Fu, 0xC1F8, 0xCFBE},
    {0xB98139B8u, 0xB981, 0x8C0A},
    {0x352103CFu, 0x3521, 0x000A},
    {0xC126EED4u, 0xC127, 0xC937},
    {0xB9C7B279u, 0xB9C8, 0x8E3E},
    {0xB4E980ACu, 0xB4EA, 0x8007},
    {0xC2132FAFu, 0xC213, 0xD099},
    {0x46081AB4u, 0x4608, 0x7041},
    {0x3661E6E2u, 0x3662, 0x0038},
    {0x3BDA333Bu, 0x3BDA, 0x1ED2},
    {0x42EE22E4u, 0x42EE, 0x5771},
    {0xBE541ED5u, 0xBE54, 0xB2A1},
    {0xB993C29Du, 0xB994, 0x8C9E},
    {0x4179BFCAu, 0x417A, 0x4BCE},
    {0x4022C3A1u, 0x4023, 0x4116},
    {0xC0E4ED9Bu, 0xC0E5, 0xC727},
    {0xC4027B13u, 0xC402, 0xE014},
    {0xC83B0CD7u, 0xC83B, 0xFC00},
};
}  // namespace

TEST_CASE("bf16 and f16 bits match torch 1.13") {
  for (const TorchCase& c : kTorchCases) {
    CAPTURE(c.f32);
    CHECK(rt::float_to_bf16_bits(from_bits(c.f32)) == c.bf16);
    CHECK(rt::float_to_f16_bits(from_bits(c.f32)) == c.f16);
  }
}

TEST_CASE("float_to_bf16_bits_inline gives float_to_bf16_bits' bits: ties, overflow, NaN, subnormals, random") {
  std::vector<uint32_t> bits = {0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00001, 0x7F800001,
                                0x00000001, 0x00008000, 0x00018000, 0x3F808000, 0x3F818000, 0x3F807FFF, 0x3F808001,
                                0x7F7FFFFF, 0x7F7F8000, 0xFF7F8000, 0x7F7F7FFF};
  std::mt19937 rng(5);
  for (int i = 0; i < 100000; ++i) bits.push_back(rng());
  for (uint32_t b : bits) {
    INFO("bits ", b);
    CHECK(rt::float_to_bf16_bits_inline(from_bits(b)) == rt::float_to_bf16_bits(from_bits(b)));
  }
}
