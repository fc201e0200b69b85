// User-facing diagnostics: "file:line:col: error: message", the source line,
// a caret under the column, and a hint that says what to do.
//
// Every IR node keeps the SourceLoc of the YAML text it came from, so an error
// found by a late pass still points at the model file. Diagnostics collects
// every error of a run (a model reports all its mistakes at once) and renders
// them in order of location.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace napkin::ir {

struct SourceLoc {
  std::shared_ptr<const std::string> file;  // path as the user gave it; null: no location
  int line = 0;                             // 1-based; 0: unknown
  int col = 0;                              // 1-based; 0: whole line
  bool known() const { return file && line > 0; }
  // Moves the column right by `chars` (for positions inside an expression string).
  SourceLoc shifted(int chars) const;
};

enum class Severity { Error, Warning };

struct Diagnostic {
  Severity severity = Severity::Error;
  SourceLoc loc;
  std::string message;
  std::string hint;  // what to do next; may be empty
};

class Diagnostics {
 public:
  // Registers the text of a file so rendered errors can quote its lines.
  void add_source(const std::string& file, std::string text);
  // The lines of a registered file, without line endings ('\n', '\r\n');
  // null if the file is not registered.
  const std::vector<std::string>* source_lines(const std::string& file) const;

  void error(const SourceLoc& loc, std::string message, std::string hint = "");
  void warning(const SourceLoc& loc, std::string message, std::string hint = "");

  bool has_errors() const { return error_count_ > 0; }
  int error_count() const { return error_count_; }
  const std::vector<Diagnostic>& all() const { return diagnostics_; }

  // All diagnostics sorted by file position (stable for equal positions), each as
  //   file:line:col: error: message
  //     <source line>
  //     <caret>
  //     hint: ...
  std::string render() const;
  std::string render_one(const Diagnostic& d) const;

 private:
  std::map<std::string, std::vector<std::string>> source_lines_;
  std::vector<Diagnostic> diagnostics_;
  int error_count_ = 0;
};

}  // namespace napkin::ir
