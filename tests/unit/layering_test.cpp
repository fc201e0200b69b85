// The flow of the compiler's folders (docs/architecture.md): every
// `#include "folder/..."` of a source file must name its own folder or one
// the table below lets it use. A header included "upward" (a pass including a
// renderer, the CUDA backend including the CPU backend) fails here, naming
// the file and line, and so does a new folder until it has a row.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

// Folder -> the folders its sources may include (besides their own). The
// order of the flow: ir, interp (the float64 oracle), then frontend and analysis, passes (transformations,
// which use analyses), report (renderers of both), codegen (the plan and the
// host toolchain, then the two backends, which never include each other);
// runtime stands alone (a trainer links only it; codegen builds its typed
// program, runtime/kernel_spec.h); tools (the driver) ties all
// of them together.
const std::map<std::string, std::set<std::string>>& allowed_includes() {
  static const std::map<std::string, std::set<std::string>> table = {
      {"ir", {}},
      // The frontend folds numbers (exp(2.0)) with the interpreter's float64
      // arithmetic, so a folded constant is the oracle's value.
      {"frontend", {"interp", "ir"}},
      {"analysis", {"ir"}},
      {"passes", {"analysis", "ir"}},
      {"report", {"passes", "analysis", "ir"}},
      {"interp", {"ir", "runtime"}},
      {"codegen", {"passes", "analysis", "ir", "runtime"}},
      {"codegen/host", {"ir"}},
      {"codegen/cpu", {"codegen", "codegen/host", "passes", "analysis", "ir", "runtime"}},
      {"codegen/cuda", {"codegen", "codegen/host", "passes", "analysis", "ir", "runtime"}},
      {"runtime", {}},
      {"runtime/cuda", {"runtime"}},
      {"tools", {"frontend", "ir", "analysis", "passes", "report", "interp", "codegen", "codegen/host", "codegen/cpu",
                 "codegen/cuda", "runtime", "runtime/cuda"}},
  };
  return table;
}

// The folder a path belongs to: its first component, or the first two for
// the backends and the host toolchain (codegen/cpu, runtime/cuda, ...).
std::string folder_of(const std::string& path) {
  size_t first = path.find('/');
  if (first == std::string::npos) return "";
  std::string top = path.substr(0, first);
  size_t second = path.find('/', first + 1);
  if (second != std::string::npos && (top == "codegen" || top == "runtime")) {
    std::string sub = path.substr(first + 1, second - first - 1);
    if (sub == "cpu" || sub == "cuda" || sub == "host") return top + "/" + sub;
  }
  return top;
}

// A source file (path relative to the root) and its quoted includes, by line.
struct Source {
  std::string path;
  std::vector<std::pair<int, std::string>> includes;
};

