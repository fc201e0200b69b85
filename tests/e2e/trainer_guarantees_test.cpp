// What a trainer promises a careful user (and survives from a careless one):
// a run prunes and overwrites only its own checkpoints, checks its checkpoint
// directory before step 1, cleans what killed saves left, resumes from a
// file or names the good checkpoints when the newest is damaged, survives a
// data file truncated under it with the last state saved, refuses every
// flag value it cannot honour with exit 1 and a message, and appends valid
// JSON lines to its metrics file, never truncating it (docs/runtime.md,
// "Checkpoints" and "Flags").
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/checkpoint.h"
#include "runtime/npy.h"
#include "runtime/safetensors.h"
#include "support/test_io.h"
#include "support/test_models.h"

namespace fs = std::filesystem;

namespace {

using napkin::testing::read_bytes;
using napkin::testing::write_bytes;
using Run = napkin::testing::CommandResult;
Run sh(const std::string& command) { return napkin::testing::run_in_source_tree(command); }

const char* kDims = "batch=4,seq=32,d=32,heads=2,layers=1";

// A small GPT trainer in a temp dir, and its token data.
struct Fixture {
  napkin::testing::TempDir tmp{"e2e-guarantees"};
  std::string trainer = tmp / "trainer";
  std::string data = "--data tests/e2e/data/gpt/tokens.u16";
  Fixture() {
    // models/gpt.yaml without its train.checkpoint line and its log.metrics:
    // no run here may save into the source tree's checkpoints/ or append to
    // its metrics/ unless a test names the directory or file.
    std::string yaml = napkin::testing::read_source("models/gpt.yaml");
    const size_t at = yaml.find("  checkpoint: {");
    REQUIRE(at != std::string::npos);
    yaml.erase(at, yaml.find('\n', at) + 1 - at);
    const std::string metrics = ", metrics: metrics/gpt.jsonl";
    REQUIRE(yaml.find(metrics) != std::string::npos);
    yaml.erase(yaml.find(metrics), metrics.size());
    write_bytes(tmp / "gpt.yaml", yaml);
    Run r = sh(fmt::format("{} build {} --dims {} -o {} --quiet", NAPKIN_BINARY, tmp / "gpt.yaml", kDims, trainer));
    INFO(r.out);
    REQUIRE(r.status == 0);
  }
  Run train(const std::string& flags) const { return sh(fmt::format("{} {} --quiet {}", trainer, data, flags)); }
  std::string dir(const std::string& name) const { return tmp / name; }
};

std::vector<std::string> checkpoints_in(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& [step, path] : napkin::runtime::list_checkpoints(dir)) names.push_back(fs::path(path).filename());
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

TEST_CASE("trainer: a run never prunes or overwrites another run's checkpoints") {
  Fixture f;
  const std::string d = f.dir("ckpt");
  Run first = f.train(fmt::format("--steps 6 --checkpoint-every 2 --keep 0 --checkpoint-dir {}", d));
  REQUIRE(first.status == 0);
  REQUIRE(checkpoints_in(d) == std::vector<std::string>{"step-000002.safetensors", "step-000004.safetensors",
                                                         "step-000006.safetensors"});
  const std::string step2 = read_bytes(d + "/step-000002.safetensors");
  // A fresh run into the same directory stops before training, and says how to go on.
  Run second = f.train(fmt::format("--steps 3 --checkpoint-every 1 --keep 2 --checkpoint-dir {}", d));
  INFO(second.out);
  CHECK(second.status == 1);
  CHECK(second.out.find("holds 3 checkpoints that this run did not write") != std::string::npos);
  CHECK(second.out.find("--resume " + d) != std::string::npos);
  CHECK(second.out.find("saved") == std::string::npos);
  CHECK(checkpoints_in(d).size() == 3);
  CHECK(read_bytes(d + "/step-000002.safetensors") == step2);
  // Resuming that run is its lineage: it continues and prunes its own files.
  Run resumed = f.train(fmt::format("--steps 8 --checkpoint-every 1 --keep 2 --resume {} --checkpoint-dir {}", d, d));
  INFO(resumed.out);
  CHECK(resumed.status == 0);
  CHECK(checkpoints_in(d) == std::vector<std::string>{"step-000007.safetensors", "step-000008.safetensors"});
}

TEST_CASE("trainer: --dims variants of one model get their own default checkpoint dirs and metrics files - --checkpoint-every 0 turns checkpoints off") {
  napkin::testing::TempDir tmp("e2e-variants");
  std::string a = tmp / "a", b = tmp / "b";
  REQUIRE(sh(fmt::format("{} build models/gpt.yaml --dims {} -o {} --quiet", NAPKIN_BINARY, kDims, a)).status == 0);
  REQUIRE(sh(fmt::format("{} build models/gpt.yaml --dims d=64,layers=1 -o {} --quiet", NAPKIN_BINARY, b)).status == 0);
  REQUIRE(sh(fmt::format("{} build models/gpt.yaml -o {} --quiet", NAPKIN_BINARY, tmp / "c")).status == 0);
  auto train_default = [](const std::string& trainer, const char* key) {
    Run r = sh(trainer + " --print-program");
    REQUIRE(r.status == 0);
    return nlohmann::json::parse(r.out)["train"][key].get<std::string>();
  };
  CHECK(train_default(a, "checkpoint_dir") == "checkpoints/gpt@batch=4,d=32,heads=2,layers=1,seq=32");
  CHECK(train_default(b, "checkpoint_dir") == "checkpoints/gpt@d=64,layers=1");
  CHECK(train_default(tmp / "c", "checkpoint_dir") == "checkpoints/gpt");
  // A variant's run no longer lands in (and, appending, mixes into) the main run's metrics.
  CHECK(train_default(a, "metrics") == "metrics/gpt@batch=4,d=32,heads=2,layers=1,seq=32.jsonl");
  CHECK(train_default(b, "metrics") == "metrics/gpt@d=64,layers=1.jsonl");
  CHECK(train_default(tmp / "c", "metrics") == "metrics/gpt.jsonl");

  // Run from a scratch directory: the model's default dir is relative to it.
  const std::string data = napkin::testing::source_path("tests/e2e/data/gpt/tokens.u16");
  Run off = sh(fmt::format("cd {} && {} --data {} --steps 1 --quiet --checkpoint-every 0", tmp.path, a, data));
  INFO(off.out);
  CHECK(off.status == 0);
  CHECK(!fs::exists(tmp / "checkpoints"));  // --checkpoint-every 0 alone: the model's checkpoints are off
  Run on = sh(fmt::format("cd {} && {} --data {} --steps 1 --quiet", tmp.path, a, data));
  CHECK(on.status == 0);
  CHECK(fs::exists(tmp / "checkpoints/gpt@batch=4,d=32,heads=2,layers=1,seq=32/step-000001.safetensors"));
}

TEST_CASE("trainer: --resume takes a file - a damaged newest checkpoint names the good ones") {
  Fixture f;
  const std::string d = f.dir("ckpt");
  REQUIRE(f.train(fmt::format("--steps 4 --checkpoint-every 2 --keep 0 --checkpoint-dir {}", d)).status == 0);
  const std::string step2 = d + "/step-000002.safetensors", step4 = d + "/step-000004.safetensors";

  Run from_file = f.train(fmt::format("--steps 3 --resume {} --metrics {} --checkpoint-dir {}", step2, f.dir("m.jsonl"),
                                      f.dir("branch")));
  INFO(from_file.out);
  CHECK(from_file.status == 0);
  CHECK(read_bytes(f.dir("m.jsonl")).find("\"step\": 3") != std::string::npos);

  // Resuming step 2 into its own directory, where step 4 of the same run sits:
  // the newer history is neither pruned nor mixed with a new one.
  Run branch = f.train(fmt::format("--steps 3 --keep 1 --resume {}", step2));
  INFO(branch.out);
  CHECK(branch.status == 1);
  CHECK(branch.out.find("holds 1 checkpoint of this run newer than step 2, the one resumed from (step-000004") !=
        std::string::npos);
  CHECK(checkpoints_in(d) == std::vector<std::string>{"step-000002.safetensors", "step-000004.safetensors"});

  std::string bad = read_bytes(step4);
  bad[bad.size() - 10] ^= 0x20;
  write_bytes(step4, bad);
  Run r = f.train(fmt::format("--steps 6 --resume {}", d));
  INFO(r.out);
  CHECK(r.status == 1);
  CHECK(r.out.find(step4 + ": checksum mismatch") != std::string::npos);
  CHECK(r.out.find("older ones that load:\n    " + step2) != std::string::npos);
  CHECK(r.out.find("--resume " + step2) != std::string::npos);
  CHECK(read_bytes(step4) == bad);

  Run missing = f.train("--steps 6 --resume " + f.dir("nope"));
  CHECK(missing.status == 1);
  CHECK(missing.out.find("no such checkpoint file or directory") != std::string::npos);
}

TEST_CASE("trainer: resuming a run trained under --memory-budget without it says the budget differs, and by how much") {
  Fixture f;
  // The same model under a budget that recomputes activations: another step, another hash.
  const std::string budgeted = f.dir("trainer-600KiB");
  Run built = sh(fmt::format("{} build {} --dims {} --memory-budget 600KiB -o {} --quiet", NAPKIN_BINARY,
                             f.dir("gpt.yaml"), kDims, budgeted));
  INFO(built.out);
  REQUIRE(built.status == 0);
  const std::string d = f.dir("ckpt");
  REQUIRE(sh(fmt::format("{} {} --quiet --steps 2 --checkpoint-dir {}", budgeted, f.data, d)).status == 0);
  for (const std::string& from : {d, d + "/step-000002.safetensors"}) {
    CAPTURE(from);
    Run r = f.train(fmt::format("--steps 3 --resume {}", from));
    INFO(r.out);
    CHECK(r.status == 1);
    CHECK(r.out.find("checkpoint was written by a different model") != std::string::npos);
    // The checkpoint records the budget (600 KiB) its step was built under.
    CHECK(r.out.find("the settings differ: its run was trained under --memory-budget 614400 bytes, this one is built "
                     "under no --memory-budget") != std::string::npos);
    CHECK(r.out.find("hint: this trainer is the model at the --dims and --memory-budget") != std::string::npos);
  }
  // napkin sample of the same checkpoints without the budget names it too.
  Run sample = sh(fmt::format("XDG_CACHE_HOME={} {} sample {} --dims {} --checkpoint {} --prompt a --tokens 1",
                              f.dir("cache"), NAPKIN_BINARY, f.dir("gpt.yaml"), kDims, d));
  INFO(sample.out);
  CHECK(sample.status == 1);
  CHECK(sample.out.find("its run was trained under --memory-budget 614400 bytes") != std::string::npos);
}

TEST_CASE("trainer: a data file truncated mid-run stops with a message and the last step saved") {
  Fixture f;
  const std::string data = f.dir("tokens.u16"), d = f.dir("ckpt"), metrics = f.dir("m.jsonl");
  fs::copy_file(napkin::testing::source_path("tests/e2e/data/gpt/tokens.u16"), data);
  // The trainer runs in the background; once it has logged a few steps the
  // file is cut to 64 bytes under it (its pages vanish: a SIGBUS without the guard).
  Run r = sh(fmt::format(
      "( {} --data {} --quiet --steps 1000000 --checkpoint-every 1000000 --checkpoint-dir {} --metrics {} "
      "> {}/out.txt 2>&1; echo $? > {}/rc.txt ) & "
      "for i in $(seq 600); do [ -f {} ] && [ $(wc -l < {}) -ge 3 ] && break; sleep 0.05; done; "
      "truncate -s 64 {}; wait; cat {}/out.txt; echo rc=$(cat {}/rc.txt)",
      f.trainer, data, d, metrics, f.tmp.path, f.tmp.path, metrics, metrics, data, f.tmp.path, f.tmp.path));
  INFO(r.out);
  CHECK(r.out.find("rc=1") != std::string::npos);
  CHECK(r.out.find(data + ": the file shrank while the trainer was reading it") != std::string::npos);
  CHECK(r.out.find("saved step ") != std::string::npos);
  REQUIRE(checkpoints_in(d).size() == 1);
  // And the saved state resumes.
  Run again = sh(fmt::format("{} --data tests/e2e/data/gpt/tokens.u16 --quiet --resume {} --steps {}", f.trainer, d,
                             napkin::runtime::list_checkpoints(d).front().first + 1));
  INFO(again.out);
  CHECK(again.status == 0);
}

TEST_CASE("trainer: the checkpoint dir is checked and cleaned at start-up") {
  Fixture f;
  write_bytes(f.dir("a-file"), "");
  Run r = f.train(fmt::format("--steps 5 --checkpoint-every 5 --log-every 1 --checkpoint-dir {}/sub --metrics {}",
                               f.dir("a-file"), f.dir("m.jsonl")));
  INFO(r.out);
  CHECK(r.status == 1);
  CHECK(r.out.find("cannot create the checkpoint directory") != std::string::npos);
  CHECK(read_bytes(f.dir("m.jsonl")).find("\"step\"") == std::string::npos);  // before any step ran (was: after 5)

  const std::string d = f.dir("ckpt");
  fs::create_directories(d);
  write_bytes(d + "/.tmp-step-000010.safetensors-AbC123", std::string(1000, 'x'));
  Run clean = sh(fmt::format("{} {} --steps 1 --checkpoint-dir {}", f.trainer, f.data, d));
  INFO(clean.out);
  CHECK(clean.status == 0);
  CHECK(clean.out.find("removed 1 temporary file that interrupted saves left in " + d) != std::string::npos);
  CHECK(!fs::exists(d + "/.tmp-step-000010.safetensors-AbC123"));
}

TEST_CASE("trainer: flags it cannot honour are refused with exit 1") {
  Fixture f;
  struct Case {
    const char* flags;
    const char* says;
  };
  for (const Case& c : std::vector<Case>{
           {"--steps -5", "--steps: '-5' is not a whole number from 0 to 1000000000000"},
           {"--steps 99999999999999999999", "is not a whole number from 0 to 1000000000000"},
           {"--keep -1", "--keep: '-1' is not a whole number"},
           {"--checkpoint-every -2", "--checkpoint-every: '-2'"},
           {"--log-every -1", "--log-every: '-1'"},
           {"--eval-batches 0", "--eval-batches: '0'"},
           {"--threads 100000", "--threads: '100000' is not a whole number from 0 to 1024"},
           {"--no-such-flag", "The following argument was not expected: --no-such-flag"},
           {"--steps 2 --checkpoint-dir ''", "--checkpoint-dir is empty"},
           {"--steps 0", "--steps 0 trains nothing; to save the initial weights, add --checkpoint-dir DIR"},
       }) {
    CAPTURE(c.flags);
    Run r = f.train(c.flags);
    INFO(r.out);
    CHECK(r.status == 1);
    CHECK(r.out.find(c.says) != std::string::npos);
  }
}

TEST_CASE("trainer: --steps 0 saves the initial weights - resuming past --steps says so") {
  Fixture f;
  const std::string d = f.dir("init");
  Run r = f.train("--steps 0 --seed 3 --checkpoint-dir " + d);
  INFO(r.out);
  CHECK(r.status == 0);
  CHECK(r.out.find("--steps 0: saved the initial weights as " + d + "/step-000000.safetensors") != std::string::npos);
  REQUIRE(fs::exists(d + "/step-000000.safetensors"));
  // The same seed gives the same weights: step 0 of a fresh run is reproducible.
  Run again = f.train("--steps 0 --seed 3 --checkpoint-dir " + f.dir("init2"));
  REQUIRE(again.status == 0);
  napkin::runtime::SafetensorsFile a(d + "/step-000000.safetensors"), b(f.dir("init2") + "/step-000000.safetensors");
  REQUIRE(a.data_size() == b.data_size());
  CHECK(std::memcmp(a.data_section(), b.data_section(), a.data_size()) == 0);

  // A full checkpoint as --init: its weights, its optimizer state ignored, said so.
  Run init = sh(fmt::format("{} {} --steps 1 --init {}/step-000000.safetensors", f.trainer, f.data, d));
  INFO(init.out);
  CHECK(init.status == 0);
  CHECK(init.out.find("ignored the optimizer state it holds") != std::string::npos);

  const std::string run = f.dir("run");
  REQUIRE(f.train("--steps 6 --checkpoint-dir " + run).status == 0);
  Run past = f.train("--steps 4 --resume " + run);
  CHECK(past.status == 1);
  CHECK(past.out.find("is at step 6, past --steps 4: pass --steps N with N > 6") != std::string::npos);
  Run done = f.train("--steps 6 --resume " + run);
  CHECK(done.status == 0);
  CHECK(done.out.find("already at step 6 of 6: nothing to train") != std::string::npos);
}

TEST_CASE("trainer: no eval data is a warning - .npy files given with --data-file are not split") {
  Fixture f;
  // 300 tokens: the held-out 10% (30) is shorter than a window (33).
  std::string tokens = read_bytes(napkin::testing::source_path("tests/e2e/data/gpt/tokens.u16")).substr(0, 600);
  write_bytes(f.dir("short.u16"), tokens);
  Run r = sh(fmt::format("{} --data {} --quiet --steps 1 --eval-every 1", f.trainer, f.dir("short.u16")));
  INFO(r.out);
  CHECK(r.status == 0);
  CHECK(r.out.find("warning: --eval-every 1 asks for a held-out loss, but there is no eval data") != std::string::npos);

  // The model's split (0.9) is for its token file: 10 rows of .npy train on all 10.
  std::vector<int32_t> rows(10 * 32, 7);
  napkin::runtime::write_npy(f.dir("x.npy"), "<i4", {10, 32}, rows.data(), rows.size() * 4);
  napkin::runtime::write_npy(f.dir("y.npy"), "<i4", {10, 32}, rows.data(), rows.size() * 4);
  Run npy = sh(fmt::format("{} --steps 1 --data-file tokens={} --data-file targets={}", f.trainer, f.dir("x.npy"),
                           f.dir("y.npy")));
  INFO(npy.out);
  CHECK(npy.status == 0);
  CHECK(npy.out.find("10 rows (all train, eval on the train rows)") != std::string::npos);
}

TEST_CASE("trainer: floating-point flags refuse nan, inf and negatives - --collective-timeout nan no longer turns the watchdog off (issue 36 item 5b)") {
  Fixture f;
  for (const char* flags : {"--collective-timeout nan", "--collective-timeout inf", "--collective-timeout -1",
                            "--collective-timeout 1x", "--bucket-mib nan", "--bucket-mib -0.5", "--bucket-mib inf"}) {
    CAPTURE(flags);
    Run r = f.train(std::string("--steps 1 ") + flags);
    INFO(r.out);
    CHECK(r.status == 1);
    CHECK(r.out.find(std::string(flags).substr(0, std::string(flags).find(' ')) + ": '") != std::string::npos);
    CHECK(r.out.find("' is not a number from ") != std::string::npos);
  }
  Run fine = f.train("--steps 1 --collective-timeout 2.5 --bucket-mib 0.5");
  INFO(fine.out);
  CHECK(fine.status == 0);
}

TEST_CASE("trainer: a token id at or above the vocabulary is a data error naming the file and position, the last step saved (issue 36 item 13)") {
  Fixture f;
  // The model's vocab is 256 (bytes): id 256 at position 1,000 is in window 31 (tokens 992 to 1,024), which the
  // sequential order reads as row 3 of step 8 (batch 4).
  std::string tokens = read_bytes(napkin::testing::source_path("tests/e2e/data/gpt/tokens.u16"));
  tokens[2000] = 0, tokens[2001] = 1;  // little-endian 256
  const std::string data = f.dir("bad.u16"), d = f.dir("ckpt");
  write_bytes(data, tokens);
  Run r = sh(fmt::format("{} --data {} --order sequential --quiet --steps 20 --checkpoint-every 100 --checkpoint-dir {}",
                         f.trainer, data, d));
  INFO(r.out);
  CHECK(r.status == 1);
  CHECK(r.out.find(data + ": token 256 at position 1,000 is not below the vocabulary size 256") != std::string::npos);
  CHECK(r.out.find("stopped after step 7: saved step 7 as " + d + "/step-000007.safetensors") != std::string::npos);
  CHECK(checkpoints_in(d) == std::vector<std::string>{"step-000007.safetensors"});
  // The program says which inputs are ids, and their bound.
  Run program = sh(f.trainer + " --print-program");
  REQUIRE(program.status == 0);
  for (const auto& t : nlohmann::json::parse(program.out)["tensors"])
    if (t["role"] == "input") CHECK(t["index_bound"] == 256);
}

TEST_CASE("trainer: the banner states the learning-rate schedule built in - a --steps that is not its length is a warning (issue 36 item 7)") {
  napkin::testing::TempDir tmp("e2e-schedule");
  std::string yaml = napkin::testing::read_source("models/gpt.yaml");
  const size_t at = yaml.find("  checkpoint: {");
  REQUIRE(at != std::string::npos);
  yaml.erase(at, yaml.find('\n', at) + 1 - at);
  auto replace_line = [&](const std::string& start, const std::string& line) {
    const size_t from = yaml.find("\n" + start);
    REQUIRE(from != std::string::npos);
    yaml.replace(from + 1, yaml.find('\n', from + 1) - from - 1, line);
  };
  replace_line("optimizer: ", "optimizer: adamw(lr=6e-4, schedule=cosine, warmup=700, min_lr=6e-5)");
  replace_line("  steps: ", "  steps: 19073");
  write_bytes(tmp / "gpt.yaml", yaml);
  const std::string trainer = tmp / "trainer";
  Run built = sh(fmt::format("{} build {} --dims {} -o {} --quiet", NAPKIN_BINARY, tmp / "gpt.yaml", kDims, trainer));
  INFO(built.out);
  REQUIRE(built.status == 0);

  Run r = sh(trainer + " --data tests/e2e/data/gpt/tokens.u16 --steps 20 --checkpoint-every 0 --log-every 20");
  INFO(r.out);
  CHECK(r.status == 0);
  CHECK(r.out.find("  schedule   cosine: warmup 700 steps, then decay to min_lr 6e-05, ending at step 19,073 "
                   "(train.steps when napkin built this trainer)") != std::string::npos);
  CHECK(r.out.find("warning: --steps 20 is not the length of this trainer's learning-rate schedule") != std::string::npos);
  CHECK(r.out.find("the run ends at step 20, inside the warmup, at lr 1.714e-05 of 0.0006") != std::string::npos);
  CHECK(r.out.find("set train.steps: 20 in the model's YAML and rebuild") != std::string::npos);

  // The model's own schedule (constant, no warmup) fits any --steps: no warning.
  Fixture f;
  Run plain = sh(f.trainer + " " + f.data + " --steps 2 --checkpoint-every 0");
  INFO(plain.out);
  CHECK(plain.status == 0);
  CHECK(plain.out.find("  schedule   constant\n") != std::string::npos);
  CHECK(plain.out.find("warning: --steps") == std::string::npos);
}

TEST_CASE("trainer: --metrics appends, never truncates - napkin train's YAML log.metrics too - napkin plot draws each run") {
  napkin::testing::TempDir tmp("e2e-metrics-append");
  const std::string data = napkin::testing::source_path("tests/e2e/data/gpt/tokens.u16");
  // Twice through napkin train, from a scratch directory: the model's
  // log.metrics (a variant's own file) gets both runs.
  for (int run = 0; run < 2; ++run) {
    Run r = sh(fmt::format("cd {} && {} train {} --dims {} -- --data {} --steps 2 --log-every 1 --checkpoint-every 0 --quiet",
                           tmp.path, NAPKIN_BINARY, napkin::testing::source_path("models/gpt.yaml"), kDims, data));
    INFO(r.out);
    REQUIRE(r.status == 0);
  }
  const std::string metrics = tmp / "metrics/gpt@batch=4,d=32,heads=2,layers=1,seq=32.jsonl";
  const std::string text = read_bytes(metrics);
  INFO(text);
  std::vector<std::string> runs;
  int steps = 0;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains("run")) runs.push_back(j["run"]);
    if (j.contains("loss")) ++steps;
  }
  CHECK(runs.size() == 2);
  CHECK(steps == 4);
  Run plot = sh(fmt::format("{} plot {} -o {}", NAPKIN_BINARY, metrics, tmp / "plot.svg"));
  INFO(plot.out);
  CHECK(plot.status == 0);
  CHECK(plot.out.find("(2 runs)") != std::string::npos);
}

