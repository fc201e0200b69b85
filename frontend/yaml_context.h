// Helpers shared by the frontend's readers: YAML marks to SourceLocs, key
// validation with suggestions, and parsing of expression scalars with their
// exact columns. Internal to frontend/ (it exposes yaml-cpp types).
#pragma once

#include <yaml-cpp/yaml.h>

#include <memory>
#include <string>
#include <vector>

#include "frontend/expr_ast.h"
#include "ir/diagnostics.h"

namespace napkin::frontend {

// Parser messages count columns inside the string they parse ("the call to 'f'
// opened at column 1"); in the file that string starts at `first_column`, and
// a column that disagrees with the caret confuses. Rewrites each "column N" to
// the file's column. Unchanged if first_column is unknown (0).
std::string to_file_columns(const std::string& message, int first_column);

class YamlContext {
 public:
  // Registers `text` with diag unless the file already is: the lines quoted in
  // errors and the lines read here are one copy.
  YamlContext(std::string path, const std::string& text, ir::Diagnostics& diag);

  ir::Diagnostics& diag() { return diag_; }
  const std::shared_ptr<const std::string>& file() const { return file_; }

  // Location of a node (1-based line and column).
  ir::SourceLoc loc(const YAML::Node& node) const;
  // Location of the first character of a scalar's text (after an opening quote).
  ir::SourceLoc text_loc(const YAML::Node& node) const;

  void error(const YAML::Node& node, std::string message, std::string hint = "");

  // Reports keys of `map` not in `allowed` (with a suggestion) and keys given twice.
  // Returns false if `map` is not a mapping (reported as an error naming `what`).
  bool check_keys(const YAML::Node& map, const std::vector<std::string>& allowed, const std::string& what);
  // The same for a mapping whose keys are the user's names (dims, params, blocks):
  // any key, but each once.
  bool check_mapping(const YAML::Node& map, const std::string& what);

  // Parses a scalar as an expression; reports syntax errors at their exact column.
  // Returns null on error (already reported) or if the node is not a scalar.
  ExprPtr parse_scalar_expr(const YAML::Node& node, const std::string& what);

  // Reports a name (a key of a mapping of the user's names, the model's name)
  // that holds a control character, and returns false: names reach the IR and
  // reports, which print them as they are.
  bool check_name_text(const YAML::Node& node, const std::string& name, const std::string& what,
                       const std::string& hint = "names appear in reports and the IR: write them with letters, digits and _");
  // A path the trainer opens and prints (a data file, the checkpoint or
  // metrics location): the scalar's text, which must be non-empty and free of
  // control characters; else reports it and returns false.
  bool path_text(const YAML::Node& node, const std::string& what, std::string& out);

  // The scalar's text, or reports "<what> must be a single value" and returns false.
  bool scalar_text(const YAML::Node& node, const std::string& what, std::string& out);

 private:
  std::shared_ptr<const std::string> file_;
  const std::vector<std::string>* lines_ = nullptr;  // owned by diag_
  bool check_map(const YAML::Node& map, const std::vector<std::string>* allowed, const std::string& what);
  ir::Diagnostics& diag_;
};

}  // namespace napkin::frontend
