#include "frontend/yaml_context.h"

#include <fmt/format.h>

#include <set>
#include <sstream>

#include "frontend/suggest.h"

namespace napkin::frontend {

YamlContext::YamlContext(std::string path, const std::string& text, ir::Diagnostics& diag)
    : file_(std::make_shared<const std::string>(std::move(path))), diag_(diag) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines_.push_back(line);
}

ir::SourceLoc YamlContext::loc(const YAML::Node& node) const {
  YAML::Mark m = node.Mark();
  if (m.is_null()) return {file_, 0, 0};
  return {file_, m.line + 1, m.column + 1};
}

ir::SourceLoc YamlContext::text_loc(const YAML::Node& node) const {
  ir::SourceLoc l = loc(node);
  if (l.line > 0 && l.line <= static_cast<int>(lines_.size())) {
    const std::string& line = lines_[l.line - 1];
    if (l.col > 0 && l.col <= static_cast<int>(line.size()) && (line[l.col - 1] == '"' || line[l.col - 1] == '\''))
      l.col += 1;
  }
  return l;
}

void YamlContext::error(const YAML::Node& node, std::string message, std::string hint) {
  diag_.error(loc(node), std::move(message), std::move(hint));
}

bool YamlContext::check_keys(const YAML::Node& map, const std::vector<std::string>& allowed,
                             const std::string& what) {
  if (!map.IsMap()) {
    error(map, fmt::format("{} must be a mapping of keys to values", what),
          fmt::format("write it as key: value lines; allowed keys: {}", fmt::join(allowed, ", ")));
    return false;
  }
  std::set<std::string> seen;
  for (auto it = map.begin(); it != map.end(); ++it) {
    if (!it->first.IsScalar()) {
      error(it->first, fmt::format("keys of {} must be plain names", what));
      continue;
    }
    std::string key = it->first.Scalar();
    if (!seen.insert(key).second) {
      error(it->first, fmt::format("duplicate key '{}' in {}", key, what), "remove one of them");
      continue;
    }
    if (!allowed.empty() && std::find(allowed.begin(), allowed.end(), key) == allowed.end())
      error(it->first, fmt::format("unknown key '{}' in {}{}", key, what, did_you_mean(key, allowed)),
            fmt::format("allowed keys: {}", fmt::join(allowed, ", ")));
  }
  return true;
}

bool YamlContext::scalar_text(const YAML::Node& node, const std::string& what, std::string& out) {
  if (!node.IsScalar()) {
    error(node, fmt::format("{} must be a single value, not a {}", what,
                            node.IsMap() ? "mapping" : node.IsSequence() ? "list" : "null"));
    return false;
  }
  out = node.Scalar();
  return true;
}

ExprPtr YamlContext::parse_scalar_expr(const YAML::Node& node, const std::string& what) {
  std::string text;
  if (!scalar_text(node, what, text)) return nullptr;
  ParseResult r = parse_expression(text);
  if (!r.expr) {
    ir::SourceLoc base = text_loc(node);
    for (const ParseError& e : r.errors)
      diag_.error(base.shifted(e.offset), fmt::format("in {}: {}", what, e.message));
  }
  return std::move(r.expr);
}

}  // namespace napkin::frontend
