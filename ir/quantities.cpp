#include "ir/quantities.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace napkin::ir {

std::string with_commas(double v) {
  // Formats the double itself: FLOP totals pass 2^63, where an int64 cast is undefined.
  std::string digits = fmt::format("{:.0f}", std::fabs(v)), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return (v < 0 && digits != "0" ? "-" : "") + out;
}

namespace {
std::string scaled(double v, const char* const* units, int count, double step, const char* fmt_spec) {
  int i = 0;
  double a = std::fabs(v);
  // 999.5 and up would print as "1e+03" in three digits: the next unit reads better.
  while (i + 1 < count && a >= std::min(step, 999.5)) {
    a /= step;
    v /= step;
    ++i;
  }
  return fmt::format(fmt::runtime(fmt_spec), v, units[i]);
}
}  // namespace

std::string human_flops(double flops) {
  static const char* const units[] = {"FLOP", "KFLOP", "MFLOP", "GFLOP", "TFLOP", "PFLOP", "EFLOP"};
  return scaled(flops, units, 7, 1000, "{:.3g} {}");
}

std::string human_bytes(double bytes) {
  static const char* const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  return scaled(bytes, units, 5, 1024, "{:.3g} {}");
}

std::string human_seconds(double s) {
  if (s == 0) return "0";
  if (s < 1e-6) return fmt::format("{:.3g} ns", s * 1e9);
  if (s < 1e-3) return fmt::format("{:.3g} us", s * 1e6);
  if (s < 1) return fmt::format("{:.3g} ms", s * 1e3);
  return fmt::format("{:.3g} s", s);
}

}  // namespace napkin::ir
