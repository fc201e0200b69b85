// `napkin graph --dot` (report/graph_dot.h): well-formed DOT for every
// built-in model (balanced braces, every edge endpoint declared, one cluster
// per phase) with the fusion groups as nested clusters, and none with
// --no-fuse.
#include <doctest/doctest.h>

#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "ir/fusion_group.h"
#include "report/graph_dot.h"
#include "support/test_models.h"

using namespace napkin;

namespace {

int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// Braces outside string literals balance and never go negative.
bool balanced(const std::string& dot) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < dot.size(); ++i) {
    char c = dot[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    if (c == '{') ++depth;
    if (c == '}' && --depth < 0) return false;
  }
  return depth == 0 && !in_string;
}

}  // namespace

TEST_CASE("graph --dot: every model is well-formed DOT with phase clusters and its fusion groups") {
  for (const auto& model : testing::model_files()) {
    CAPTURE(model.stem().string());
    ir::Graph g = testing::compile_small_model(model);
    std::string dot = report::graph_dot(g);
    CHECK(dot.rfind("digraph \"", 0) == 0);
    CHECK(balanced(dot));
    std::set<std::string> declared;
    std::regex decl(R"(^\s*([nv]\d+) \[)");
    std::regex edge(R"(^\s*([nv]\d+) -> ([nv]\d+);$)");
    std::istringstream lines(dot);
    std::string line;
    std::vector<std::pair<std::string, std::string>> edges;
    std::smatch m;
    while (std::getline(lines, line)) {
      if (std::regex_search(line, m, decl)) declared.insert(m[1]);
      if (std::regex_match(line, m, edge)) edges.emplace_back(m[1], m[2]);
    }
    CHECK(!edges.empty());
    for (const auto& [from, to] : edges) {
      CHECK(declared.count(from) == 1);
      CHECK(declared.count(to) == 1);
    }
    CHECK(count(dot, "subgraph cluster_forward {") == 1);
    CHECK(count(dot, "subgraph cluster_backward {") == 1);
    CHECK(count(dot, "subgraph cluster_update {") == 1);
    size_t groups = ir::fusion_groups(g).groups.size();
    CHECK(groups > 0);
    CHECK(count(dot, "subgraph cluster_fused_") == static_cast<int>(groups));
    std::string plain = report::graph_dot(g, {false});
    CHECK(balanced(plain));
    CHECK(count(plain, "cluster_fused_") == 0);
  }
}
