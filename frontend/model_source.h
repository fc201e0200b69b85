// From a model file to its one YAML document, before any section is read:
// the file must be a regular file of at most kMaxModelFileBytes, its text
// UTF-8 without the control characters YAML forbids, and the YAML one
// document without syntax errors. Each check reports what is wrong, where,
// and stops. Internal to frontend/ (it exposes yaml-cpp types).
#pragma once

#include <yaml-cpp/yaml.h>

#include <optional>
#include <string>

#include "frontend/yaml_context.h"
#include "ir/diagnostics.h"

namespace napkin::frontend {

// The bytes of the model file at `path`. Anything but a regular file (a
// directory, a FIFO, a device) and a file over kMaxModelFileBytes is refused
// without reading it, so that /dev/zero cannot fill memory and a FIFO with no
// writer cannot block.
std::optional<std::string> read_model_file(const std::string& path, ir::Diagnostics& diag);

// The model text's one YAML document (a null node for an empty text).
// Reports the first character YAML does not allow, a syntax error with a hint
// for its usual cause, or a second document.
std::optional<YAML::Node> parse_model_document(const std::string& text, YamlContext& ctx);

}  // namespace napkin::frontend
