// `napkin plot METRICS.jsonl... [-o FILE.svg|.html]`: reads trainers'
// metrics files and writes report/plot.h's charts.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "report/plot.h"

namespace napkin::tools {

// One metrics file's runs (a trainer appends: report/plot.h), read a line at
// a time in bounded memory; nullopt with `error` set ("FILE:LINE: what") when
// it is not a regular file, cannot be read or a line is not a metrics record.
std::optional<std::vector<report::MetricsRun>> read_metrics(const std::string& path, std::string& error);

// The command: 0, or 1 after printing the error.
int plot_command(const std::vector<std::string>& files, std::string output);

}  // namespace napkin::tools
