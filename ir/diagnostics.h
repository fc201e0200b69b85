// User-facing diagnostics: "file:line:col: error: message", the source line,
// a caret under the column, and a hint that says what to do.
//
// Every IR node keeps the SourceLoc of the YAML text it came from, so an error
// found by a late pass still points at the model file. Diagnostics collects
// every error of a run (a model reports all its mistakes at once) and renders
// them in order of location.
//
// Model text reaches the terminal only through render(): it shows control
// characters escaped (an ESC as \x1b, a NUL as \x00; only a quoted line keeps
// its tabs) and bytes that are not UTF-8 as \xNN, quotes a long line as a
// window of at most 160 characters around the column ("..." where cut), and
// leaves out the middle of a message or hint longer than 1000 characters.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace napkin::ir {

// The length (1 to 4) of the well-formed UTF-8 sequence that starts at
// text[i], or 0 if none does (a stray or truncated byte, an overlong form, a
// surrogate); and the code point of such a sequence. The renderer escapes
// what is not UTF-8; the frontend rejects a model file that is not.
size_t utf8_sequence_length(std::string_view text, size_t i);
uint32_t utf8_code_point(std::string_view text, size_t i, size_t length);

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
  //     <source line, or a window of it around the column>
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
