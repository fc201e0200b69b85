#include "frontend/model_source.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/parser.h>

#include <cerrno>
#include <cstring>
#include <sstream>
#include <vector>

#include "frontend/frontend.h"

namespace napkin::frontend {

namespace {

const char* kPathHint = "check the path; models/ holds the built-in examples";

// What a path names when it is not a regular file, for the message.
const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (a named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// `bytes`: the file's size, or 0 when it grew past the limit while being read.
void report_too_large(const ir::SourceLoc& at, int64_t bytes, ir::Diagnostics& diag) {
  diag.error(at,
             fmt::format("the model file is larger than the limit of {} MiB ({} bytes) for a model file{}",
                         kMaxModelFileBytes >> 20, kMaxModelFileBytes,
                         bytes > 0 ? fmt::format(": it has {} bytes", bytes) : ""),
             "a model file is YAML of a few KB: check that this is the model and not a data file");
}

}  // namespace

std::optional<std::string> read_model_file(const std::string& path, ir::Diagnostics& diag) {
  const ir::SourceLoc at{std::make_shared<const std::string>(path), 0, 0};
  auto cannot_open = [&](int error) {
    diag.error(at, fmt::format("cannot open the model file: {}", std::strerror(error)), kPathHint);
    return std::nullopt;
  };
  auto not_a_file = [&](mode_t mode) {
    diag.error(at, fmt::format("the model path is {}, not a file", file_kind(mode)),
               "give the path of a .yaml model file (a pipe or device is not read: save its text to a file first)");
    return std::nullopt;
  };
  // stat before open: opening a FIFO for reading blocks until a writer comes,
  // and opening a device can have effects of its own.
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return cannot_open(errno);
  if (!S_ISREG(st.st_mode)) return not_a_file(st.st_mode);
  if (st.st_size > kMaxModelFileBytes) {
    report_too_large(at, st.st_size, diag);
    return std::nullopt;
  }
  // O_NONBLOCK and a second look at what was opened: the path may name
  // something else by now.
  int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return cannot_open(errno);
  std::string text;
  bool too_large = false;
  int read_error = 0;
  if (::fstat(fd, &st) != 0) {
    read_error = errno;
  } else if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return not_a_file(st.st_mode);
  } else {
    // Stop once past the limit: a file that grows meanwhile is refused as
    // well, not read without end.
    char buffer[1 << 16];
    while (text.size() <= static_cast<size_t>(kMaxModelFileBytes)) {
      ssize_t n = ::read(fd, buffer, sizeof buffer);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) read_error = errno;
      if (n <= 0) break;
      text.append(buffer, static_cast<size_t>(n));
    }
    too_large = text.size() > static_cast<size_t>(kMaxModelFileBytes);
  }
  ::close(fd);
  if (read_error) {
    diag.error(at, fmt::format("cannot read the model file: {}", std::strerror(read_error)), kPathHint);
    return std::nullopt;
  }
  if (too_large) {
    report_too_large(at, 0, diag);
    return std::nullopt;
  }
  return text;
}

