#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "ir/internal_check.h"
#include "ir/printer.h"
#include "ir/verifier.h"
#include "passes/pass.h"

namespace napkin::passes {

void verify_or_die(const ir::Graph& g, std::string_view after) {
  std::vector<std::string> problems = ir::verify(g);
  NAPKIN_INTERNAL_CHECK(problems.empty(), "the IR is malformed after {}:\n  {}", after, fmt::join(problems, "\n  "));
}

std::vector<std::string> PassManager::pass_names() const {
  std::vector<std::string> names;
  for (const auto& p : passes_) names.emplace_back(p->name());
  return names;
}

bool PassManager::run(ir::Graph& g, ir::Diagnostics& diag) {
  std::vector<std::string> names = pass_names();
  for (const std::string& wanted : options_.print_after)
    if (wanted != "all" && std::find(names.begin(), names.end(), wanted) == names.end())
      diag.error({}, fmt::format("--print-after: there is no pass '{}'", wanted),
                 fmt::format("passes: {} (or all)", fmt::join(names, ", ")));
  if (diag.has_errors()) return false;
  verify_or_die(g, "the frontend");
  for (const auto& pass : passes_) {
    auto start = std::chrono::steady_clock::now();
    bool changed = pass->run(g, diag);
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (diag.has_errors()) return false;
    verify_or_die(g, fmt::format("pass '{}'", pass->name()));
    if (options_.trace && options_.time_passes)
      *options_.trace << fmt::format("pass {:<20} {:8.3f} ms  {}\n", pass->name(), ms, changed ? "changed" : "unchanged");
    const auto& pa = options_.print_after;
    if (options_.trace && (std::find(pa.begin(), pa.end(), pass->name()) != pa.end() ||
                           std::find(pa.begin(), pa.end(), "all") != pa.end()))
      *options_.trace << fmt::format("// IR after {}\n{}", pass->name(), ir::print_graph(g));
  }
  return true;
}

}  // namespace napkin::passes
