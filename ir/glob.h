// The glob patterns of model files: `*` matches any run of characters, dots
// included; `?` one character; every other character itself (no brackets, no
// escapes). no_decay selects parameters with them and precision fp32 selects
// ops; the frontend checks that each no_decay pattern selects a parameter.
#pragma once

#include <string_view>

namespace napkin::ir {

// Whether all of `name` matches `pattern`.
bool glob_match(std::string_view pattern, std::string_view name);

}  // namespace napkin::ir
