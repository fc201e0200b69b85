// ctest runs each test case by name (doctest_discover_tests): a name with a
// ';' is split by CMake into pieces that select no test case, so that test
// "passes" under ctest without running. Names may use ',' (the discovery
// escapes it) but not ';', and their square brackets must pair up: CMake's
// list splitting does not split inside [ ], so an unclosed '[' swallows the
// separators after it and ctest's whole test list fails to load.
#include <doctest/doctest.h>

#include <filesystem>
#include <sstream>

#include "support/test_io.h"

TEST_CASE("test names: no test case name has a semicolon or an unpaired square bracket (ctest would run nothing)") {
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  napkin::testing::CommandResult r = napkin::testing::run_in_source_tree("'" + self + "' --list-test-cases");
  REQUIRE(r.status == 0);
  std::istringstream lines(r.out);
  int names = 0;
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line.rfind("[doctest]", 0) == 0 || line.rfind("=====", 0) == 0) continue;
    ++names;
    CHECK_MESSAGE(line.find(';') == std::string::npos, line);
    int depth = 0;
    bool paired = true;
    for (char c : line) {
      depth += c == '[' ? 1 : c == ']' ? -1 : 0;
      paired &= depth >= 0;
    }
    CHECK_MESSAGE((paired && depth == 0), line);
  }
  CHECK(names > 100);
}
