// `napkin sample` end to end: a gpt trained for a few steps by its trainer,
// then sampled by the compiled prefill and KV-cache decoder (built and
// cached like trainers): the same seed gives the same text, and bad input (a
// checkpoint of another model, a prompt longer than the context, bytes
// outside the vocabulary, a model that is not a language model, a flag
// mistake, a temperature that is not a finite number, a --prompt-ids path
// that is not a regular file, a --checkpoint symlink loop, a damaged newest
// checkpoint, a cache that cannot be made) stops with a clear message and
// exit status 1.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <string>

#include "runtime/npy.h"
#include "support/test_io.h"

namespace {

using napkin::testing::TempDir;
using Run = napkin::testing::CommandResult;
Run sh(const std::string& command) { return napkin::testing::run_in_source_tree(command); }

const char* kDims = "batch=2,seq=16,d=32,heads=2,layers=2";

// The build cache of the tests that share one (its trainer and sampler built once).
const std::string& shared_cache() {
  static const TempDir cache("sample-cache");
  return cache.path;
}

// Trains gpt at `dims` for 3 steps into dir/ckpt (`more`: further trainer
// flags); returns the directory. cache: "" for dir/cache.
std::string trained(const TempDir& dir, const std::string& dims, const std::string& cache = "",
                    const std::string& more = "") {
  const std::string ckpt = dir.path + "/ckpt";
  Run r = sh(fmt::format("XDG_CACHE_HOME={4} {1} train models/gpt.yaml --dims {2} -- --steps 3 --checkpoint-dir "
                         "{3} --eval-every 0 --quiet --metrics {0}/m.jsonl {5}",
                         dir.path, NAPKIN_BINARY, dims, ckpt, cache.empty() ? dir.path + "/cache" : cache, more));
  INFO(r.out);
  REQUIRE(r.status == 0);
  return ckpt;
}

Run sample(const TempDir& dir, const std::string& args, const std::string& dims = kDims, const std::string& cache = "") {
  return sh(fmt::format("XDG_CACHE_HOME={} {} sample models/gpt.yaml --dims {} {} 2>{}/stderr; echo \"[status $?]\"; "
                        "cat {}/stderr",
                        cache.empty() ? dir.path + "/cache" : cache, NAPKIN_BINARY, dims, args, dir.path, dir.path));
}

// What the sampler printed on stdout (before the status line).
std::string text_of(const Run& r) { return r.out.substr(0, r.out.find("[status ")); }

}  // namespace

TEST_CASE("sample: napkin sample continues a prompt from a checkpoint, the same seed gives the same text") {
  TempDir dir("sample");
  const std::string ckpt = trained(dir, kDims);
  Run a = sample(dir, fmt::format("--checkpoint {} --prompt 'napkin ' --tokens 40 --seed 7", ckpt));
  INFO(a.out);
  REQUIRE(a.out.find("[status 0]") != std::string::npos);
  CHECK(a.out.find("built gpt-char") != std::string::npos);  // built, then cached below
  CHECK(text_of(a).rfind("napkin ", 0) == 0);                 // the prompt, then what the model writes
  CHECK(text_of(a).size() == std::string("napkin ").size() + 40 + 1);  // 40 bytes and a newline
  CHECK(a.out.find("tok/s") != std::string::npos);
  CHECK(a.out.find("step 3") != std::string::npos);
  Run b = sample(dir, fmt::format("--checkpoint {} --prompt 'napkin ' --tokens 40 --seed 7", ckpt));
  CHECK(b.out.find("using the cached sampler") != std::string::npos);
  CHECK(text_of(b) == text_of(a));
  Run c = sample(dir, fmt::format("--checkpoint {} --prompt 'napkin ' --tokens 40 --seed 8", ckpt));
  CHECK(text_of(c) != text_of(a));
  // The prompt by the prefill program or by decode steps: the same cache, so the same greedy text.
  Run by_prefill = sample(dir, fmt::format("--checkpoint {} --prompt 'napkin ' --tokens 30 --temperature 0 "
                                           "--prompt-path prefill", ckpt));
  Run by_steps = sample(dir, fmt::format("--checkpoint {} --prompt 'napkin ' --tokens 30 --temperature 0 "
                                         "--prompt-path steps", ckpt));
  CHECK(by_prefill.out.find("by the prefill of 16 positions") != std::string::npos);
  CHECK(by_steps.out.find("by 7 decode steps") != std::string::npos);
  CHECK(text_of(by_steps) == text_of(by_prefill));
  // Past the context of 16: the window goes in again and decoding goes on.
  Run longer = sample(dir, fmt::format("--checkpoint {} --tokens 50 --temperature 0", ckpt));
  INFO(longer.out);
  CHECK(longer.out.find("[status 0]") != std::string::npos);
  CHECK(longer.out.find("went in again") != std::string::npos);
}

