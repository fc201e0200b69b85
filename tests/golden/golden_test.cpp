// Golden tests: the IR text and the report of every model in models/, diffed
// against checked-in files. A change to either must be deliberate:
//   NAPKIN_UPDATE_GOLDEN=1 ./build/tests/napkin_tests -tc='golden*'
// rewrites them; review the diff before committing.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "analysis/cost.h"
#include "ir/printer.h"
#include "report/report.h"
#include "support/test_models.h"

using namespace napkin;
namespace fs = std::filesystem;

namespace {

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The first differing line, for a readable failure.
std::string first_difference(const std::string& want, const std::string& got) {
  std::istringstream a(want), b(got);
  std::string la, lb;
  for (int line = 1;; ++line) {
    bool ha = static_cast<bool>(std::getline(a, la)), hb = static_cast<bool>(std::getline(b, lb));
    if (!ha && !hb) return "identical";
    if (!ha || !hb || la != lb)
      return "line " + std::to_string(line) + ":\n  golden: " + (ha ? la : "<end>") + "\n  actual: " + (hb ? lb : "<end>");
  }
}

void check_golden(const fs::path& golden, const std::string& actual) {
  if (std::getenv("NAPKIN_UPDATE_GOLDEN")) {
    std::ofstream(golden, std::ios::binary) << actual;
    MESSAGE("updated " << golden.string());
    return;
  }
  REQUIRE_MESSAGE(fs::exists(golden), "missing golden file " << golden.string() << "; run with NAPKIN_UPDATE_GOLDEN=1");
  std::string want = read_file(golden);
  INFO(golden.string() << " differs at " << first_difference(want, actual));
  CHECK(want == actual);
}

}  // namespace

TEST_CASE("golden: IR and report of every model in models/") {
  fs::path root = NAPKIN_SOURCE_DIR;
  for (const fs::path& model : napkin::testing::model_files()) {
    std::string stem = model.stem().string();
    std::string relative = "models/" + model.filename().string();
    SUBCASE(stem.c_str()) {
      std::string text = napkin::testing::read_source(relative);
      ir::Graph g = napkin::testing::compile(text, relative);
      check_golden(root / "tests/golden" / (stem + ".ir.txt"), ir::print_graph(g));
      // The IR golden is the forward graph (the training graph is long); the
      // report covers the whole training step.
      ir::Graph step = napkin::testing::compile_training(text, relative);
      // The whole step's IR pins autodiff and the optimizer; GPT-2's (3,500
      // nodes) would only repeat what gpt.yaml's shows, Llama 3.1 8B's and
      // llama-bpe's what llama.yaml's shows, Mixtral-8x7B's what moe.yaml's shows.
      if (stem != "gpt2-124m" && stem != "llama3-8b" && stem != "llama-bpe" && stem != "mixtral-8x7b")
        check_golden(root / "tests/golden" / (stem + ".train.ir.txt"), ir::print_graph(step));
      analysis::StepCost cost = analysis::analyze_step(step, analysis::find_device("h100"));
      // Llama 3.1 8B's per-op table would repeat llama.yaml's 8 times over
      // (1.5 MB), Mixtral-8x7B's moe.yaml's: their reports are pinned without it.
      const bool show_ops = stem != "llama3-8b" && stem != "mixtral-8x7b";
      check_golden(root / "tests/golden" / (stem + ".report.txt"),
                   report::render_report_text(step, cost, analysis::analyze_memory(step), {relative, show_ops}));
    }
  }
}
