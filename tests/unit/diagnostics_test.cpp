// The diagnostics renderer: model text reaches the terminal only through it,
// so it must never echo a raw control byte (in the quoted line, the message,
// the hint or the file name), must quote a long line as a window around the
// column with the caret under the right character, and must cut a huge message.
#include <doctest/doctest.h>

#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include "ir/diagnostics.h"

using napkin::ir::Diagnostics;
using napkin::ir::SourceLoc;

namespace {

SourceLoc at(const std::string& file, int line, int col) { return {std::make_shared<const std::string>(file), line, col}; }

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// No byte below 0x20 but the line breaks and tabs that the renderer writes
// itself, no DEL, no C1 control (U+0080..U+009F, C2 80..C2 9F in UTF-8).
bool has_raw_control(const std::string& text) {
  for (size_t i = 0; i < text.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(text[i]);
    if ((c < 0x20 && c != '\n' && c != '\t') || c == 0x7F) return true;
    if (c == 0xC2 && i + 1 < text.size() && static_cast<unsigned char>(text[i + 1]) <= 0x9F) return true;
  }
  return false;
}

}  // namespace

TEST_CASE("diagnostics: control bytes in the quoted line and the message are shown escaped") {
  Diagnostics diag;
  diag.add_source("m.yaml", "a: 1\nname: \"x\x1b[2Jy\"\x01\x7f \xc2\x9b end\n");
  diag.error(at("m.yaml", 2, 16), "unknown name 'x\x1b[2Jy' \x00z", "not \x07 this");
  const std::string out = diag.render();
  INFO(out);
  CHECK_FALSE(has_raw_control(out));
  const std::vector<std::string> lines = lines_of(out);
  REQUIRE(lines.size() >= 4);
  CHECK(lines[0] == "m.yaml:2:16: error: unknown name 'x\\x1b[2Jy' ");  // a NUL ends a C string message
  CHECK(lines[1] == "    name: \"x\\x1b[2Jy\"\\x01\\x7f \\u009b end");
  // Column 16 is the \x7f byte: the caret stands under its escape, after the
  // three shown characters of each escape before it.
  CHECK(lines[2] == "    " + std::string(lines[1].find("\\x7f") - 4, ' ') + "^");
  CHECK(lines[3] == "    hint: not \\x07 this");
}

TEST_CASE("diagnostics: a NUL and newlines inside a message are escaped too") {
  Diagnostics diag;
  diag.error(at("m.yaml", 0, 0), std::string("a\0b\nc\td", 7), "");
  CHECK(diag.render() == "m.yaml: error: a\\x00b\\nc\\td\n1 error generated.\n");
}

TEST_CASE("diagnostics: bytes that are not UTF-8 are shown in hex - valid UTF-8 is kept") {
  Diagnostics diag;
  diag.add_source("m.yaml", "k: \xff\xfe caf\xc3\xa9 \xe2\x82\xac\n");
  diag.error(at("m.yaml", 1, 13), "here", "");  // the euro sign, after two escapes and the two-byte e-acute
  const std::vector<std::string> lines = lines_of(diag.render());
  REQUIRE(lines.size() >= 3);
  CHECK(lines[1] == "    k: \\xff\\xfe caf\xc3\xa9 \xe2\x82\xac");
  // Shown before the euro sign: "k: " (3) + two 4-character escapes + " caf" + one e-acute + " ".
  CHECK(lines[2] == "    " + std::string(3 + 8 + 4 + 1 + 1, ' ') + "^");
}

TEST_CASE("diagnostics: the file name is escaped") {
  Diagnostics diag;
  diag.error(at("evil\x1b]0;title\x07.yaml", 0, 0), "cannot open the model file", "");
  CHECK(diag.render().rfind("evil\\x1b]0;title\\x07.yaml: error: cannot open", 0) == 0);
}

TEST_CASE("diagnostics: a 10 MB line is quoted as a window around the column with the caret under it") {
  const size_t size = 10 << 20;
  std::string line(size, 'a');
  const size_t marked = size / 2;  // 0-based byte of the mistake
  line.replace(marked, 5, "WRONG");
  for (size_t i = 0; i < size; i += 97) if (i < marked - 200 || i > marked + 200) line[i] = '\x1b';
  Diagnostics diag;
  diag.add_source("big.yaml", "x: 1\n" + line + "\n");
  diag.error(at("big.yaml", 2, static_cast<int>(marked) + 1), "bad value", "fix it");
  const std::string out = diag.render();
  CHECK(out.size() < 1000);
  const std::vector<std::string> lines = lines_of(out);
  REQUIRE(lines.size() == 5);
  const std::string& quoted = lines[1];
  const std::string& caret = lines[2];
  CHECK(quoted.rfind("    ...", 0) == 0);
  CHECK(quoted.size() == 4 + 3 + 160 + 3);
  CHECK(quoted.substr(quoted.size() - 3) == "...");
  CHECK(caret.size() == quoted.find("WRONG") + 1);
  CHECK(caret.back() == '^');
  CHECK(caret.find_first_not_of(' ') == caret.size() - 1);
}

TEST_CASE("diagnostics: long lines are cut only where needed") {
  std::string line = std::string(300, 'b') + "X";
  Diagnostics diag;
  diag.add_source("m.yaml", line + "\n" + std::string(150, 'c') + "\n" + "c: " + std::string(400, 'd') + "\n");
  diag.error(at("m.yaml", 1, 301), "at the end", "");
  diag.error(at("m.yaml", 2, 150), "short line", "");
  diag.error(at("m.yaml", 3, 1), "at the start", "");
  diag.error(at("m.yaml", 1, 302), "past the end", "");
  const std::vector<std::string> lines = lines_of(diag.render());
  REQUIRE(lines.size() == 13);
  // The end of a long line: cut on the left only, the caret under the X.
  CHECK(lines[1] == "    ..." + std::string(159, 'b') + "X");
  CHECK(lines[2] == std::string(4 + 3 + 159, ' ') + "^");
  // Past the end of the line: the caret just after it.
  CHECK(lines[4] == "    ..." + std::string(158, 'b') + "X");
  CHECK(lines[5] == std::string(4 + 3 + 159, ' ') + "^");
  // A line of 150 characters is quoted whole.
  CHECK(lines[7] == "    " + std::string(150, 'c'));
  CHECK(lines[8] == std::string(4 + 149, ' ') + "^");
  // The start of a long line: cut on the right only.
  CHECK(lines[10] == "    c: " + std::string(157, 'd') + "...");
  CHECK(lines[11] == "    ^");
}

TEST_CASE("diagnostics: a message quoting a huge name is cut in the middle") {
  Diagnostics diag;
  diag.error(at("m.yaml", 0, 0), "unknown name '" + std::string(5 << 20, 'n') + "'; did you mean 'm'?", "");
  const std::string out = diag.render();
  CHECK(out.size() < 1200);
  CHECK(out.rfind("m.yaml: error: unknown name 'nnn", 0) == 0);
  CHECK(out.find(" characters left out) ... ") != std::string::npos);
  CHECK(out.find("nnn'; did you mean 'm'?\n") != std::string::npos);
}
