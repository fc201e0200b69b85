// A model trained on BPE tokens, end to end through napkin's own tools: a
// tokenizer trained (napkin data bpe) and a corpus encoded with it (napkin
// data encode --tokenizer), models/llama-bpe.yaml trained on it for a few
// steps, and sampled: the text napkin sample prints by the tokenizer must be
// the tokenizer's decoding of the ids the same greedy run samples without
// it, and a tokenizer that does not fit the model is refused.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <sstream>
#include <string>
#include <vector>

#include "runtime/tokenizer.h"
#include "support/test_io.h"

namespace {

using napkin::testing::TempDir;
using Run = napkin::testing::CommandResult;
Run sh(const std::string& command) { return napkin::testing::run_in_source_tree(command); }

const char* kDims = "batch=2,seq=32,vocab=300,d=32,heads=2,kv_heads=2,hidden=48,layers=2";
const char* kCorpus = "tests/e2e/data/bpe/kjv.txt tests/e2e/data/bpe/web.txt";

// What the sampler wrote on stdout (its progress goes to stderr, kept apart).
Run sample(const TempDir& dir, const std::string& args) {
  return sh(fmt::format("XDG_CACHE_HOME={0}/cache {1} sample models/llama-bpe.yaml --dims {2} --checkpoint {0}/ckpt "
                        "{3} 2>{0}/stderr; echo \"[status $?]\"; cat {0}/stderr",
                        dir.path, NAPKIN_BINARY, kDims, args));
}

std::string text_of(const Run& r) { return r.out.substr(0, r.out.find("[status ")); }

}  // namespace

TEST_CASE("sample: a model trained on BPE tokens prints text by its tokenizer, the decoding of the ids it samples") {
  TempDir dir("sample-bpe");
  const std::string tok = dir / "tok.json";
  Run r = sh(fmt::format("{} data bpe {} --vocab 300 --special '<|endoftext|>' -o {} --quiet", NAPKIN_BINARY, kCorpus,
                         tok));
  INFO(r.out);
  REQUIRE(r.status == 0);
  r = sh(fmt::format("{} data encode --tokenizer {} --eot {} -o {}", NAPKIN_BINARY, tok, kCorpus, dir / "t.u16"));
  REQUIRE(r.status == 0);
  // Trained with the tokenizer given (the model's own, data/bibles.tokenizer.json, is tools/bpe_data.sh's).
  r = sh(fmt::format("XDG_CACHE_HOME={0}/cache {1} train models/llama-bpe.yaml --dims {2} -- --steps 30 --data "
                     "{0}/t.u16 --tokenizer {3} --sample-every 30 --sample-tokens 12 --checkpoint-dir {0}/ckpt "
                     "--eval-every 0 --metrics {0}/m.jsonl --threads 2",
                     dir.path, NAPKIN_BINARY, kDims, tok));
  INFO(r.out);
  REQUIRE(r.status == 0);
  CHECK(r.out.find("step     30/30  sample:\n") != std::string::npos);
  CHECK(r.out.find("<|id") == std::string::npos);

  const napkin::tokenizer::Tokenizer t = napkin::tokenizer::Tokenizer::load(tok);
  const std::string prompt = "And God said";
  Run text = sample(dir, fmt::format("--tokenizer {} --prompt '{}' --tokens 20 --temperature 0", tok, prompt));
  INFO(text.out);
  REQUIRE(text.out.find("[status 0]") != std::string::npos);
  // The same greedy run from the prompt's ids, without a tokenizer: ids printed as numbers.
  std::vector<int32_t> prompt_ids;
  napkin::tokenizer::Encoder(t).encode(prompt, prompt_ids);
  std::string ids_text;
  for (int32_t id : prompt_ids) ids_text += std::to_string(id) + " ";
  napkin::testing::write_bytes(dir / "prompt.txt", ids_text);
  Run ids = sample(dir, fmt::format("--tokenizer '' --prompt-ids {} --tokens 20 --temperature 0", dir / "prompt.txt"));
  INFO(ids.out);
  REQUIRE(ids.out.find("[status 0]") != std::string::npos);
  std::vector<int32_t> sampled;
  std::istringstream in(text_of(ids));
  for (int32_t id; in >> id;) sampled.push_back(id);
  REQUIRE(sampled.size() == prompt_ids.size() + 20);
  CHECK(text_of(text) == t.decode(sampled) + "\n");
  CHECK(text_of(text).rfind(prompt, 0) == 0);

  // The default start is the tokenizer's <|endoftext|>, printed as its text.
  Run start = sample(dir, fmt::format("--tokenizer {} --tokens 5", tok));
  CHECK(text_of(start).rfind("<|endoftext|>", 0) == 0);
  // A tokenizer larger than the model's vocabulary, or of another kind, is refused.
  Run larger = sample(dir, "--tokenizer tests/e2e/data/bpe/hf_tokenizer.json --tokens 5");
  CHECK(larger.out.find("[status 1]") != std::string::npos);
  CHECK(larger.out.find("the tokenizer has 1000 tokens, more than the model's vocabulary of 300") != std::string::npos);
  napkin::testing::write_bytes(dir / "wordpiece.json", R"({"model": {"type": "WordPiece", "vocab": {"a": 0}}})");
  Run other = sample(dir, fmt::format("--tokenizer {} --tokens 5", dir / "wordpiece.json"));
  CHECK(other.out.find("[status 1]") != std::string::npos);
  CHECK(other.out.find("a WordPiece tokenizer: napkin reads byte-level BPE tokenizers") != std::string::npos);
}
