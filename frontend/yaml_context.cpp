#include "frontend/yaml_context.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <set>

#include "frontend/suggest.h"

namespace napkin::frontend {

std::string to_file_columns(const std::string& message, int first_column) {
  if (first_column <= 0) return message;
  static const std::string kWord = "column ";
  std::string out;
  size_t pos = 0;
  for (size_t hit; (hit = message.find(kWord, pos)) != std::string::npos;) {
    size_t digits = hit + kWord.size(), end = digits;
    while (end < message.size() && std::isdigit(static_cast<unsigned char>(message[end]))) ++end;
    out += message.substr(pos, digits - pos);
    if (end > digits) out += std::to_string(std::stoi(message.substr(digits, end - digits)) + first_column - 1);
    pos = end;
  }
  return out + message.substr(pos);
}

YamlContext::YamlContext(std::string path, const std::string& text, ir::Diagnostics& diag)
    : file_(std::make_shared<const std::string>(std::move(path))), diag_(diag) {
  if (!diag_.source_lines(*file_)) diag_.add_source(*file_, text);
  lines_ = diag_.source_lines(*file_);
}

ir::SourceLoc YamlContext::loc(const YAML::Node& node) const {
  YAML::Mark m = node.Mark();
  if (m.is_null()) return {file_, 0, 0};
  ir::SourceLoc l{file_, m.line + 1, m.column + 1};
  const std::vector<std::string>& lines = *lines_;
  // An empty value ("loss:" and nothing after it) is marked where the next token
  // starts: the next line, or past the end of the file. The value belongs right
  // after the colon, at the end of the last non-blank line before that.
  auto blank_before = [&](int line, int col) {
    if (line > static_cast<int>(lines.size())) return true;
    const std::string& text = lines[line - 1];
    return text.substr(0, std::min<size_t>(col - 1, text.size())).find_first_not_of(" \t") == std::string::npos;
  };
  if (node.IsNull() && blank_before(l.line, l.col)) {
    for (int line = std::min<int>(l.line - 1, lines.size()); line >= 1; --line) {
      const std::string& text = lines[line - 1];
      size_t end = text.find_last_not_of(" \t\r");
      if (end == std::string::npos) continue;
      return {file_, line, static_cast<int>(end) + 2};
    }
  }
  return l;
}

ir::SourceLoc YamlContext::text_loc(const YAML::Node& node) const {
  ir::SourceLoc l = loc(node);
  if (l.line > 0 && l.line <= static_cast<int>(lines_->size())) {
    const std::string& line = (*lines_)[l.line - 1];
    if (l.col > 0 && l.col <= static_cast<int>(line.size()) && (line[l.col - 1] == '"' || line[l.col - 1] == '\''))
      l.col += 1;
  }
  return l;
}

void YamlContext::error(const YAML::Node& node, std::string message, std::string hint) {
  diag_.error(loc(node), std::move(message), std::move(hint));
}

bool YamlContext::check_name_text(const YAML::Node& node, const std::string& name, const std::string& what,
                                  const std::string& hint) {
  for (size_t i = 0; i < name.size();) {
    size_t length = std::max<size_t>(ir::utf8_sequence_length(name, i), 1);
    uint32_t cp = ir::utf8_code_point(name, i, length);
    if (cp < 0x20 || (cp >= 0x7F && cp <= 0x9F)) {
      error(node, fmt::format("{} '{}' holds a control character", what, name), hint);
      return false;
    }
    i += length;
  }
  return true;
}

bool YamlContext::path_text(const YAML::Node& node, const std::string& what, std::string& out) {
  std::string text;
  if (!scalar_text(node, what, text)) return false;
  if (text.empty()) {
    error(node, fmt::format("{} is empty", what), "name a file or directory, or leave the key out");
    return false;
  }
  if (!check_name_text(node, text, what, "the trainer opens this path and prints it: rename it without control characters"))
    return false;
  out = text;
  return true;
}

bool YamlContext::check_keys(const YAML::Node& map, const std::vector<std::string>& allowed,
                             const std::string& what) {
  return check_map(map, &allowed, what);
}

bool YamlContext::check_mapping(const YAML::Node& map, const std::string& what) {
  return check_map(map, nullptr, what);
}

bool YamlContext::check_map(const YAML::Node& map, const std::vector<std::string>* allowed, const std::string& what) {
  if (!map.IsMap()) {
    error(map, fmt::format("{} must be a mapping of keys to values", what),
          allowed ? fmt::format("write it as key: value lines; allowed keys: {}", fmt::join(*allowed, ", "))
                  : "write it as name: value lines");
    return false;
  }
  std::set<std::string> seen;
  for (auto it = map.begin(); it != map.end(); ++it) {
    if (!it->first.IsScalar()) {
      error(it->first, fmt::format("keys of {} must be plain names", what), "write name: value");
      continue;
    }
    std::string key = it->first.Scalar();
    if (!allowed && !check_name_text(it->first, key, fmt::format("the {} key", what))) continue;
    if (!seen.insert(key).second) {
      error(it->first, fmt::format("duplicate key '{}' in {}", key, what), "remove one of them");
      continue;
    }
    if (allowed && std::find(allowed->begin(), allowed->end(), key) == allowed->end()) {
      // Inside { }, a comma ends a value: normal(0.1, std=0.2) unquoted splits in two
      // and its tail arrives here as a "key".
      bool split_expression = key.find_first_of("()=[]") != std::string::npos;
      error(it->first, fmt::format("unknown key '{}' in {}{}", key, what, did_you_mean(key, *allowed)),
            split_expression ? "inside { }, a comma ends the value: quote expressions that contain commas, "
                               "e.g. init: \"normal(0.1, std=0.2)\""
            : allowed->empty() ? "nothing is allowed here"
                               : fmt::format("allowed keys: {}", fmt::join(*allowed, ", ")));
    }
  }
  return true;
}

bool YamlContext::scalar_text(const YAML::Node& node, const std::string& what, std::string& out) {
  if (node.IsNull()) {
    error(node, fmt::format("{} is empty", what), "write the value after the colon");
    return false;
  }
  if (!node.IsScalar()) {
    error(node, fmt::format("{} must be a single value, not a {}", what, node.IsMap() ? "mapping" : "list"),
          "quote it if it contains brackets or braces: key: \"f(x, [1, 2])\"");
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
      diag_.error(base.shifted(e.offset), fmt::format("in {}: {}", what, to_file_columns(e.message, base.col)),
                  "expressions are Python-like: f(x, key=value), a @ b, x[0, 1:3]; brackets and quotes must pair up");
  }
  return std::move(r.expr);
}

}  // namespace napkin::frontend
