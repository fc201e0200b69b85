// The diagnostics corpus: every tests/errors/*.yaml is a bad model with one
// class of mistake (one file has several). Each starts with lines
//   # expect: LINE:COL: MESSAGE-SUBSTRING
// and `napkin report` on it must exit with status 1 and print exactly those
// errors, each as
//   tests/errors/x.yaml:LINE:COL: error: ...MESSAGE-SUBSTRING...
//       <the source line>
//       <a caret under COL>
//       hint: <what to do>
// No other error may appear (one mistake, one message: no cascades), and
// nothing may be an internal error or a crash. A control byte in the model
// (nul_byte.yaml, control_byte.yaml) is quoted escaped, as \xNN, and no raw
// control byte may reach the output at all.
#include <doctest/doctest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

struct Expectation {
  int line = 0;
  int col = 0;
  std::string message;
};

struct Run {
  int status = -1;  // exit status; -1 if the process did not exit normally (a crash)
  std::string output;
};

std::vector<std::string> corpus_files() {
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(fs::path(NAPKIN_SOURCE_DIR) / "tests" / "errors"))
    if (entry.is_regular_file() && entry.path().extension() == ".yaml")
      files.push_back("tests/errors/" + entry.path().filename().string());
  std::sort(files.begin(), files.end());
  return files;
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// A source line as the diagnostics quote it: control bytes but tab as \xNN
// (the corpus is ASCII apart from them, and its lines are short: no window).
std::string shown(const std::string& line) {
  std::string out;
  for (char c : line) {
    unsigned char u = static_cast<unsigned char>(c);
    if ((u < 0x20 && c != '\t') || u == 0x7F) {
      const char* hex = "0123456789abcdef";
      out += std::string("\\x") + hex[u >> 4] + hex[u & 15];
    } else {
      out += c;
    }
  }
  return out;
}

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// Runs `napkin report <relative>` in the repository root, stdout and stderr together.
Run run_report(const std::string& relative) {
  std::string command = "cd " + shell_quote(NAPKIN_SOURCE_DIR) + " && " + shell_quote(NAPKIN_BINARY) +
                        " report " + shell_quote(relative) + " 2>&1";
  Run run;
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return run;
  char buffer[4096];
  for (size_t n; (n = fread(buffer, 1, sizeof buffer, pipe)) > 0;) run.output.append(buffer, n);
  int status = pclose(pipe);
  if (status != -1 && WIFEXITED(status)) run.status = WEXITSTATUS(status);
  return run;
}

// The leading "# expect: LINE:COL: MESSAGE" lines; a malformed one fails the check.
std::vector<Expectation> read_expectations(const std::vector<std::string>& source) {
  static const std::regex kExpect(R"(# expect: (\d+):(\d+): (.+))");
  std::vector<Expectation> out;
  for (const std::string& line : source) {
    if (line.rfind("# expect:", 0) != 0) break;
    std::smatch m;
    CHECK_MESSAGE(std::regex_match(line, m, kExpect), "malformed expectation: " << line);
    if (!m.empty()) out.push_back({std::stoi(m[1]), std::stoi(m[2]), m[3]});
  }
  return out;
}

void check_file(const std::string& relative) {
  std::ifstream in(fs::path(NAPKIN_SOURCE_DIR) / relative);
  std::stringstream text;
  text << in.rdbuf();
  const std::vector<std::string> source = split_lines(text.str());
  const std::vector<Expectation> expected = read_expectations(source);
  REQUIRE_MESSAGE(!expected.empty(), relative << " does not start with '# expect: LINE:COL: MESSAGE'");

  const Run run = run_report(relative);
  INFO("napkin report " << relative << " printed:\n" << run.output);
  CHECK_MESSAGE(run.status == 1, "exit status " << run.status << " (1 is a user error; -1 a crash)");
  CHECK(run.output.find("internal error") == std::string::npos);
  CHECK_MESSAGE(std::none_of(run.output.begin(), run.output.end(),
                             [](char c) { return (static_cast<unsigned char>(c) < 0x20 && c != '\n' && c != '\t') || c == 0x7F; }),
                "a raw control byte in the output");

  // Every error is located in this file and followed by its source line, a caret
  // under its column, and a hint.
  const std::vector<std::string> out = split_lines(run.output);
  const std::regex kError("(.*):(\\d+):(\\d+): error: (.*)");
  int errors = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    // Quoted source lines and hints are indented; diagnostics start at column 1.
    if (out[i].empty() || out[i][0] == ' ' || out[i].find("error: ") == std::string::npos) continue;
    std::smatch m;
    bool located = std::regex_match(out[i], m, kError) && m[1] == relative;
    CHECK_MESSAGE(located, "not a '" << relative << ":LINE:COL: error: ...' line: " << out[i]);
    if (!located) continue;
    ++errors;
    const int line = std::stoi(m[2]), col = std::stoi(m[3]);
    REQUIRE_MESSAGE(line <= static_cast<int>(source.size()), "line " << line << " is past the end: " << out[i]);
    const std::string& quoted = source[line - 1];
    CHECK_MESSAGE(i + 1 < out.size(), "no source line after: " << out[i]);
    if (i + 1 >= out.size()) continue;
    CHECK_MESSAGE(out[i + 1] == "    " + shown(quoted), "the source line after '" << out[i] << "' is not line " << line);
    std::string caret = "    ";
    for (char c : shown(quoted.substr(0, std::min<size_t>(col - 1, quoted.size())))) caret += c == '\t' ? '\t' : ' ';
    caret += "^";
    CHECK_MESSAGE(i + 2 < out.size(), "no caret after: " << out[i]);
    if (i + 2 < out.size()) CHECK_MESSAGE(out[i + 2] == caret, "no caret under column " << col << ": " << out[i]);
    bool hint = i + 3 < out.size() && out[i + 3].rfind("    hint: ", 0) == 0 && out[i + 3].size() > 10;
    CHECK_MESSAGE(hint, "no hint (what to do) after: " << out[i]);
  }

  for (const Expectation& e : expected) {
    std::string prefix = relative + ":" + std::to_string(e.line) + ":" + std::to_string(e.col) + ": error: ";
    bool found = std::any_of(out.begin(), out.end(), [&](const std::string& l) {
      return l.rfind(prefix, 0) == 0 && l.find(e.message, prefix.size()) != std::string::npos;
    });
    CHECK_MESSAGE(found, "expected " << prefix << "..." << e.message << "...");
  }
  // Exactly the declared errors: one mistake gives one message, not a cascade.
  CHECK_MESSAGE(errors == static_cast<int>(expected.size()),
                errors << " errors reported, " << expected.size() << " declared with '# expect:'");
  std::string summary = std::to_string(errors) + (errors == 1 ? " error generated." : " errors generated.");
  CHECK_MESSAGE(std::find(out.begin(), out.end(), summary) != out.end(), "no '" << summary << "' line");
}

}  // namespace

TEST_CASE("errors: the corpus has at least 30 bad models") { CHECK(corpus_files().size() >= 30); }

TEST_CASE("errors: every bad model reports its declared errors, located, with source, caret and hint") {
  // One subcase per file, so a failure names the file.
  for (const std::string& relative : corpus_files()) {
    SUBCASE(relative.c_str()) { check_file(relative); }
  }
}
