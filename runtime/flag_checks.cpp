#include "runtime/flag_checks.h"

#include <fmt/format.h>

#include <charconv>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <string>

namespace napkin::runtime {

CLI::Validator whole_number_in(uint64_t lo, uint64_t hi) {
  return CLI::Validator(
      [lo, hi](std::string& text) -> std::string {
        uint64_t v = 0;
        auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
        if (text.empty() || ec != std::errc() || end != text.data() + text.size() || v < lo || v > hi)
          return fmt::format("'{}' is not a whole number from {} to {}", text, lo, hi);
        return "";
      },
      fmt::format("INT in [{}, {}]", lo, hi));
}

CLI::Validator finite_number_in(double lo, double hi) {
  return CLI::Validator(
      [lo, hi](std::string& text) -> std::string {
        // strtod, not from_chars: a number too small for a normal double
        // ("1e-320") is that number or 0, not an error.
        char* end = nullptr;
        const double v = text.empty() || std::isspace(static_cast<unsigned char>(text[0])) ? 0 : std::strtod(text.c_str(), &end);
        if (end != text.c_str() + text.size()) return fmt::format("'{}' is not a number", text);
        if (!std::isfinite(v)) return fmt::format("'{}' is not a finite number: give one from {} to {}", text, lo, hi);
        if (v < lo || v > hi) return fmt::format("'{}' is not a number from {} to {}", text, lo, hi);
        return "";
      },
      fmt::format("NUMBER in [{}, {}]", lo, hi));
}

}  // namespace napkin::runtime
