#include "runtime/npy.h"

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>

#include "runtime/error.h"

namespace napkin::runtime {

namespace {

struct Descr {
  const char* descr;
  DType dtype;
};

constexpr Descr kDescrs[] = {
    {"<f4", DType::F32}, {"<f8", DType::F64}, {"<f2", DType::F16}, {"<i4", DType::I32},
    {"<i8", DType::I64}, {"<u2", DType::U16}, {"|u1", DType::U8},  {"|b1", DType::Bool},
};

std::optional<Descr> find_descr(const std::string& descr) {
  for (const Descr& d : kDescrs)
    if (descr == d.descr) return d;
  return std::nullopt;
}

std::string supported_descrs() {
  std::string s;
  for (const Descr& d : kDescrs) s += (s.empty() ? "" : " ") + std::string(d.descr);
  return s;
}

// A parser for exactly the dict literals numpy writes (and hand-written
// variants: either quote style, any spacing, trailing commas).
class HeaderParser {
 public:
  HeaderParser(const std::string& path, std::string_view text) : path_(path), text_(text) {}

  void parse(std::string& descr, bool& fortran_order, std::vector<int64_t>& shape) {
    bool seen_descr = false, seen_fortran = false, seen_shape = false;
    expect('{');
    while (!peek('}')) {
      std::string key = string_literal();
      expect(':');
      if (key == "descr") {
        descr = string_literal();
        seen_descr = true;
      } else if (key == "fortran_order") {
        fortran_order = boolean();
        seen_fortran = true;
      } else if (key == "shape") {
        shape = tuple();
        seen_shape = true;
      } else {
        fail("unexpected key '" + key + "'");
      }
      if (!peek('}')) expect(',');
    }
    expect('}');
    skip_space();
    if (pos_ != text_.size()) fail("text after the closing '}'");
    if (!seen_descr) fail("no 'descr'");
    if (!seen_fortran) fail("no 'fortran_order'");
    if (!seen_shape) fail("no 'shape'");
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    // The header's padding and final newline would only blur the message.
    std::string_view shown = text_.substr(0, text_.find_last_not_of(" \n") + 1);
    throw Error(path_ + ": malformed .npy header: " + what + " in " + std::string(shown));
  }
  void skip_space() {
    while (pos_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[pos_]))) ++pos_;
  }
  bool peek(char c) {
    skip_space();
    return pos_ < text_.size() && text_[pos_] == c;
  }
  void expect(char c) {
    if (!peek(c)) fail(std::string("expected '") + c + "'");
    ++pos_;
  }
  std::string string_literal() {
    skip_space();
    if (pos_ >= text_.size() || (text_[pos_] != '\'' && text_[pos_] != '"')) fail("expected a quoted string");
    char quote = text_[pos_++];
    size_t end = text_.find(quote, pos_);
    if (end == std::string_view::npos) fail("unterminated string");
    std::string s(text_.substr(pos_, end - pos_));
    pos_ = end + 1;
    return s;
  }
  bool boolean() {
    skip_space();
    for (auto [word, value] : {std::pair{"True", true}, std::pair{"False", false}}) {
      if (text_.substr(pos_).starts_with(word)) {
        pos_ += std::strlen(word);
        return value;
      }
    }
    fail("expected True or False");
  }
  std::vector<int64_t> tuple() {
    std::vector<int64_t> dims;
    expect('(');
    while (!peek(')')) {
      if (pos_ >= text_.size() || !std::isdigit(static_cast<unsigned char>(text_[pos_])))
        fail("expected a dimension (a non-negative integer)");
      int64_t d = 0;
      while (pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_]))) {
        if (__builtin_mul_overflow(d, 10, &d) || __builtin_add_overflow(d, text_[pos_] - '0', &d))
          fail("dimension too large");
        ++pos_;
      }
      dims.push_back(d);
      if (!peek(')')) expect(',');
    }
    expect(')');
    return dims;
  }

  const std::string& path_;
  std::string_view text_;
  size_t pos_ = 0;
};

uint32_t read_le(const char* p, int bytes) {
  uint32_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

}  // namespace

