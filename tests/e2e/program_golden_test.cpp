// The program description (`napkin build --emit-program`) of every model in
// models/, for the CPU and (where the CUDA backend is built) the CUDA target,
// diffed against checked-in files (tests/golden/programs). It pins what a
// trainer runs: each kernel's kind, operands, launches and cost, the tensors,
// gradients and updates. Written before the kernel-contract redesign
// (issue 37), whose acceptance is that every shipped model's program
// describes the same step after it. A deliberate change regenerates them:
//   NAPKIN_UPDATE_GOLDEN=1 ./build/tests/napkin_tests -tc='program golden*'
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "support/test_io.h"
#include "support/test_models.h"

using nlohmann::json;
namespace fs = std::filesystem;

namespace {

// The first few differences between two program descriptions, as JSON
// pointers with both values, for a readable failure.
std::string differences(const json& want, const json& got) {
  const json patch = json::diff(want, got);
  std::string out;
  for (size_t i = 0; i < patch.size() && i < 8; ++i) {
    const std::string path = patch[i].at("path").get<std::string>();
    const json::json_pointer ptr(path);
    out += fmt::format("  {} {}: golden {} actual {}\n", patch[i].at("op").get<std::string>(), path,
                       want.contains(ptr) ? want.at(ptr).dump().substr(0, 200) : "<none>",
                       got.contains(ptr) ? got.at(ptr).dump().substr(0, 200) : "<none>");
  }
  if (patch.size() > 8) out += fmt::format("  ... {} differences in all\n", patch.size());
  return out;
}

void check_program(const std::string& model, const std::string& target_flags, const fs::path& golden) {
  napkin::testing::TempDir dir("progolden"), cache("progoldencache");
  const std::string emitted = dir / "program.json";
  napkin::testing::CommandResult r = napkin::testing::run_in_source_tree(
      fmt::format("NAPKIN_CACHE_DIR={} {} build {} {} -o {} --emit-program {} --quiet", cache.path, NAPKIN_BINARY,
                  model, target_flags, dir / "trainer", emitted));
  INFO(r.out);
  REQUIRE(r.status == 0);
  const std::string actual = napkin::testing::read_bytes(emitted);
  if (std::getenv("NAPKIN_UPDATE_GOLDEN")) {
    napkin::testing::write_bytes(golden, actual);
    MESSAGE("updated " << golden.string());
    return;
  }
  REQUIRE_MESSAGE(fs::exists(golden), "missing golden file " << golden.string() << "; run with NAPKIN_UPDATE_GOLDEN=1");
  const json want = json::parse(napkin::testing::read_bytes(golden));
  const json got = json::parse(actual);
  INFO(golden.string() << " differs:\n" << differences(want, got));
  CHECK(want == got);
}

}  // namespace

TEST_CASE("program golden: every model's program description is the checked-in one, on each target") {
  const fs::path root = NAPKIN_SOURCE_DIR;
  for (const fs::path& model : napkin::testing::model_files()) {
    const std::string stem = model.stem().string();
    const std::string relative = "models/" + model.filename().string();
    // Llama 3.1 8B's program is llama.yaml's kernels at 8 times the layers
    // (5 MB of JSON), llama-bpe's is llama.yaml's at another vocab:
    // llama.yaml's pins them; Mixtral-8x7B's is moe.yaml's kernels at its sizes.
    if (stem == "llama3-8b" || stem == "llama-bpe" || stem == "mixtral-8x7b") continue;
    SUBCASE((stem + " cpu").c_str()) { check_program(relative, "", root / "tests/golden/programs" / (stem + ".cpu.json")); }
#ifdef NAPKIN_HAVE_CUDA
    SUBCASE((stem + " cuda").c_str()) {
      check_program(relative, "--target cuda --arch sm_90", root / "tests/golden/programs" / (stem + ".cuda.json"));
    }
#endif
  }
}