TEST_CASE("sample: a model with computed rotary positions writes the same greedy text by prefill, by steps and by auto") {
  // tests/e2e/data/rotary.yaml computes its RoPE frequencies in the graph:
  // the sampler's setup computes them before either path reads them.
  TempDir dir("sample-rotary");
  Run r = sh(fmt::format("XDG_CACHE_HOME={0}/cache {1} train tests/e2e/data/rotary.yaml -- --steps 0 --checkpoint-dir "
                         "{0}/ckpt --data tests/e2e/data/gpt/tokens.u16 --quiet",
                         dir.path, NAPKIN_BINARY));
  INFO(r.out);
  REQUIRE(r.status == 0);
  auto greedy = [&](const char* path) {
    return sh(fmt::format("XDG_CACHE_HOME={0}/cache {1} sample tests/e2e/data/rotary.yaml --checkpoint {0}/ckpt "
                          "--prompt 'ab' --tokens 14 --temperature 0 --prompt-path {2} 2>{0}/stderr; echo \"[status "
                          "$?]\"; cat {0}/stderr",
                          dir.path, NAPKIN_BINARY, path));
  };
  Run by_prefill = greedy("prefill"), by_steps = greedy("steps"), by_auto = greedy("auto");
  INFO(by_prefill.out);
  INFO(by_steps.out);
  REQUIRE(by_prefill.out.find("[status 0]") != std::string::npos);
  CHECK(by_prefill.out.find("by the prefill of 16 positions") != std::string::npos);
  CHECK(by_steps.out.find("by 2 decode steps") != std::string::npos);
  CHECK(text_of(by_prefill).size() == 2 + 14 + 1);
  CHECK(text_of(by_steps) == text_of(by_prefill));
  CHECK(text_of(by_auto) == text_of(by_prefill));
}

TEST_CASE("sample: --logits writes the logits of every prompt position, whose last row's argmax is the greedy token") {
  TempDir dir("sample-logits");
  const std::string ckpt = trained(dir, kDims);
  const std::string file = dir.path + "/logits.npy";
  Run r = sample(dir, fmt::format("--checkpoint {} --prompt 'napkin' --tokens 1 --temperature 0 --prompt-path steps "
                                  "--logits {}", ckpt, file));
  INFO(r.out);
  REQUIRE(r.out.find("[status 0]") != std::string::npos);
  CHECK(r.out.find("by the prefill") != std::string::npos);  // --logits takes the prefill, whatever --prompt-path says
  const napkin::runtime::NpyArray logits = napkin::runtime::read_npy(file);
  REQUIRE(logits.shape == std::vector<int64_t>{6, 256});  // "napkin": 6 positions of a 256-token vocabulary
  CHECK(logits.descr == "<f4");
  const float* last = reinterpret_cast<const float*>(logits.data) + 5 * 256;
  const int64_t argmax = std::max_element(last, last + 256) - last;
  const std::string text = text_of(r);
  REQUIRE(text.size() == 6 + 1 + 1);
  CHECK(static_cast<unsigned char>(text[6]) == argmax);
  // Rows differ: each position's own logits, not one row repeated.
  const float* first = reinterpret_cast<const float*>(logits.data);
  CHECK_FALSE(std::equal(first, first + 256, last));
}

