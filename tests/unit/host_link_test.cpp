// Linking (codegen/host/link.h): the object and the linker's output live in a
// private directory beside the executable, removed on every path; only the
// finished executable is renamed into place.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <filesystem>
#include <iterator>
#include <string>

#include "codegen/host/link.h"
#include "support/test_io.h"

namespace fs = std::filesystem;
using napkin::testing::read_bytes;
using napkin::testing::TempDir;
using napkin::testing::write_bytes;

TEST_CASE("link: a failed link leaves the executable as it was, X.o untouched and no build directory behind") {
  TempDir dir("link-fail");
  const std::string executable = dir / "prog";
  write_bytes(executable, "the old program");
  write_bytes(executable + ".o", "not napkin's");
  CHECK_THROWS_AS(napkin::codegen::host::link_executable("not an object file", "", executable), std::runtime_error);
  CHECK(read_bytes(executable) == "the old program");
  CHECK(read_bytes(executable + ".o") == "not napkin's");
  CHECK(std::distance(fs::directory_iterator(dir.path), fs::directory_iterator()) == 2);  // no .napkin-build-* left

  // A directory napkin cannot create its build directory in: a message naming the executable.
  write_bytes(dir / "file", "");
  try {
    napkin::codegen::host::link_executable("", "", dir / "file/prog");
    FAIL("no error");
  } catch (const std::runtime_error& e) {
    CHECK(std::string(e.what()).find("cannot write " + dir / "file/prog") == 0);
  }
}
