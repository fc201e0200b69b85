// Activation recomputation under --memory-budget: the plan fits the budget, a
// recomputed step gives bit-identical loss, gradients and updates in the
// interpreter, cheap ops are recomputed before matmuls, an unmeetable budget
// names the smallest one that works (and that one does), and a trainer built
// with a budget allocates the planned arena.
#include <doctest/doctest.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <map>
#include <regex>
#include <string>

#include "analysis/cost.h"
#include "analysis/memory.h"
#include "analysis/memory_plan.h"
#include "interp/interpreter.h"
#include "passes/recompute.h"
#include "report/report.h"
#include "support/test_io.h"
#include "support/test_models.h"

using namespace napkin;

namespace {

struct Compiled {
  std::optional<ir::Graph> g;
  std::string errors;
  passes::RecomputeReport report;
};

// Small widths (the interpreter runs them) but enough tokens that activations,
// not parameters and optimizer state, make the peak: recomputation can help.
const std::map<std::string, int64_t>& dims_of(const std::string& stem) {
  static const std::map<std::string, std::map<std::string, int64_t>> dims = {
      {"gpt", {{"batch", 16}, {"seq", 32}, {"vocab", 16}, {"d", 32}, {"heads", 2}, {"layers", 2}}},
      {"mlp", {{"batch", 64}, {"d_in", 8}, {"hidden", 32}, {"classes", 5}}},
  };
  return dims.at(stem);
}
const char* const kMlpDims = "batch=64,d_in=8,hidden=32,classes=5";

Compiled compile_with_budget(const std::string& stem, int64_t budget) {
  ir::Diagnostics diag;
  frontend::LoadOptions options;
  options.dim_overrides = dims_of(stem);
  std::optional<ir::Graph> g = frontend::load_model_file(napkin::testing::source_path("models/" + stem + ".yaml"), diag, options);
  REQUIRE(g.has_value());
  Compiled c;
  std::optional<passes::PipelineResult> result = passes::run_training_pipeline(*g, diag, {}, {budget});
  c.errors = diag.render();
  if (result) c.g = std::move(g), c.report = result->recompute;
  return c;
}

int64_t arena_of(const ir::Graph& g) { return analysis::plan_memory(analysis::analyze_memory(g)).arena_bytes; }

// The smallest budget an unmeetable budget's error names.
int64_t smallest_budget(const std::string& stem) {
  Compiled c = compile_with_budget(stem, 1);
  REQUIRE_FALSE(c.g.has_value());
  CAPTURE(c.errors);
  CHECK(c.errors.find("cannot be met") != std::string::npos);
  std::smatch match;
  REQUIRE(std::regex_search(c.errors, match, std::regex("the smallest budget that can be met is --memory-budget ([0-9]+)")));
  return std::stoll(match[1]);
}

// Runs one step of both graphs on the same params, state and inputs; every
// output (loss, gradients) and update value must be bit-identical.
void check_same_step(const ir::Graph& base, const ir::Graph& recomputed) {
  auto values = interp::initial_values(base, 7);
  for (auto& [v, data] : interp::random_inputs(base, 7)) values[v] = data;
  interp::Interpreter a(base, interp::Numerics::Native), b(recomputed, interp::Numerics::Native);
  a.set(values);
  b.set(values);
  a.run();
  b.run();
  REQUIRE(base.outputs.size() == recomputed.outputs.size());
  for (size_t i = 0; i < base.outputs.size(); ++i) {
    CAPTURE(base.outputs[i].first);
    CHECK(base.outputs[i].first == recomputed.outputs[i].first);
    CHECK(a.get(base.outputs[i].second) == b.get(recomputed.outputs[i].second));
  }
  REQUIRE(base.updates.size() == recomputed.updates.size());
  for (size_t i = 0; i < base.updates.size(); ++i) CHECK(a.get(base.updates[i].value) == b.get(recomputed.updates[i].value));
}

bool is_contraction(const std::string& op) { return op == "matmul" || op == "einsum"; }

}  // namespace

