// Every seed of the fuzzer's corpus (tests/fuzz/corpus) through the frontend
// and the whole training pipeline, as tools/test.sh's libFuzzer run starts
// with them: a user error or a graph, never an internal error. The fuzzer
// runs only in tools/test.sh and CI; this keeps its seeds in every ctest run
// (a fusion change once broke the schedule of one of them).
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "frontend/frontend.h"
#include "passes/pipeline.h"
#include "support/test_models.h"

using namespace napkin;

TEST_CASE("fuzz corpus: every seed lowers and compiles through the training pipeline or reports a user error") {
  std::vector<std::filesystem::path> seeds;
  for (const auto& entry : std::filesystem::directory_iterator(testing::source_path("tests/fuzz/corpus")))
    if (entry.is_regular_file()) seeds.push_back(entry.path());
  std::sort(seeds.begin(), seeds.end());
  REQUIRE(seeds.size() > 100);
  constexpr size_t kMaxPassNodes = 20000;  // as the fuzz harness (tests/fuzz/frontend_fuzz.cpp)
  int compiled = 0;
  for (const std::filesystem::path& seed : seeds) {
    INFO(seed.filename().string());
    const std::string text = testing::read_source("tests/fuzz/corpus/" + seed.filename().string());
    ir::Diagnostics diag;
    std::optional<ir::Graph> g;
    CHECK_NOTHROW(g = frontend::load_model_text(text, seed.filename().string(), diag));
    if (!g || g->schedule().size() > kMaxPassNodes) continue;
    bool ok = false;
    CHECK_NOTHROW(ok = passes::run_training_pipeline(*g, diag).has_value());
    compiled += ok;
  }
  CHECK(compiled > 10);  // most seeds are meant to be rejected
}
