// The frontend's public face: a model file in, a typed forward Graph out.
//
// All mistakes in the file are reported to `diag` (every one, not just the
// first) in the compiler format with file:line:col; the result is empty iff
// there was at least one error.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "ir/diagnostics.h"
#include "ir/graph.h"

namespace napkin::frontend {

struct LoadOptions {
  // Dim values that replace the file's expressions (`--dims d=32,layers=2`):
  // the model compiles at these sizes, and dims derived from them
  // (`head_dim: d / heads`) are recomputed. Naming a dim the file does not
  // declare, or a value < 1, is an error.
  std::map<std::string, int64_t> dim_overrides;
};

// The largest model file load_model_file reads: a real model is a few KB of
// YAML, and a file this big is most likely not a model at all.
inline constexpr int64_t kMaxModelFileBytes = int64_t{16} << 20;  // 16 MiB

// Reads and lowers a model file. A missing or unreadable file is an error too,
// and so is anything but a regular file (a directory, a FIFO, a device) and a
// file over kMaxModelFileBytes: those are refused before they are read. The
// text must be UTF-8 without control characters other than tab and line
// breaks, and hold one YAML document.
std::optional<ir::Graph> load_model_file(const std::string& path, ir::Diagnostics& diag);
std::optional<ir::Graph> load_model_file(const std::string& path, ir::Diagnostics& diag, const LoadOptions& options);

// Lowers model text; `path` is only used in messages.
std::optional<ir::Graph> load_model_text(const std::string& text, const std::string& path,
                                         ir::Diagnostics& diag);
std::optional<ir::Graph> load_model_text(const std::string& text, const std::string& path, ir::Diagnostics& diag,
                                         const LoadOptions& options);

// Parses the command-line form of dim overrides, "name=value,name=value"
// (spaces around names, values and commas are allowed; values are integers
// >= 1 and below 2^48; a name may appear once). On a mistake returns nullopt
// and sets `error` to a one-line message without a prefix such as "--dims: ".
std::optional<std::map<std::string, int64_t>> parse_dim_overrides(std::string_view text, std::string& error);

}  // namespace napkin::frontend
