// The error a node's data causes (an id out of range, an integer division by
// zero), for the interpreter's kernels and its elementwise arithmetic alike.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "ir/graph.h"

namespace napkin::interp::detail {

// Throws std::runtime_error "<op> (node N, file:line): what".
[[noreturn]] inline void fail(const ir::Node& n, const std::string& what) {
  std::string where = fmt::format("node {}", n.id);
  if (n.loc.known()) where += fmt::format(", {}:{}", *n.loc.file, n.loc.line);
  throw std::runtime_error(fmt::format("{} ({}): {}", ir::op_name(n.op), where, what));
}

// A class, row or expert id, checked against [0, bound).
inline int64_t checked_id(const ir::Node& n, double id, int64_t bound, const char* what) {
  if (!(id >= 0 && id < static_cast<double>(bound)))
    fail(n, fmt::format("{} {} is out of range [0, {})", what, id, bound));
  return static_cast<int64_t>(id);
}

}  // namespace napkin::interp::detail
