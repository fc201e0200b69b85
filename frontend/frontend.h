// The frontend's public face: a model file in, a typed forward Graph out.
//
// All mistakes in the file are reported to `diag` (every one, not just the
// first) in the compiler format with file:line:col; the result is empty iff
// there was at least one error.
#pragma once

#include <optional>
#include <string>

#include "ir/diagnostics.h"
#include "ir/graph.h"

namespace napkin::frontend {

// Reads and lowers a model file. A missing or unreadable file is an error too.
std::optional<ir::Graph> load_model_file(const std::string& path, ir::Diagnostics& diag);

// Lowers model text; `path` is only used in messages.
std::optional<ir::Graph> load_model_text(const std::string& text, const std::string& path,
                                         ir::Diagnostics& diag);

}  // namespace napkin::frontend
