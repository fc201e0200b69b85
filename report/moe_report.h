// The report's mixture-of-experts section (analysis/moe.h's figures) as text
// and JSON, and the tokens a trainer dropped, read from its metrics file
// (`napkin report --metrics FILE`; docs/report.md, "Mixture of experts").
#pragma once

#include <cstdint>
#include <istream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "analysis/moe.h"
#include "ir/graph.h"

namespace napkin::report {

// The (token, choice) assignments dropped per layer, from the last record of
// a metrics file with a "moe_dropped" object (docs/runtime.md: a logged
// step's, summed over its micro-batches and ranks, keyed by the layer's name
// in its metric.moe_dropped.<name> output).
struct DroppedTokens {
  std::string path;
  bool found = false;  // false: no record has the field
  double step = -1;    // the record's step; -1 when it has none
  std::vector<std::pair<std::string, double>> layers;  // in the record's order; NaN for null
  // The same record's "moe_load": each layer's assignments per expert (before capacity), in the record's
  // order; empty when the record has none.
  std::vector<std::pair<std::string, std::vector<double>>> load;
};

// nullopt with `error` ("FILE:LINE: what") when a line is not a JSON object.
std::optional<DroppedTokens> read_dropped_tokens(std::istream& in, const std::string& path, std::string& error);

// `dropped`: null when no --metrics was given; `micro_batches`: a step's
// micro-batches over all ranks (ranks x micro-batches a rank), what the
// dropped counts are summed over.
std::string moe_section_text(const ir::Graph& g, const analysis::MoeFigures& m, const DroppedTokens* dropped,
                             int64_t micro_batches);
nlohmann::json moe_json(const ir::Graph& g, const analysis::MoeFigures& m, const DroppedTokens* dropped,
                        int64_t micro_batches);

}  // namespace napkin::report
