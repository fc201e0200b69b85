// Human-readable quantities for messages and reports: "1.23 GFLOP",
// "2.00 MiB", "3.4 ms", "124,439,808". In ir because diagnostics from every
// later stage (a pass's error, the report, the driver) print them the same way.
#pragma once

#include <string>

namespace napkin::ir {

std::string human_flops(double flops);
std::string human_bytes(double bytes);
std::string human_seconds(double seconds);
std::string with_commas(double n);

}  // namespace napkin::ir
