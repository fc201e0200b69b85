// The report's distributed-step section (`napkin report --ranks N
// --interconnect NAME`): analysis/distributed.h's figures per ZeRO stage, as
// text and JSON (docs/report.md, "Distributed step").
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "analysis/distributed.h"

namespace napkin::report {

// tokens: one rank's tokens per step (the model's).
std::string distributed_section_text(const analysis::DistributedStep& d, double tokens);
nlohmann::json distributed_json(const analysis::DistributedStep& d, double tokens);

// `--memory-per-rank`: each stage's fit, the budget that makes it fit, the largest model (analysis::fit_memory).
std::string memory_fit_text(const analysis::MemoryFit& f);
nlohmann::json memory_fit_json(const analysis::MemoryFit& f);

}  // namespace napkin::report
