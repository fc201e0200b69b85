// libFuzzer target for the frontend: any bytes as a model file must produce
// either a graph that verifies and can be reported, or diagnostics — never a
// crash, a hang, an uncaught exception or an internal error.
//
// Build and run (tools/test.sh does this for a short run):
//   CXX=clang++ cmake -B build-fuzz -DNAPKIN_FUZZ=ON -DNAPKIN_TESTS=OFF && ninja -C build-fuzz napkin_frontend_fuzz
//   build-fuzz/tests/fuzz/napkin_frontend_fuzz tests/fuzz/corpus -dict=tests/fuzz/napkin.dict -max_total_time=60
// (fuzz a copy of the corpus; the seed_*.yaml files and napkin.dict aim it at blocks,
// einops, subscripts and the training sections).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "analysis/cost.h"
#include "frontend/frontend.h"
#include "ir/printer.h"
#include "passes/pipeline.h"
#include "report/report.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  napkin::ir::Diagnostics diag;
  auto g = napkin::frontend::load_model_text(text, "fuzz.yaml", diag);
  // The frontend's contract (frontend.h): a graph iff no error was reported, and a
  // graph always has its loss. A silent failure (an Invalid operand nobody
  // reported) breaks it without crashing, so check it here.
  if (g.has_value() == diag.has_errors() || (g && (g->outputs.empty() || g->outputs[0].first != "loss"))) {
    std::fprintf(stderr, "frontend contract broken: graph %s, %d errors, %zu outputs\n%s",
                 g ? "returned" : "missing", diag.error_count(), g ? g->outputs.size() : size_t{0},
                 diag.render().c_str());
    std::abort();
  }
  // A model of thousands of blocks is legal (release: seconds) but under ASan
  // its passes take minutes and only repeat what small graphs exercise: past
  // this size the harness stops after lowering.
  constexpr size_t kMaxPassNodes = 20000;
  if (g && g->schedule().size() <= kMaxPassNodes && napkin::passes::run_training_pipeline(*g, diag)) {
    napkin::ir::print_graph(*g);
    auto cost = napkin::analysis::analyze_step(*g, napkin::analysis::find_device("h100"));
    auto memory = napkin::analysis::analyze_memory(*g);
    napkin::report::render_report_text(*g, cost, memory, {"fuzz.yaml", true});
    napkin::report::render_report_json(*g, cost, memory, {"fuzz.yaml", true});
  }
  diag.render();
  return 0;
}