TEST_CASE("trainer: a NaN eval loss is written as null (valid JSON) - napkin plot reads the file") {
  napkin::testing::TempDir tmp("e2e-nan-eval");
  // Finite on the training half of the data (targets 5: log 4), NaN on the
  // held-out half (targets 0: log -1).
  write_bytes(tmp / "nan-eval.yaml", R"(model: nan-eval
dims: {batch: 2, seq: 4, vocab: 8}
inputs:
  tokens: {shape: [batch, seq], dtype: i32}
  targets: {shape: [batch, seq], dtype: i32}
params:
  w: {shape: [vocab, 1], init: zeros}
forward:
  - e: embedding(w, tokens)
loss: mean(e) + mean(log(cast(targets, f32) - 1))
optimizer: sgd(lr=0.01)
precision: fp32
train:
  steps: 2
  data: {format: tokens, path: tokens.u16, dtype: u16, order: sequential, split: 0.5}
)");
  std::vector<uint16_t> tokens(40, 5);
  std::fill(tokens.begin() + 20, tokens.end(), 0);
  write_bytes(tmp / "tokens.u16", std::string(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 2));
  REQUIRE(sh(fmt::format("{} build {} -o {} --quiet", NAPKIN_BINARY, tmp / "nan-eval.yaml", tmp / "trainer")).status == 0);
  const std::string metrics = tmp / "m.jsonl";
  Run r = sh(fmt::format("{} --data {} --steps 2 --eval-every 1 --metrics {}", tmp / "trainer", tmp / "tokens.u16", metrics));
  INFO(r.out);
  REQUIRE(r.status == 0);
  const std::string text = read_bytes(metrics);
  INFO(text);
  int evals = 0;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    nlohmann::json j = nlohmann::json::parse(line);  // throws on "-nan"
    if (j.contains("eval_loss")) {
      ++evals;
      CHECK(j["eval_loss"].is_null());
    }
  }
  CHECK(evals == 2);
  Run plot = sh(fmt::format("{} plot {} -o {}", NAPKIN_BINARY, metrics, tmp / "plot.svg"));
  INFO(plot.out);
  CHECK(plot.status == 0);
}
