// `napkin data bpe` end to end: the tokenizer.json it writes loads, holds
// the trainer's merges and special tokens, encodes and decodes its corpus
// back, and is the same file byte for byte on every run; bad input stops it
// with status 1 and nothing written.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <filesystem>
#include <string>
#include <vector>

#include "runtime/tokenizer.h"
#include "support/test_io.h"
#include "tools/bpe_train.h"

namespace {

using napkin::testing::read_bytes;
using napkin::testing::TempDir;
using napkin::testing::write_bytes;
using Run = napkin::testing::CommandResult;
Run sh(const std::string& command) { return napkin::testing::run_in_source_tree(command); }

}  // namespace

TEST_CASE("napkin data bpe: README.md gives a tokenizer.json with the trainer's merges, the same file every run") {
  TempDir dir("data-bpe");
  Run r = sh(fmt::format("{} data bpe README.md --vocab 400 --special '<|endoftext|>' -o {} --threads 2", NAPKIN_BINARY,
                         dir / "a.json"));
  REQUIRE_MESSAGE(r.status == 0, r.out);
  CHECK(r.out.find("wrote " + dir / "a.json" + ": vocab 400 (256 bytes, 143 merges, 1 special token)") !=
        std::string::npos);
  r = sh(fmt::format("{} data bpe README.md --vocab 400 --special '<|endoftext|>' -o {} --threads 1 --quiet",
                     NAPKIN_BINARY, dir / "b.json"));
  REQUIRE_MESSAGE(r.status == 0, r.out);
  CHECK(read_bytes(dir / "a.json") == read_bytes(dir / "b.json"));

  napkin::tools::BpeOptions options;
  options.vocab_size = 400;
  options.specials = {"<|endoftext|>"};
  napkin::tools::BpeResult trained = napkin::tools::train_bpe({"README.md"}, options, {});
  napkin::tokenizer::Tokenizer t = napkin::tokenizer::Tokenizer::load(dir / "a.json");
  REQUIRE(t.vocab_size() == 400);
  REQUIRE(t.merges().size() == trained.merges.size());
  for (size_t m = 0; m < trained.merges.size(); ++m) {
    CHECK(t.token_bytes(t.merges()[m].first) == trained.merges[m].first);
    CHECK(t.token_bytes(t.merges()[m].second) == trained.merges[m].second);
    CHECK(t.token_bytes(static_cast<int32_t>(256 + m)) == trained.merges[m].first + trained.merges[m].second);
  }
  REQUIRE(t.specials().size() == 1);
  CHECK(t.specials()[0].id == 399);

  std::string text = read_bytes("README.md") + "<|endoftext|>" + read_bytes("README.md");
  std::vector<int32_t> ids;
  napkin::tokenizer::Encoder(t).encode(text, ids);
  CHECK(t.decode(ids) == text);
  CHECK(ids.size() < text.size() * 2 / 3);  // 143 merges of a text's commonest pairs shorten it by a third at least
}

TEST_CASE("napkin data bpe: an empty corpus, a small vocab, a missing or unreadable input, -o an input: status 1, nothing written") {
  TempDir dir("data-bpe");
  write_bytes(dir / "empty.txt", "");
  write_bytes(dir / "text.txt", "some text");
  const std::string out = dir / "tok.json";
  struct Case {
    std::string args, message;
  };
  for (const Case& c : std::vector<Case>{
           {fmt::format("{} --vocab 1000 -o {}", dir / "empty.txt", out), dir / "empty.txt" + " has no text to train on"},
           {fmt::format("{} --vocab 200 -o {}", dir / "text.txt", out), "--vocab 200 is too small: the 256 byte tokens take 256"},
           {fmt::format("{} --vocab 257 -o {} --special '<|endoftext|>' --special '<|pad|>'", dir / "text.txt", out),
            "the 256 byte tokens and 2 special tokens take 258"},
           {fmt::format("{} --vocab 1000 -o {}", dir / "missing.txt", out), "missing.txt: cannot read"},
           {fmt::format("{} --vocab 1000 -o {}", dir.path, out), "is a directory"},
           {fmt::format("{} --vocab 1000 -o {}", dir / "text.txt", dir / "text.txt"), "is also an input"},
       }) {
    CAPTURE(c.args);
    Run r = sh(fmt::format("{} data bpe {}", NAPKIN_BINARY, c.args));
    CHECK(r.status == 1);
    CHECK_MESSAGE(r.out.find("error: ") != std::string::npos, r.out);
    CHECK_MESSAGE(r.out.find(c.message) != std::string::npos, r.out);
    CHECK_FALSE(std::filesystem::exists(out));
  }
  CHECK(read_bytes(dir / "text.txt") == "some text");
}
