// Small text helpers shared by ir/ and the layers above it.
#pragma once

#include <algorithm>
#include <cctype>
#include <string_view>

namespace napkin::ir {

// ASCII case-insensitive equality: iequals("H100", "h100").
inline bool iequals(std::string_view a, std::string_view b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(), [](char x, char y) {
    return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
  });
}

}  // namespace napkin::ir
