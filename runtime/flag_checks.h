// Checks of command-line values the trainer and the sampler share (CLI11).
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>

namespace napkin::runtime {

// A whole decimal number in [lo, hi], so that "99999999999999999999" or "-5"
// is refused with the range rather than saturated or wrapped by the conversion.
CLI::Validator whole_number_in(uint64_t lo, uint64_t hi);

// A finite decimal number in [lo, hi]: "nan", "inf" and "-1" are refused
// with the range. (CLI::Range lets NaN through: every comparison with it is
// false, so `--collective-timeout nan` turned the watchdog off silently.)
CLI::Validator number_in(double lo, double hi);

}  // namespace napkin::runtime