TEST_CASE("recompute: a budget between the smallest and the unconstrained arena fits, with the same step") {
  for (std::string stem : {"mlp", "gpt"}) {
    CAPTURE(stem);
    Compiled base = compile_with_budget(stem, 0);
    REQUIRE(base.g.has_value());
    CHECK_FALSE(base.report.ran);
    const int64_t unconstrained = arena_of(*base.g);
    const int64_t smallest = smallest_budget(stem);
    CHECK(smallest < unconstrained);

    const int64_t budget = (smallest + unconstrained) / 2;
    Compiled c = compile_with_budget(stem, budget);
    INFO(c.errors);
    REQUIRE(c.g.has_value());
    const passes::RecomputeReport& r = c.report;
    CHECK(r.ran);
    CHECK(arena_of(*c.g) <= budget);
    CHECK(r.arena_after == arena_of(*c.g));
    CHECK(r.arena_before == unconstrained);
    CHECK(r.peak_after < r.peak_before);
    REQUIRE_FALSE(r.values.empty());
    // FLOPs added are exactly the step's growth.
    double before = analysis::analyze_step(*base.g, nullptr).total.flops;
    double after = analysis::analyze_step(*c.g, nullptr).total.flops;
    CHECK(r.flops_added > 0);
    CHECK(after - before == doctest::Approx(r.flops_added).epsilon(1e-12));
    CHECK(r.step_flops == doctest::Approx(before).epsilon(1e-12));
    check_same_step(*base.g, *c.g);
    MESSAGE(fmt::format("{}: arena {} -> {} (budget {}, smallest {}), {} values, +{:.2f}% FLOPs", stem, unconstrained,
                        r.arena_after, budget, smallest, r.values.size(), 100 * r.flops_added / r.step_flops));

    // The smallest budget itself is met, and gives the same step too.
    Compiled tight = compile_with_budget(stem, smallest);
    INFO(tight.errors);
    REQUIRE(tight.g.has_value());
    CHECK(arena_of(*tight.g) <= smallest);
    check_same_step(*base.g, *tight.g);

    // A budget the step already fits changes nothing.
    Compiled loose = compile_with_budget(stem, unconstrained);
    REQUIRE(loose.g.has_value());
    CHECK(loose.report.values.empty());
    CHECK(loose.g->schedule() == base.g->schedule());
  }
}

TEST_CASE("recompute: on gpt cheap ops go first, matmuls last") {
  Compiled base = compile_with_budget("gpt", 0);
  REQUIRE(base.g.has_value());
  const int64_t unconstrained = arena_of(*base.g);
  // 10% under the unconstrained arena: only cheap (non-matmul) results, the
  // layernorm outputs among them.
  Compiled c = compile_with_budget("gpt", unconstrained * 9 / 10);
  REQUIRE(c.g.has_value());
  REQUIRE_FALSE(c.report.values.empty());
  int layernorms = 0;
  for (const passes::RecomputedValue& v : c.report.values) {
    CAPTURE(v.op);
    CHECK_FALSE(is_contraction(v.op));
    layernorms += v.op == "layernorm";
  }
  CHECK(layernorms > 0);
  // The tighter the budget, the more is recomputed and the more it costs per byte.
  Compiled tight = compile_with_budget("gpt", smallest_budget("gpt"));
  REQUIRE(tight.g.has_value());
  CHECK(tight.report.values.size() > c.report.values.size());
  CHECK(tight.report.flops_added > c.report.flops_added);
}

TEST_CASE("recompute: the report lists what is recomputed") {
  Compiled c = compile_with_budget("gpt", arena_of(*compile_with_budget("gpt", 0).g) - 1);
  REQUIRE(c.g.has_value());
  analysis::StepCost cost = analysis::analyze_step(*c.g, nullptr);
  analysis::MemoryReport memory = analysis::analyze_memory(*c.g);
  std::string text = report::render_report_text(*c.g, cost, memory, {"gpt.yaml", false, &c.report});
  CHECK(text.find("\nrecompute (--memory-budget ") != std::string::npos);
  CHECK(text.find("saved at the peak") != std::string::npos);
  CHECK(text.find(c.report.values[0].name) != std::string::npos);
  auto j = nlohmann::json::parse(report::render_report_json(*c.g, cost, memory, {"gpt.yaml", false, &c.report}));
  CHECK(j["recompute"]["values"].size() == c.report.values.size());
  CHECK(j["recompute"]["arena_after"] == j["memory"]["arena"]);
  CHECK(j["recompute"]["saved_at_peak"].get<int64_t>() == c.report.peak_before - c.report.peak_after);
  CHECK(j["recompute"]["budget"] == c.report.budget);
}

