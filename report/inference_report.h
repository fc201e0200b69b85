// The inference section of the report (`napkin report --inference`): text
// and JSON of analysis/inference.h's figures, each with its convention.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "analysis/inference.h"

namespace napkin::report {

// head_dim and kv_heads: for the KV cache's formula line (2 · layers · T ·
// kv_heads · head_dim · bytes per sequence).
std::string inference_section_text(const std::string& model, const analysis::InferenceCost& c, int64_t kv_heads,
                                   int64_t head_dim, int64_t kv_element_bytes);
nlohmann::json inference_json(const analysis::InferenceCost& c);

}  // namespace napkin::report
