// Attrs' typed getters and the attribute printer (ir/attrs.h).
#include "ir/attrs.h"

#include <fmt/format.h>

#include "ir/internal_check.h"

namespace napkin::ir {

namespace {
template <typename T>
const T& get(const std::map<std::string, AttrValue>& m, const std::string& key, const char* type) {
  auto it = m.find(key);
  NAPKIN_INTERNAL_CHECK(it != m.end(), "missing attribute '{}'", key);
  const T* v = std::get_if<T>(&it->second);
  NAPKIN_INTERNAL_CHECK(v != nullptr, "attribute '{}' is not {}", key, type);
  return *v;
}
}  // namespace

int64_t Attrs::get_int(const std::string& key) const { return get<int64_t>(map_, key, "an int"); }
double Attrs::get_double(const std::string& key) const { return get<double>(map_, key, "a double"); }
const std::string& Attrs::get_string(const std::string& key) const {
  return get<std::string>(map_, key, "a string");
}
const std::vector<int64_t>& Attrs::get_ints(const std::string& key) const {
  return get<std::vector<int64_t>>(map_, key, "an int list");
}
DType Attrs::get_dtype(const std::string& key) const { return get<DType>(map_, key, "a dtype"); }

std::string to_string(const AttrValue& v) {
  struct Printer {
    std::string operator()(int64_t i) const { return std::to_string(i); }
    std::string operator()(double d) const { return fmt::format("{}", d); }
    std::string operator()(const std::string& s) const { return fmt::format("\"{}\"", s); }
    std::string operator()(const std::vector<int64_t>& xs) const {
      return fmt::format("[{}]", fmt::join(xs, ","));
    }
    std::string operator()(DType t) const { return std::string(dtype_name(t)); }
  };
  return std::visit(Printer{}, v);
}

}  // namespace napkin::ir