TEST_CASE("sample: bad input is a clear error with exit status 1") {
  TempDir dir("sample-errors");
  const std::string ckpt = trained(dir, kDims);
  struct Case {
    std::string args, dims, message;
  };
  const Case cases[] = {
      {"--prompt 'this prompt is longer than sixteen bytes'", kDims, "more than the model's context of 16"},
      {"--prompt 'Az'", "batch=2,seq=16,d=32,heads=2,layers=2,vocab=100", "byte 122 (0x7a) at offset 1 is outside"},
      {"--prompt 'a'", "batch=2,seq=16,d=64,heads=2,layers=2", "different model"},
      {"--prompt 'a' --checkpoint /nonexistent/ckpt", kDims, "no checkpoint at /nonexistent/ckpt"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.args);
    Run r = sample(dir, (c.args.find("--checkpoint") == std::string::npos ? "--checkpoint " + ckpt + " " : "") + c.args,
                   c.dims);
    INFO(r.out);
    CHECK(r.out.find("[status 1]") != std::string::npos);
    CHECK(r.out.find(c.message) != std::string::npos);
  }
  Run mlp = sh(fmt::format("XDG_CACHE_HOME={}/cache {} sample models/mlp.yaml", dir.path, NAPKIN_BINARY));
  INFO(mlp.out);
  CHECK(mlp.status == 1);
  CHECK(mlp.out.find("is not a language model") != std::string::npos);
}

TEST_CASE("sample: a language model's trainer prints a sample every K steps with --sample-every, others refuse it") {
  TempDir dir("sample-every");
  Run r = sh(fmt::format("XDG_CACHE_HOME={0}/cache {1} train models/gpt.yaml --dims {2} -- --steps 4 --sample-every 2 "
                         "--sample-tokens 12 --checkpoint-every 0 --eval-every 0 --metrics {0}/m.jsonl",
                         dir.path, NAPKIN_BINARY, kDims));
  INFO(r.out);
  REQUIRE(r.status == 0);
  CHECK(r.out.find("step      2/4  sample:\n") != std::string::npos);
  CHECK(r.out.find("step      4/4  sample:\n") != std::string::npos);
  // The same step's sample twice: the same text (its seed is the run's seed plus the step).
  Run again = sh(fmt::format("XDG_CACHE_HOME={0}/cache {1} train models/gpt.yaml --dims {2} -- --steps 4 --sample-every 2 "
                             "--sample-tokens 12 --checkpoint-every 0 --eval-every 0 --metrics {0}/m.jsonl",
                             dir.path, NAPKIN_BINARY, kDims));
  const auto sample_at = [](const std::string& out, const char* step) {  // the 12 bytes after the header
    const std::string header = std::string(step) + "  sample:\n";
    const size_t at = out.find(header);
    return at == std::string::npos ? std::string() : out.substr(at + header.size(), 12);
  };
  CHECK(sample_at(r.out, "step      4/4").size() == 12);
  CHECK(sample_at(again.out, "step      4/4") == sample_at(r.out, "step      4/4"));

  Run mlp = sh(fmt::format("XDG_CACHE_HOME={0}/cache {1} train models/mlp.yaml -- --steps 2 --sample-every 1 "
                           "--checkpoint-every 0 --metrics {0}/m.jsonl",
                           dir.path, NAPKIN_BINARY));
  INFO(mlp.out);
  CHECK(mlp.status == 1);
  CHECK(mlp.out.find("carries no sampler program") != std::string::npos);
}

