#include "ir/glob.h"

#include <cstddef>

namespace napkin::ir {

bool glob_match(std::string_view pattern, std::string_view name) {
  // Iterative wildcard matching with one backtrack point: linear in practice,
  // never exponential (a pattern like "*a*a*a*b" cannot blow up).
  size_t p = 0, n = 0, star = std::string_view::npos, resume = 0;
  while (n < name.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == name[n])) {
      ++p;
      ++n;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      resume = n;
    } else if (star != std::string_view::npos) {
      p = star + 1;
      n = ++resume;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

}  // namespace napkin::ir
