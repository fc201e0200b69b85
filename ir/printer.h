// The stable text form of the IR, behind `napkin ir` and the golden tests.
// One line per input, parameter and node in schedule order, each with its
// type, view layout where it is a view, and the YAML location it came from.
#pragma once

#include <map>
#include <string>

#include "ir/graph.h"

namespace napkin::ir {

struct PrintOptions {
  bool locations = true;  // "# file:line:col" comments
};

std::string print_graph(const Graph& g, const PrintOptions& options = {});

// The printed name of a value: %name when unique, %name.id when reused, %id when unnamed.
class ValueNamer {
 public:
  explicit ValueNamer(const Graph& g);
  std::string operator()(ValueId v) const;

 private:
  const Graph& g_;
  std::map<std::string, int> uses_;
};

}  // namespace napkin::ir
