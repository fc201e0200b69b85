// The runtime's one error type. Everything a user can get wrong at run time (a
// missing or short data file, a corrupt checkpoint, a bad flag, a NaN loss) is
// thrown as a runtime::Error whose message says what is wrong and where
// ("data/tiny.u16: 17 bytes is not a whole number of u16 tokens"); the
// trainer's main prints it as "error: ..." and exits with status 1.
#pragma once

#include <stdexcept>
#include <string>

namespace napkin::runtime {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace napkin::runtime
