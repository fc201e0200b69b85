// An op node's attributes (ir/op.h): small typed values keyed by name.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <map>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "ir/type.h"

namespace napkin::ir {

// Attributes: small typed values keyed by name; printed sorted by key.
using AttrValue = std::variant<int64_t, double, std::string, std::vector<int64_t>, DType>;

class Attrs {
 public:
  Attrs() = default;
  Attrs(std::initializer_list<std::pair<const std::string, AttrValue>> init) : map_(init) {}
  void set(const std::string& key, AttrValue v) { map_[key] = std::move(v); }
  bool has(const std::string& key) const { return map_.count(key) > 0; }
  // Getters are internal checks: a missing or mistyped attribute is a compiler bug.
  int64_t get_int(const std::string& key) const;
  double get_double(const std::string& key) const;
  const std::string& get_string(const std::string& key) const;
  const std::vector<int64_t>& get_ints(const std::string& key) const;
  DType get_dtype(const std::string& key) const;
  const std::map<std::string, AttrValue>& all() const { return map_; }
  bool operator==(const Attrs& o) const { return map_ == o.map_; }

 private:
  std::map<std::string, AttrValue> map_;
};
std::string to_string(const AttrValue& v);

}  // namespace napkin::ir
