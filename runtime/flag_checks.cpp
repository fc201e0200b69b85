#include "runtime/flag_checks.h"

#include <fmt/format.h>

#include <charconv>
#include <cmath>
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

CLI::Validator number_in(double lo, double hi) {
  return CLI::Validator(
      [lo, hi](std::string& text) -> std::string {
        double v = 0;
        auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
        if (text.empty() || ec != std::errc() || end != text.data() + text.size() || !std::isfinite(v) || v < lo ||
            v > hi)
          return fmt::format("'{}' is not a number from {:g} to {:g}", text, lo, hi);
        return "";
      },
      fmt::format("NUMBER in [{:g}, {:g}]", lo, hi));
}

}  // namespace napkin::runtime