namespace {

// yaml-cpp's messages name the parser state ("illegal flow end"); the hint says
// what usually causes each in a hand-written model file.
std::string yaml_syntax_hint(const std::string& msg) {
  static const std::vector<std::pair<std::string, std::string>> hints = {
      {"illegal tab", "YAML indents with spaces only: replace the tab with spaces"},
      {"illegal flow end", "this ']' or '}' does not match the bracket it closes: '[' pairs with ']', '{' with '}'"},
      {"end of sequence flow not found", "a '[' is never closed: add the matching ']'"},
      {"end of map flow not found", "a '{' is never closed: add the matching '}'"},
      {"illegal map value",
       "a ':' where no key can start: indent this line like the keys above it, or quote a value that contains ': '"},
      {"end of map not found", "indent this line like the other keys of its mapping"},
      {"end of sequence not found", "indent this '- ' entry like the other entries of its list"},
      {"illegal block entry", "a '- ' entry where a value is expected: check the indentation of this line"},
      {"illegal EOF in scalar", "a quoted string is never closed: add the closing quote"},
      {"unknown escape character", "inside double quotes write a backslash as \\\\, or use single quotes"},
  };
  for (const auto& [key, hint] : hints)
    if (msg.find(key) != std::string::npos) return hint;
  return "check indentation, colons and brackets around this point";
}

// yaml-cpp reports an unclosed '[' or '{' where it gives up, often the next
// key or past the end of the file. Scanning the text up to that point finds the
// bracket that is still open, which is where the fix goes. Returns 0-based
// (line, column), or (-1, -1) if none is open.
std::pair<int, int> open_flow_bracket(const std::string& text, int stop_line, int stop_col) {
  std::vector<std::pair<int, int>> open;
  char quote = 0;
  int line = 0, col = 0;
  for (size_t i = 0; i < text.size() && (line < stop_line || (line == stop_line && col < stop_col)); ++i) {
    char c = text[i];
    char before = i > 0 ? text[i - 1] : '\n';
    bool token_start = before == ' ' || before == '\t' || before == '\n' || before == '[' || before == '{' ||
                       before == ',' || before == ':';
    if (c == '\n') {
      quote = 0;  // quoted scalars spanning lines are rare in model files; don't let one stray quote run on
      ++line;
      col = 0;
      continue;
    }
    ++col;
    if (quote) {
      if (c == '\\' && quote == '"') ++i, ++col;
      else if (c == quote) quote = 0;
    } else if ((c == '"' || c == '\'') && token_start) {
      quote = c;
    } else if (c == '#' && (before == ' ' || before == '\t' || before == '\n')) {
      while (i + 1 < text.size() && text[i + 1] != '\n') ++i;  // a comment runs to the end of the line
    } else if (c == '[' || c == '{') {
      open.emplace_back(line, col - 1);
    } else if ((c == ']' || c == '}') && !open.empty()) {
      open.pop_back();
    }
  }
  return open.empty() ? std::pair{-1, -1} : open.back();
}

// YAML (1.2, section 5.1) allows tab, line feed, carriage return, NEL and the
// printable characters; the rest are controls that would otherwise surface
// as a confusing syntax error ("unknown escape character" for a NUL) or, in
// names and reports, as terminal escapes.
bool yaml_allows(uint32_t cp) {
  if (cp == '\t' || cp == '\n' || cp == '\r' || cp == 0x85) return true;
  return !(cp < 0x20 || (cp >= 0x7F && cp <= 0x9F) || cp == 0xFFFE || cp == 0xFFFF);
}

// The first byte of the text that is not UTF-8 or a character YAML forbids,
// reported at its line and (byte) column, as yaml-cpp and the renderer count.
bool report_bad_character(const std::string& text, YamlContext& ctx) {
  int line = 1;
  size_t line_start = 0;
  for (size_t i = 0; i < text.size();) {
    size_t length = ir::utf8_sequence_length(text, i);
    ir::SourceLoc at{ctx.file(), line, static_cast<int>(i - line_start) + 1};
    if (length == 0) {
      ctx.diag().error(at, "the model file is not valid UTF-8 here", "save the file as UTF-8 text");
      return true;
    }
    uint32_t cp = ir::utf8_code_point(text, i, length);
    if (cp == 0) {
      ctx.diag().error(at, "the model file holds a NUL byte here, which YAML does not allow",
                       "a model file is UTF-8 text: is this a binary file, or text saved as UTF-16?");
      return true;
    }
    if (!yaml_allows(cp)) {
      ctx.diag().error(at,
                       fmt::format("the model file holds the control character {} here, which YAML does not allow",
                                   cp < 0x80 ? fmt::format("\\x{:02x}", cp) : fmt::format("U+{:04X}", cp)),
                       "remove it; inside double quotes YAML writes one as an escape such as \"\\e\" or \"\\x1b\"");
      return true;
    }
    if (cp == '\n') {
      ++line;
      line_start = i + 1;
    }
    i += length;
  }
  return false;
}

// Records where each document of a YAML stream starts, and nothing else.
class DocumentStarts : public YAML::EventHandler {
 public:
  std::vector<YAML::Mark> marks;
  void OnDocumentStart(const YAML::Mark& mark) override { marks.push_back(mark); }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t, const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}
};

// A second document needs a '---' or '...' marker at the start of a line;
// most model files have none, and are not parsed a second time.
bool has_document_marker(const std::string& text) {
  for (size_t at = 0; at < text.size(); ++at) {
    if (text.compare(at, 3, "---") == 0 || text.compare(at, 3, "...") == 0) return true;
    at = text.find('\n', at);
    if (at == std::string::npos) break;
  }
  return false;
}

void report_syntax_error(const YAML::Exception& e, const std::string& text, YamlContext& ctx) {
  ir::SourceLoc at{ctx.file(), e.mark.line + 1, e.mark.column + 1};
  if (e.msg.find("flow not found") != std::string::npos) {
    auto [line, col] = open_flow_bracket(text, e.mark.line, e.mark.column);
    if (line >= 0) at = {ctx.file(), line + 1, col + 1};
  }
  ctx.diag().error(at, fmt::format("YAML syntax: {}", e.msg), yaml_syntax_hint(e.msg));
}

}  // namespace

std::optional<YAML::Node> parse_model_document(const std::string& text, YamlContext& ctx) {
  if (report_bad_character(text, ctx)) return std::nullopt;
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    report_syntax_error(e, text, ctx);
    return std::nullopt;
  }
  // YAML::Load reads the first document and ignores the rest: a second one
  // (often two model files pasted together) would be dropped without a word.
  if (has_document_marker(text)) {
    std::istringstream in(text);
    YAML::Parser parser(in);
    DocumentStarts documents;
    try {
      while (documents.marks.size() < 2 && parser.HandleNextDocument(documents)) {}
    } catch (const YAML::Exception& e) {
      // A syntax error inside the second document still leaves its start;
      // one between the documents is an error of its own.
      if (documents.marks.size() < 2) {
        report_syntax_error(e, text, ctx);
        return std::nullopt;
      }
    }
    if (documents.marks.size() >= 2) {
      const YAML::Mark& second = documents.marks[1];
      ctx.diag().error({ctx.file(), second.line + 1, second.column + 1},
                       "a model file holds one YAML document; this is a second one",
                       "delete from here to the end of the file, or put the second model in a file of its own");
      return std::nullopt;
    }
  }
  return root;
}

}  // namespace napkin::frontend