std::string npy_shape_text(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

NpyArray read_npy(const std::string& path) {
  NpyArray a(MappedFile{path});
  const char* p = a.file.data();
  const size_t size = a.file.size();
  if (size < 10 || std::memcmp(p, "\x93NUMPY", 6) != 0)
    throw Error(path + ": not a .npy file (no \\x93NUMPY magic at the start)");
  const int major = static_cast<unsigned char>(p[6]), minor = static_cast<unsigned char>(p[7]);
  if (major < 1 || major > 3 || minor != 0)
    throw Error(path + ": .npy version " + std::to_string(major) + "." + std::to_string(minor) +
                " is not supported (only 1.0, 2.0 and 3.0)");
  // Version 1.0 stores the header length in two bytes; 2.0 and 3.0 (3.0 only
  // allows UTF-8 in the header) in four.
  const size_t len_bytes = major == 1 ? 2 : 4;
  if (size < 8 + len_bytes) throw Error(path + ": truncated .npy header");
  const size_t header_len = read_le(p + 8, static_cast<int>(len_bytes));
  const size_t data_offset = 8 + len_bytes + header_len;
  if (data_offset > size)
    throw Error(path + ": truncated .npy header: it claims " + std::to_string(header_len) + " bytes, the file has " +
                std::to_string(size - 8 - len_bytes) + " after the length field");

  bool fortran_order = false;
  HeaderParser(path, std::string_view(p + 8 + len_bytes, header_len)).parse(a.descr, fortran_order, a.shape);

  if (a.descr.size() == 3 && a.descr[0] == '>')
    throw Error(path + ": big-endian data (" + a.descr + ") is not supported; save it little-endian, e.g. arr.astype('<" +
                a.descr.substr(1) + "')");
  std::optional<Descr> d = find_descr(a.descr);
  if (!d) throw Error(path + ": dtype " + a.descr + " is not supported (supported: " + supported_descrs() + ")");
  if (fortran_order)
    throw Error(path + ": Fortran-order (column-major) arrays are not supported; save np.ascontiguousarray(arr)");
  a.dtype = d->dtype;
  a.itemsize = static_cast<size_t>(element_bytes(d->dtype));

  a.numel = 1;
  for (int64_t dim : a.shape)
    if (__builtin_mul_overflow(a.numel, dim, &a.numel))
      throw Error(path + ": shape " + npy_shape_text(a.shape) + " has too many elements");
  size_t expected = 0;
  if (__builtin_mul_overflow(static_cast<size_t>(a.numel), a.itemsize, &expected))
    throw Error(path + ": shape " + npy_shape_text(a.shape) + " has too many bytes");
  const size_t found = size - data_offset;
  if (found < expected)
    throw Error(path + ": truncated: expected " + std::to_string(expected) + " bytes of data (shape " +
                npy_shape_text(a.shape) + " of " + a.descr + "), found " + std::to_string(found));
  if (found > expected)
    throw Error(path + ": " + std::to_string(found - expected) + " bytes after the data: expected " +
                std::to_string(expected) + " bytes of data (shape " + npy_shape_text(a.shape) + " of " + a.descr +
                "), found " + std::to_string(found));
  a.data = p + data_offset;
  return a;
}

void write_npy(const std::string& path, const std::string& descr, const std::vector<int64_t>& shape, const void* data,
               size_t bytes) {
  // Any simple descr (byte order, kind, size in bytes) can be written, so
  // tests and tools can also produce files read_npy rejects (>f4, <c8).
  if (descr.size() < 3 || std::string("<>|=").find(descr[0]) == std::string::npos ||
      !std::isalpha(static_cast<unsigned char>(descr[1])) ||
      descr.find_first_not_of("0123456789", 2) != std::string::npos)
    throw Error(path + ": cannot write dtype " + descr + " (expected a descr such as <f4)");
  const size_t itemsize = std::stoul(descr.substr(2));
  size_t numel = 1;
  for (int64_t dim : shape) numel *= static_cast<size_t>(dim);
  if (numel * itemsize != bytes)
    throw Error(path + ": shape " + npy_shape_text(shape) + " of " + descr + " needs " + std::to_string(numel * itemsize) +
                " bytes, given " + std::to_string(bytes));

  std::string header = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + npy_shape_text(shape) + ", }";
  const bool v1 = header.size() + 1 + 10 <= 65535;
  const size_t prefix = v1 ? 10 : 12;
  header.append((64 - (prefix + header.size() + 1) % 64) % 64, ' ');
  header += '\n';
  std::string head = std::string("\x93NUMPY", 6) + static_cast<char>(v1 ? 1 : 2) + '\0';
  for (size_t i = 0; i < prefix - 8; ++i) head += static_cast<char>((header.size() >> (8 * i)) & 0xff);
  head += header;

  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "wb"), &std::fclose);
  if (!f) throw Error(path + ": cannot create: " + std::strerror(errno));
  if (std::fwrite(head.data(), 1, head.size(), f.get()) != head.size() ||
      (bytes > 0 && std::fwrite(data, 1, bytes, f.get()) != bytes) || std::fflush(f.get()) != 0)
    throw Error(path + ": cannot write: " + std::strerror(errno));
}

}  // namespace napkin::runtime