TEST_CASE("sample: a run trained under --memory-budget is sampled with the same budget, and the error says so") {
  TempDir dir("sample-budget");
  const std::string dims = "batch=4,seq=32,d=64,heads=2,layers=2";
  Run r = sh(fmt::format("XDG_CACHE_HOME={0}/cache {1} train models/gpt.yaml --dims {2} --memory-budget 2500KiB -- "
                         "--steps 2 --checkpoint-dir {0}/ckpt --eval-every 0 --quiet --metrics {0}/m.jsonl",
                         dir.path, NAPKIN_BINARY, dims));
  INFO(r.out);
  REQUIRE(r.status == 0);
  Run without = sample(dir, fmt::format("--checkpoint {}/ckpt --tokens 4", dir.path), dims);
  INFO(without.out);
  CHECK(without.out.find("[status 1]") != std::string::npos);
  CHECK(without.out.find("written by a different model") != std::string::npos);
  CHECK(without.out.find("--memory-budget") != std::string::npos);
  Run with = sample(dir, fmt::format("--memory-budget 2500KiB --checkpoint {}/ckpt --tokens 4", dir.path), dims);
  INFO(with.out);
  CHECK(with.out.find("[status 0]") != std::string::npos);
}

TEST_CASE("sample: --temperature nan or inf is refused, and a tiny temperature such as 1e-320 is greedy, not garbage") {
  TempDir dir("sample-temperature");
  const std::string ckpt = trained(dir, kDims, shared_cache());
  for (const char* t : {"nan", "inf", "-inf", "1e400"}) {
    CAPTURE(t);
    Run r = sample(dir, fmt::format("--checkpoint {} --temperature {} --tokens 4", ckpt, t), kDims, shared_cache());
    INFO(r.out);
    CHECK(r.out.find("[status 1]") != std::string::npos);
    CHECK(r.out.find("--temperature") != std::string::npos);
    CHECK(r.out.find(fmt::format("'{}' is not a number from 0 to 100", t)) != std::string::npos);
  }
  Run greedy = sample(dir, fmt::format("--checkpoint {} --prompt 'napkin ' --tokens 20 --temperature 0", ckpt), kDims,
                      shared_cache());
  REQUIRE(greedy.out.find("[status 0]") != std::string::npos);
  for (const char* t : {"1e-310", "1e-320"}) {
    CAPTURE(t);
    Run r = sample(dir, fmt::format("--checkpoint {} --prompt 'napkin ' --tokens 20 --temperature {}", ckpt, t), kDims,
                   shared_cache());
    INFO(r.out);
    CHECK(r.out.find("[status 0]") != std::string::npos);
    CHECK(text_of(r) == text_of(greedy));
  }
}

TEST_CASE("sample: --prompt-ids reads a regular file only (not /dev/zero), and no further than the context") {
  TempDir dir("sample-prompt-ids");
  const std::string ckpt = trained(dir, kDims, shared_cache());
  Run zero = sample(dir, fmt::format("--checkpoint {} --prompt-ids /dev/zero --tokens 4", ckpt), kDims, shared_cache());
  INFO(zero.out);
  CHECK(zero.out.find("[status 1]") != std::string::npos);
  CHECK(zero.out.find("--prompt-ids /dev/zero: is not a regular file") != std::string::npos);
  // 100,000 ids where the context holds 16: refused at the 17th.
  std::string many;
  for (int i = 0; i < 100000; ++i) many += "65 ";
  napkin::testing::write_bytes(dir / "many.txt", many);
  Run longer = sample(dir, fmt::format("--checkpoint {} --prompt-ids {} --tokens 4", ckpt, dir / "many.txt"), kDims,
                      shared_cache());
  INFO(longer.out);
  CHECK(longer.out.find("[status 1]") != std::string::npos);
  CHECK(longer.out.find("more than 16 tokens, more than the model's context of 16") != std::string::npos);
  // One word of a million digits: refused by its first 24.
  napkin::testing::write_bytes(dir / "word.txt", std::string(1000000, '7'));
  Run word = sample(dir, fmt::format("--checkpoint {} --prompt-ids {} --tokens 4", ckpt, dir / "word.txt"), kDims,
                    shared_cache());
  INFO(word.out);
  CHECK(word.out.find("[status 1]") != std::string::npos);
  CHECK(word.out.find("token 0 ('777777777777777777777777') is not an id") != std::string::npos);
}