// Every source file: tests and benchmarks may use any layer; build trees and hidden folders are not sources.
std::vector<Source> sources(const fs::path& root) {
  std::vector<Source> out;
  static const std::regex include_line(R"re(^\s*#\s*include\s+"([^"]+)")re");
  for (const auto& dir : fs::directory_iterator(root)) {
    std::string top = dir.path().filename().string();
    if (!dir.is_directory() || top == "tests" || top == "bench" || top.rfind("build", 0) == 0 || top[0] == '.') continue;
    for (const auto& entry : fs::recursive_directory_iterator(dir.path())) {
      std::string ext = entry.path().extension().string();
      if (!entry.is_regular_file() || (ext != ".cpp" && ext != ".h" && ext != ".def")) continue;
      out.push_back({fs::relative(entry.path(), root).generic_string(), {}});
      std::ifstream in(entry.path());
      std::string line;
      std::smatch m;
      for (int number = 1; std::getline(in, line); ++number)
        if (std::regex_search(line, m, include_line)) out.back().includes.emplace_back(number, m[1].str());
    }
  }
  return out;
}

// "file:line: includes X (folder Y may not)" for every include that breaks the table.
std::vector<std::string> layering_violations(const fs::path& root) {
  std::vector<std::string> out;
  for (const Source& source : sources(root)) {
    std::string from = folder_of(source.path);
    auto rule = allowed_includes().find(from);
    if (rule == allowed_includes().end()) {
      out.push_back(fmt::format("{}: folder {} has no row in the layering table", source.path, from));
      continue;
    }
    for (const auto& [number, include] : source.includes) {
      std::string target = folder_of(include);
      if (target.empty() || target == from || rule->second.count(target)) continue;
      // Generated headers (link_config.h, host_config.h) sit beside their folder's sources.
      if (!fs::exists(root / include) && !allowed_includes().count(target)) continue;
      out.push_back(fmt::format("{}:{}: includes {} ({} may not include {})", source.path, number, include, from, target));
    }
  }
  return out;
}

// Inside a folder, a unit is a header with its sources (runtime/attention.h
// and runtime/attention.cpp: runtime/attention); a unit uses another when
// any of its files includes the other's header. "a -> b -> a" for each cycle
// of uses among the units of one folder (each back edge of a depth-first
// search): one of them has a declaration that belongs below both.
std::vector<std::string> include_cycles(const fs::path& root) {
  auto unit_of = [](const std::string& path) { return path.substr(0, path.rfind('.')); };
  std::map<std::string, std::set<std::string>> uses;
  for (const Source& source : sources(root))
    for (const auto& [number, include] : source.includes)
      if (folder_of(include) == folder_of(source.path) && unit_of(include) != unit_of(source.path))
        uses[unit_of(source.path)].insert(unit_of(include));
  std::vector<std::string> out;
  std::map<std::string, int> state;  // 1 on the search's path, 2 done
  std::vector<std::string> path;
  std::function<void(const std::string&)> visit = [&](const std::string& unit) {
    state[unit] = 1;
    path.push_back(unit);
    for (const std::string& next : uses[unit]) {
      if (state[next] == 1)
        out.push_back(fmt::format("{} -> {}", fmt::join(std::find(path.begin(), path.end(), next), path.end(), " -> "), next));
      else if (state[next] == 0) visit(next);
    }
    path.pop_back();
    state[unit] = 2;
  };
  for (const auto& [unit, _] : uses)
    if (state[unit] == 0) visit(unit);
  return out;
}

}  // namespace

TEST_CASE("layering: no source includes a header from a folder above it in the flow") {
  std::vector<std::string> violations = layering_violations(NAPKIN_SOURCE_DIR);
  for (const std::string& v : violations) INFO(v);
  CHECK_MESSAGE(violations.empty(), fmt::format("{}", fmt::join(violations, "\n")));
}

TEST_CASE("layering: the check finds an upward include and a folder without a row") {
  fs::path root = fs::temp_directory_path() / fmt::format("napkin-layering-{}", ::getpid());
  fs::remove_all(root);
  for (const auto& [top, _] : allowed_includes())
    if (top.find('/') == std::string::npos) fs::create_directories(root / top);
  fs::create_directories(root / "codegen" / "cuda");
  fs::create_directories(root / "codegen" / "cpu");
  std::ofstream(root / "codegen" / "cpu" / "link.h") << "#pragma once\n";
  std::ofstream(root / "codegen" / "cuda" / "build.cpp") << "#include \"codegen/cpu/link.h\"\n#include \"ir/graph.h\"\n";
  std::ofstream(root / "passes" / "recompute.cpp") << "// a pass\n#include \"report/report.h\"\n";
  std::vector<std::string> found = layering_violations(root);
  REQUIRE(found.size() == 2);
  CHECK(std::find(found.begin(), found.end(),
                  "codegen/cuda/build.cpp:1: includes codegen/cpu/link.h (codegen/cuda may not include codegen/cpu)") !=
        found.end());
  CHECK(std::find(found.begin(), found.end(),
                  "passes/recompute.cpp:2: includes report/report.h (passes may not include report)") != found.end());
  fs::create_directories(root / "kernels");
  std::ofstream(root / "kernels" / "attention.cpp") << "#include \"ir/graph.h\"\n";
  found = layering_violations(root);
  CHECK(std::find(found.begin(), found.end(), "kernels/attention.cpp: folder kernels has no row in the layering table") !=
        found.end());
  fs::remove_all(root);
}

TEST_CASE("layering: no file of a folder includes a file that includes it back") {
  std::vector<std::string> cycles = include_cycles(NAPKIN_SOURCE_DIR);
  CHECK_MESSAGE(cycles.empty(), fmt::format("{}", fmt::join(cycles, "\n")));
}

TEST_CASE("layering: the check finds a unit that includes itself through another") {
  fs::path root = fs::temp_directory_path() / fmt::format("napkin-cycles-{}", ::getpid());
  fs::remove_all(root);
  fs::create_directories(root / "runtime");
  std::ofstream(root / "runtime" / "attention.h") << "#pragma once\n";
  std::ofstream(root / "runtime" / "attention.cpp") << "#include \"runtime/attention.h\"\n#include \"runtime/amx.h\"\n";
  std::ofstream(root / "runtime" / "amx.h") << "#include \"runtime/attention.h\"\n";
  std::ofstream(root / "runtime" / "gemm.cpp") << "#include \"runtime/amx.h\"\n";
  CHECK(include_cycles(root) == std::vector<std::string>{"runtime/amx -> runtime/attention -> runtime/amx"});
  fs::remove_all(root);
}

// Dtypes, roles, kernel phases, GEMM activations, init kinds and data orders
// and formats are enums in the runtime (runtime/tensor_types.h, init.h,
// dataset.h): parsed once where the text enters (a file header, the program's
// JSON, a flag), compared as enums after.
TEST_CASE("layering: the runtime compares no dtype, role, phase, activation, kind, order or format as a string") {
  const std::regex compare(R"(\.(dtype|role|phase|activation|kind|order|format)\s*[!=]=\s*"|\bdtype\s*[!=]=\s*")");
  std::vector<std::string> found;
  for (const char* folder : {"runtime", "runtime/cuda"})
    for (const auto& entry : fs::directory_iterator(fs::path(NAPKIN_SOURCE_DIR) / folder)) {
      if (entry.path().extension() != ".cpp") continue;
      std::ifstream in(entry.path());
      std::string line;
      for (int n = 1; std::getline(in, line); ++n)
        if (std::regex_search(line, compare)) found.push_back(fmt::format("{}/{}:{}: {}", folder, entry.path().filename().string(), n, line));
    }
  CHECK_MESSAGE(found.empty(), fmt::format("{}", fmt::join(found, "\n")));
}
