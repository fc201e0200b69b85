#include "codegen/cuda/emit.h"

#include <cmath>
#include <limits>

#include "ir/internal_check.h"
#include "runtime/rope.h"

namespace napkin::codegen::cuda::detail {

using ir::DType;

const char* storage_type(DType t) {
  switch (t) {
    case DType::F64: return "double";
    case DType::F32: return "float";
    case DType::F16:
    case DType::BF16: return "unsigned short";
    case DType::F8E4M3:
    case DType::F8E5M2:
    case DType::Bool: return "unsigned char";
    case DType::I32: return "int";
    case DType::I64: return "long long";
  }
  NAPKIN_INTERNAL_CHECK(false, "unknown dtype {}", static_cast<int>(t));
  return nullptr;
}

const char* compute_type(DType t) {
  switch (t) {
    case DType::F64: return "double";
    case DType::F32:
    case DType::F16:
    case DType::BF16:
    case DType::F8E4M3:
    case DType::F8E5M2: return "float";
    case DType::I32: return "int";
    case DType::I64: return "long long";
    case DType::Bool: return "bool";
  }
  NAPKIN_INTERNAL_CHECK(false, "unknown dtype {}", static_cast<int>(t));
  return nullptr;
}

int compute_size(DType t) {
  switch (t) {
    case DType::F64:
    case DType::I64: return 8;
    case DType::Bool: return 1;
    default: return 4;
  }
}

void emit_rope_frequencies(Src& s, const std::string& name, const ir::RopeParams& p, int64_t dim) {
  std::vector<std::string> values;
  for (float f : runtime::rope_inv_freq(rope_desc(p, dim))) values.push_back(literal(DType::F32, f));
  s.line("__device__ const float {}[{}] = {{{}}};", name, dim / 2, fmt::join(values, ", "));
}

std::string literal(DType t, double v) {
  switch (t) {
    case DType::F64:
      if (std::isinf(v)) return v > 0 ? "napkin_inf_f64()" : "(-napkin_inf_f64())";
      if (std::isnan(v)) return "((double)napkin_nan_f32())";
      return fmt::format("({:a})", v);
    case DType::F32:
    case DType::F16:
    case DType::BF16:
    case DType::F8E4M3:
    case DType::F8E5M2: {
      float f = static_cast<float>(v);
      if (std::isinf(f)) return f > 0 ? "napkin_inf_f32()" : "(-napkin_inf_f32())";
      if (std::isnan(f)) return "napkin_nan_f32()";
      return fmt::format("({:a}f)", static_cast<double>(f));
    }
    case DType::I32: return fmt::format("((int){}LL)", static_cast<int64_t>(static_cast<int32_t>(static_cast<int64_t>(v))));
    case DType::I64: {
      int64_t i = static_cast<int64_t>(v);
      if (i == std::numeric_limits<int64_t>::min()) return "(-9223372036854775807LL - 1)";
      return fmt::format("({}LL)", i);
    }
    case DType::Bool: return v != 0 ? "true" : "false";
  }
  NAPKIN_INTERNAL_CHECK(false, "unknown dtype {}", static_cast<int>(t));
  return "";
}

std::string from_storage(DType t, const std::string& raw) {
  switch (t) {
    case DType::F16: return fmt::format("napkin_f16_to_f32({})", raw);
    case DType::BF16: return fmt::format("napkin_bf16_to_f32({})", raw);
    case DType::F8E4M3: return fmt::format("napkin_e4m3_to_f32({})", raw);
    case DType::F8E5M2: return fmt::format("napkin_e5m2_to_f32({})", raw);
    case DType::Bool: return fmt::format("({} != 0)", raw);
    default: return raw;
  }
}

std::string to_storage(DType t, const std::string& v) {
  switch (t) {
    case DType::F16: return fmt::format("napkin_f32_to_f16({})", v);
    case DType::BF16: return fmt::format("napkin_f32_to_bf16({})", v);
    case DType::F8E4M3: return fmt::format("napkin_f32_to_e4m3({})", v);
    case DType::F8E5M2: return fmt::format("napkin_f32_to_e5m2({})", v);
    case DType::Bool: return fmt::format("(unsigned char)(({}) ? 1 : 0)", v);
    default: return v;
  }
}

std::string as_stored(DType t, const std::string& v) {
  switch (t) {
    case DType::F16: return fmt::format("napkin_round_f16({})", v);
    case DType::BF16: return fmt::format("napkin_round_bf16({})", v);
    case DType::F8E4M3: return fmt::format("napkin_round_e4m3({})", v);
    case DType::F8E5M2: return fmt::format("napkin_round_e5m2({})", v);
    default: return v;  // the compute type holds the dtype's values exactly
  }
}

std::string convert(const std::string& v, DType from, DType to) {
  std::string src = compute_type(from), dst = compute_type(to);
  if (src == dst) return v;
  if (to == DType::Bool) return fmt::format("(({}) != 0)", v);
  if (from == DType::Bool) return fmt::format("(({})(({}) ? 1 : 0))", dst, v);
  if (ir::is_floating(from) && !ir::is_floating(to))
    return fmt::format("{}({})", to == DType::I32 ? "napkin_to_i32_sat" : "napkin_to_i64_sat", v);
  return fmt::format("(({})({}))", dst, v);  // float <-> float, int -> float (nearest), int <-> int
}

std::string offset_marker(const Operand& o, bool vector) {
  NAPKIN_INTERNAL_CHECK(o.byte_offset >= 0, "an operand at byte offset {}", o.byte_offset);
  return fmt::format("${}{}$", vector ? 'v' : 'o', o.byte_offset);
}

std::string pointer(const Operand& o) { return fmt::format("(({}*)(arena + {}))", storage_type(o.dtype), offset_marker(o, false)); }

std::string load(const Operand& o, const std::string& index) {
  return from_storage(o.dtype, fmt::format("{}[{}]", pointer(o), index));
}

std::string store(const Operand& o, const std::string& index, const std::string& v) {
  return fmt::format("{}[{}] = {};", pointer(o), index, to_storage(o.dtype, v));
}

namespace {

const char kComponent[] = {'x', 'y', 'z', 'w'};

// The storage bits of element e of a chunk held in uint4 words vw0, vw1, ...
// as an unsigned (or unsigned long long for 8-byte elements) expression.
std::string word_bits(int e, int size) {
  int byte = e * size;
  int q = byte / 16, c = (byte % 16) / 4, shift = (byte % 4) * 8;
  if (size == 8)
    return fmt::format("(((unsigned long long)vw{}.{} << 32) | vw{}.{})", q, kComponent[c + 1], q, kComponent[c]);
  if (size == 4) return fmt::format("vw{}.{}", q, kComponent[c]);
  std::string word = shift ? fmt::format("(vw{}.{} >> {})", q, kComponent[c], shift) : fmt::format("vw{}.{}", q, kComponent[c]);
  return fmt::format("({})({})", size == 2 ? "unsigned short" : "unsigned char", word);
}

// Element bits -> compute value.
std::string unpack(DType t, const std::string& bits) {
  switch (t) {
    case DType::F32: return fmt::format("napkin_f32_from_bits({})", bits);
    case DType::F64: return fmt::format("napkin_f64_from_bits({})", bits);
    case DType::I32: return fmt::format("(int)({})", bits);
    case DType::I64: return fmt::format("(long long)({})", bits);
    default: return from_storage(t, bits);
  }
}

// Compute value -> element bits (unsigned, or unsigned long long for 8 bytes).
std::string pack(DType t, const std::string& v) {
  switch (t) {
    case DType::F32: return fmt::format("napkin_f32_bits({})", v);
    case DType::F64: return fmt::format("napkin_f64_bits({})", v);
    case DType::I32: return fmt::format("(unsigned)({})", v);
    case DType::I64: return fmt::format("(unsigned long long)({})", v);
    case DType::Bool: return fmt::format("(({}) ? 1u : 0u)", v);
    default: return fmt::format("(unsigned){}", to_storage(t, v));
  }
}

}  // namespace

void vector_load(Src& s, const Operand& o, const std::string& at, int E, const std::function<std::string(int)>& dst) {
  int size = ir::dtype_size(o.dtype);
  int words = E * size / 16;
  NAPKIN_INTERNAL_CHECK(words >= 1 && E * size % 16 == 0, "a chunk of {} elements of {} bytes is not whole uint4 words", E, size);
  s.open("{{");
  s.line("const uint4* vp = (const uint4*)(arena + {}) + ({}) / {};", offset_marker(o, true), at, 16 / size);
  for (int q = 0; q < words; ++q) s.line("const uint4 vw{} = vp[{}];", q, q);
  for (int e = 0; e < E; ++e) s.line("{} = {};", dst(e), unpack(o.dtype, word_bits(e, size)));
  s.close();
}

void vector_store(Src& s, const Operand& o, const std::string& at, int E, const std::function<std::string(int)>& src) {
  int size = ir::dtype_size(o.dtype);
  int words = E * size / 16;
  NAPKIN_INTERNAL_CHECK(words >= 1 && E * size % 16 == 0, "a chunk of {} elements of {} bytes is not whole uint4 words", E, size);
  s.open("{{");
  const char* bits_t = size == 8 ? "unsigned long long" : "unsigned";
  for (int e = 0; e < E; ++e) s.line("const {} vb{} = {};", bits_t, e, pack(o.dtype, src(e)));
  s.line("uint4* vp = (uint4*)(arena + {}) + ({}) / {};", offset_marker(o, true), at, 16 / size);
  int per_word = size >= 4 ? 1 : 4 / size;
  for (int q = 0; q < words; ++q) {
    std::string comps[4];
    for (int c = 0; c < 4; ++c) {
      int byte = q * 16 + c * 4;
      if (size == 8) {
        int e = byte / 8;
        comps[c] = c % 2 == 0 ? fmt::format("(unsigned)vb{}", e) : fmt::format("(unsigned)(vb{} >> 32)", e);
        continue;
      }
      std::string w;
      for (int part = 0; part < per_word; ++part) {
        int e = byte / size + part;
        std::string term = part ? fmt::format("(vb{} << {})", e, part * size * 8) : fmt::format("vb{}", e);
        w += (part ? " | " : "") + term;
      }
      comps[c] = w;
    }
    s.line("vp[{}] = make_uint4({}, {}, {}, {});", q, comps[0], comps[1], comps[2], comps[3]);
  }
  s.close();
}

bool aligned16(const Operand& o, const std::vector<int64_t>& strides) {
  int64_t size = ir::dtype_size(o.dtype);
  if (o.byte_offset % 16 != 0) return false;
  for (int64_t st : strides)
    if (st * size % 16 != 0) return false;
  return true;
}

std::string index_type(int64_t bound) {
  return bound < (int64_t{1} << 31) ? "unsigned" : "unsigned long long";
}

int64_t max_offset(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides) {
  int64_t m = 0;
  for (size_t d = 0; d < sizes.size(); ++d) m += (sizes[d] - 1) * strides[d];
  return m;
}

void decompose(Src& s, const std::vector<int64_t>& sizes, const std::string& flat, const std::string& prefix,
               const std::string& index_t) {
  size_t n = sizes.size();
  if (n == 1) {
    s.line("[[maybe_unused]] const {} {}0 = {};", index_t, prefix, flat);
    return;
  }
  s.line("{} {}_rest = {};", index_t, prefix, flat);
  for (size_t d = n - 1; d >= 1; --d) {
    s.line("[[maybe_unused]] const {} {}{} = {}_rest % {}u;", index_t, prefix, d, prefix, sizes[d]);
    s.line("{}_rest /= {}u;", prefix, sizes[d]);
  }
  s.line("[[maybe_unused]] const {} {}0 = {}_rest;", index_t, prefix, prefix);
}

std::string dot(const std::string& prefix, const std::vector<int64_t>& strides) {
  std::string e;
  for (size_t d = 0; d < strides.size(); ++d) {
    if (strides[d] == 0) continue;
    if (!e.empty()) e += " + ";
    e += strides[d] == 1 ? fmt::format("{}{}", prefix, d) : fmt::format("{}{} * {}u", prefix, d, strides[d]);
  }
  return e.empty() ? "0u" : "(" + e + ")";
}

std::string kernel_signature(const std::string& name, int block) {
  return fmt::format("extern \"C\" __global__ void __launch_bounds__({}) {}(char* __restrict__ arena, char* __restrict__ scratch, "
                     "const NAPKIN_OFFSETS({}) off) {{",
                     block, name, kSlotCountMarker);
}

void begin_kernel(Src& s, const std::string& name, int block) {
  s.open("{}", kernel_signature(name, block));
  s.line("(void)scratch;");
  s.line("(void)off;");
}

int64_t grid_for(int64_t items, int64_t per_block, int64_t max_grid) {
  int64_t g = (items + per_block - 1) / per_block;
  return std::max<int64_t>(1, std::min(g, max_grid));
}

int block_for(int64_t items, int max_block) {
  int64_t b = (items + 31) / 32 * 32;
  return static_cast<int>(std::max<int64_t>(32, std::min<int64_t>(b, max_block)));
}

int64_t product(const std::vector<int64_t>& v) {
  int64_t n = 1;
  for (int64_t s : v) n *= s;
  return n;
}

}  // namespace napkin::codegen::cuda::detail