TEST_CASE("sample: flag mistakes, a symlink loop, a directory of ids and a corrupt newest checkpoint are user errors (status 1)") {
  TempDir dir("sample-user-errors");
  const std::string ckpt = trained(dir, kDims, shared_cache(), "--checkpoint-every 1 --keep 0");
  // CLI11's own codes (105, 108, 109) become 1, as the trainer's.
  for (const char* flags : {"--tokens abc", "--no-such-flag", "--prompt a --prompt-ids b", "--top-k"}) {
    CAPTURE(flags);
    Run r = sample(dir, fmt::format("--checkpoint {} {}", ckpt, flags), kDims, shared_cache());
    INFO(r.out);
    CHECK(r.out.find("[status 1]") != std::string::npos);
  }
  // A loop of symbolic links as --checkpoint.
  std::filesystem::create_symlink(dir / "loop", dir / "loop");
  Run loop = sample(dir, fmt::format("--checkpoint {} --tokens 4", dir / "loop"), kDims, shared_cache());
  INFO(loop.out);
  CHECK(loop.out.find("[status 1]") != std::string::npos);
  CHECK(loop.out.find("symbolic links") != std::string::npos);
  CHECK(loop.out.find("internal error") == std::string::npos);
  // A directory as --prompt-ids.
  Run ids = sample(dir, fmt::format("--checkpoint {} --prompt-ids {} --tokens 4", ckpt, dir.path), kDims, shared_cache());
  INFO(ids.out);
  CHECK(ids.out.find("[status 1]") != std::string::npos);
  CHECK(ids.out.find(fmt::format("--prompt-ids {}: is a directory", dir.path)) != std::string::npos);
  // The newest checkpoint damaged: the older ones that load are listed.
  const std::string newest = ckpt + "/step-000003.safetensors";
  std::string bytes = napkin::testing::read_bytes(newest);
  bytes[bytes.size() - 5] = static_cast<char>(bytes[bytes.size() - 5] ^ 0x55);
  napkin::testing::write_bytes(newest, bytes);
  Run corrupt = sample(dir, fmt::format("--checkpoint {} --tokens 4", ckpt), kDims, shared_cache());
  INFO(corrupt.out);
  CHECK(corrupt.out.find("[status 1]") != std::string::npos);
  CHECK(corrupt.out.find("the newest checkpoint in " + ckpt + " cannot be used; older ones that load:") !=
        std::string::npos);
  CHECK(corrupt.out.find(ckpt + "/step-000001.safetensors") != std::string::npos);
  CHECK(corrupt.out.find("--checkpoint " + ckpt + "/step-000002.safetensors") != std::string::npos);
}

TEST_CASE("sample: a build cache that cannot be made is a user error (status 1) that names XDG_CACHE_HOME") {
  // The message is tools/trainer_cache.cpp's (a cache that cannot be written
  // is a user error, for napkin train and napkin sample alike).
  TempDir dir("sample-cache-error");
  const std::string ckpt = trained(dir, kDims, shared_cache());
  // Under a regular file: the sampler's cache directory cannot be made.
  napkin::testing::write_bytes(dir / "file", "x");
  Run cache = sample(dir, fmt::format("--checkpoint {} --tokens 4", ckpt), kDims, dir / "file/cache");
  INFO(cache.out);
  CHECK(cache.out.find("[status 1]") != std::string::npos);
  CHECK(cache.out.find("error: the sampler cache " + dir / "file/cache/napkin: cannot create it") != std::string::npos);
  CHECK(cache.out.find("XDG_CACHE_HOME") != std::string::npos);
  CHECK(cache.out.find("internal error") == std::string::npos);
}
