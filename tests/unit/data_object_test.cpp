// The data object (codegen/host/data_object.h): linked into a program with a
// C++ main that declares the symbols as the CUDA trainer does, every array
// reads back byte for byte (NULs and all, followed by one NUL), every size is
// the byte count, and the arrays are 64-byte aligned.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <string>

#include "codegen/host/data_object.h"
#include "codegen/host/link.h"
#include "support/test_io.h"

using napkin::testing::read_bytes;
using napkin::testing::TempDir;
using napkin::testing::write_bytes;

TEST_CASE("data object: exported byte arrays and their sizes link and read back exactly") {
  TempDir dir("dataobj");
  std::string binary;
  for (int i = 0; i < 300; ++i) binary += static_cast<char>(i * 7);  // NULs, high bytes
  std::string json = R"({"format": "x"})";
  std::string object = napkin::codegen::host::emit_data_object(
      {{"napkin_test_json", json}, {"napkin_test_binary", binary}, {"napkin_test_empty", ""}}, "data_test");
  write_bytes(dir / "main.cpp", R"(
#include <cstdint>
#include <cstdio>
extern "C" {
extern const char napkin_test_json[], napkin_test_binary[], napkin_test_empty[];
extern const int64_t napkin_test_json_size, napkin_test_binary_size, napkin_test_empty_size;
}
static void dump(FILE* f, const char* bytes, int64_t size) {
  std::fwrite(bytes, 1, size + 1, f);  // with the NUL after the bytes
  std::fprintf(f, "|%lld|%d\n", static_cast<long long>(size), static_cast<int>(reinterpret_cast<uintptr_t>(bytes) % 64));
}
int main(int, char** argv) {
  FILE* f = std::fopen(argv[1], "wb");
  dump(f, napkin_test_json, napkin_test_json_size);
  dump(f, napkin_test_binary, napkin_test_binary_size);
  dump(f, napkin_test_empty, napkin_test_empty_size);
  return std::fclose(f);
}
)");
  napkin::codegen::host::link_executable(object, dir / "main.cpp", dir / "reader");
  auto r = napkin::testing::run_in_source_tree(fmt::format("{} {}", dir / "reader", dir / "out"));
  INFO(r.out);
  REQUIRE(r.status == 0);
  std::string expected = json + std::string(1, '\0') + fmt::format("|{}|0\n", json.size()) + binary +
                         std::string(1, '\0') + fmt::format("|{}|0\n", binary.size()) + std::string(1, '\0') + "|0|0\n";
  CHECK(read_bytes(dir / "out") == expected);
}
