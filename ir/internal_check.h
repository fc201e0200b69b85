// Internal checks: a failed one is a bug in napkin, never the user's mistake.
//
// It throws InternalError carrying the compiler's file:line; the driver catches it,
// prints "internal error" with that location and exits with status 2, so a bug
// never looks like a crash and never like a problem in the user's model.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace napkin::ir {

class InternalError : public std::logic_error {
 public:
  InternalError(const char* file, int line, const std::string& message)
      : std::logic_error(fmt::format("{}:{}: internal error: {}", file, line, message)) {}
};

}  // namespace napkin::ir

#define NAPKIN_INTERNAL_CHECK(cond, ...)                                              \
  do {                                                                                \
    if (!(cond))                                                                      \
      throw ::napkin::ir::InternalError(__FILE__, __LINE__,                           \
                                        "check '" #cond "' failed: " +                \
                                            ::fmt::format(__VA_ARGS__));              \
  } while (0)