TEST_CASE("recompute: --memory-budget parses byte counts with units") {
  std::string error;
  CHECK(passes::parse_memory_budget("1000000", error) == 1000000);
  CHECK(passes::parse_memory_budget("64MiB", error) == 64 * 1024 * 1024);
  CHECK(passes::parse_memory_budget("1.5GB", error) == 1500000000);
  CHECK(passes::parse_memory_budget("2 GiB", error) == int64_t{2} << 30);
  CHECK(passes::parse_memory_budget("512B", error) == 512);
  CHECK(passes::parse_memory_budget("3kB", error) == 3000);
  CHECK_FALSE(passes::parse_memory_budget("12 parsecs", error));
  CHECK(error.find("unknown unit 'parsecs'") != std::string::npos);
  CHECK_FALSE(passes::parse_memory_budget("lots", error));
  CHECK(error.find("not a byte count") != std::string::npos);
  CHECK_FALSE(passes::parse_memory_budget("0", error));
  CHECK_FALSE(passes::parse_memory_budget("-5MB", error));
}

TEST_CASE("recompute: a trainer built with --memory-budget allocates the planned arena") {
  const std::string dims = kMlpDims;
  Compiled base = compile_with_budget("mlp", 0);
  REQUIRE(base.g.has_value());
  const int64_t budget = (smallest_budget("mlp") + arena_of(*base.g)) / 2;
  Compiled c = compile_with_budget("mlp", budget);
  REQUIRE(c.g.has_value());
  const int64_t planned = arena_of(*c.g);

  napkin::testing::TempDir dir("recompute");
  auto built = napkin::testing::run_in_source_tree(fmt::format("{} build models/mlp.yaml --dims {} --memory-budget {} -o {}",
                                                               NAPKIN_BINARY, dims, budget, dir / "trainer"));
  INFO(built.out);
  REQUIRE(built.status == 0);
  CHECK(built.out.find(fmt::format("arena {} bytes", planned)) != std::string::npos);
  auto program = napkin::testing::run_in_source_tree(fmt::format("{} --print-program", dir / "trainer"));
  REQUIRE(program.status == 0);
  auto j = nlohmann::json::parse(program.out);
  CHECK(j["arena_bytes"].get<int64_t>() == planned);
  CHECK(planned <= budget);

  // An unmeetable budget is a user error naming the smallest one.
  auto report = napkin::testing::run_in_source_tree(
      fmt::format("{} report models/mlp.yaml --dims {} --memory-budget 1KiB", NAPKIN_BINARY, dims));
  CHECK(report.status == 1);
  CHECK(report.out.find(fmt::format("the smallest budget that can be met is --memory-budget {}", smallest_budget("mlp"))) !=
        std::string::npos);
  auto bad = napkin::testing::run_in_source_tree(fmt::format("{} report models/mlp.yaml --memory-budget 3parsecs", NAPKIN_BINARY));
  CHECK(bad.status == 1);
  CHECK(bad.out.find("--memory-budget: '3parsecs': unknown unit") != std::string::npos);
}

TEST_CASE("recompute: a gpt trainer built with a budget trains with the same losses in half the arena") {
  napkin::testing::TempDir dir("recompute-train");
  const std::string dims = "batch=16,seq=32,vocab=256,d=32,heads=2,layers=2";
  auto encoded = napkin::testing::run_in_source_tree(
      fmt::format("{} data encode README.md -o {}", NAPKIN_BINARY, dir / "tiny.u16"));
  REQUIRE(encoded.status == 0);
  std::vector<std::string> losses;
  std::vector<int64_t> arenas;
  for (std::string budget : {"", "1.6MB"}) {
    std::string trainer = dir / ("trainer" + budget);
    auto built = napkin::testing::run_in_source_tree(fmt::format("{} build models/gpt.yaml --dims {} {} -o {}", NAPKIN_BINARY, dims,
                                                                 budget.empty() ? "" : "--memory-budget " + budget, trainer));
    INFO(built.out);
    REQUIRE(built.status == 0);
    auto ran = napkin::testing::run_in_source_tree(
        fmt::format("{} --data {} --steps 3 --log-every 1 --threads 2 --checkpoint-dir {}", trainer, dir / "tiny.u16",
                    dir / ("ckpt" + budget)));
    INFO(ran.out);
    REQUIRE(ran.status == 0);
    std::smatch m;
    REQUIRE(std::regex_search(ran.out, m, std::regex("\\(([0-9]+) bytes, planned")));
    arenas.push_back(std::stoll(m[1]));
    std::string lines;
    const std::regex loss("loss [0-9.]+");
    for (std::sregex_iterator it(ran.out.begin(), ran.out.end(), loss), end; it != end; ++it)
      lines += it->str() + "\n";
    losses.push_back(lines);
  }
  CHECK(losses[0].find("loss") != std::string::npos);
  CHECK(losses[0] == losses[1]);  // the same ops on the same values: bit-identical
  CHECK(arenas[1] <= 1600000);
  CHECK(arenas[1] < arenas[0] / 2 + arenas[0] / 10);
}
