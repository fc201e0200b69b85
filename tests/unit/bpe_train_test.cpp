// napkin data bpe's trainer (tools/bpe_train.h) against a merge list worked
// out by hand and against a straightforward trainer written here that
// recounts every pair before every merge: the same merges in the same order,
// whatever the thread count and however the files are cut into chunks.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "runtime/pretokenize.h"
#include "support/test_io.h"
#include "tools/bpe_train.h"

namespace {

using napkin::testing::error_of;
using napkin::testing::read_bytes;
using napkin::testing::TempDir;
using napkin::testing::write_bytes;
using napkin::tools::BpeOptions;
using napkin::tools::BpeResult;
using napkin::tools::train_bpe;
using Merges = std::vector<std::pair<std::string, std::string>>;

BpeResult train(const std::vector<std::string>& files, int64_t vocab, int threads,
                const std::vector<std::string>& specials = {}) {
  BpeOptions options;
  options.vocab_size = vocab;
  options.threads = threads;
  options.specials = specials;
  return train_bpe(files, options, {});
}

// The reference: the documents are cut at `special` (if any), pre-tokenized,
// and before each merge every pair of every distinct pre-token is counted
// again; the greatest (count, left bytes, right bytes) is merged, left to
// right in each pre-token. Stops after `new_tokens` new tokens or when no
// pair is left.
Merges reference_bpe(const std::vector<std::string>& documents, const std::string& special, int64_t new_tokens) {
  std::map<std::string, int64_t> piece_counts;
  for (const std::string& doc : documents) {
    std::vector<std::string_view> texts;
    std::string_view rest = doc;
    for (size_t at; !special.empty() && (at = rest.find(special)) != std::string_view::npos;) {
      texts.push_back(rest.substr(0, at));
      rest = rest.substr(at + special.size());
    }
    texts.push_back(rest);
    for (std::string_view text : texts)
      napkin::tokenizer::for_each_piece(text, [&](std::string_view piece) { ++piece_counts[std::string(piece)]; });
  }
  std::vector<std::string> bytes;
  for (int b = 0; b < 256; ++b) bytes.emplace_back(1, static_cast<char>(b));
  std::vector<std::pair<std::vector<int>, int64_t>> words;
  for (const auto& [piece, count] : piece_counts) {
    std::vector<int> ids;
    for (char c : piece) ids.push_back(static_cast<unsigned char>(c));
    words.emplace_back(ids, count);
  }
  Merges merges;
  for (int64_t made = 0; made < new_tokens;) {
    std::map<std::pair<int, int>, int64_t> counts;
    for (const auto& [ids, count] : words)
      for (size_t i = 0; i + 1 < ids.size(); ++i) counts[{ids[i], ids[i + 1]}] += count;
    if (counts.empty()) break;
    auto key = [&](const std::pair<const std::pair<int, int>, int64_t>& e) {
      return std::make_tuple(e.second, bytes[static_cast<size_t>(e.first.first)],
                             bytes[static_cast<size_t>(e.first.second)]);
    };
    auto best = std::max_element(counts.begin(), counts.end(),
                                 [&](const auto& x, const auto& y) { return key(x) < key(y); })->first;
    std::string merged = bytes[static_cast<size_t>(best.first)] + bytes[static_cast<size_t>(best.second)];
    merges.emplace_back(bytes[static_cast<size_t>(best.first)], bytes[static_cast<size_t>(best.second)]);
    auto existing = std::find(bytes.begin(), bytes.end(), merged);
    int id = static_cast<int>(existing - bytes.begin());
    if (existing == bytes.end()) {
      bytes.push_back(merged);
      ++made;
    }
    for (auto& word : words) {
      std::vector<int> out;
      for (size_t i = 0; i < word.first.size();) {
        if (i + 1 < word.first.size() && word.first[i] == best.first && word.first[i + 1] == best.second) {
          out.push_back(id);
          i += 2;
        } else {
          out.push_back(word.first[i++]);
        }
      }
      word.first = out;
    }
  }
  return merges;
}

std::string merges_text(const Merges& merges) {
  std::string out;
  for (const auto& [left, right] : merges) out += fmt::format("[{}|{}] ", left, right);
  return out;
}

}  // namespace

TEST_CASE("bpe training: CS336's low/lower/widest/newest corpus gives the merges worked out by hand") {
  // GPT-2's pre-tokens: "low" once, " low" 4 times, " lower" 2, " widest" 3,
  // " newest" 6 (a space starts every word but the first). By hand, greatest
  // (count, left, right) first:
  //   s t 9 (ties with e s 9: "s" > "e"), e st 9, o w 7 (ties l o: "o" > "l"),
  //   l ow 7, then five pairs of 6: w est ("w" is the greatest left), n e,
  //   ne west, " "+newest (> " "+low), " "+low; then four of 3: w i, wi d,
  //   wid est, " "+widest; then two of 2: e r ("e" > " low"), " low"+er.
  // Every pre-token is then one token: 15 merges, and no pair is left.
  TempDir dir("bpe");
  write_bytes(dir / "c.txt", "low low low low low lower lower widest widest widest newest newest newest newest newest newest");
  const Merges expected = {{"s", "t"},   {"e", "st"},   {"o", "w"},   {"l", "ow"},    {"w", "est"},
                           {"n", "e"},   {"ne", "west"}, {" ", "newest"}, {" ", "low"}, {"w", "i"},
                           {"wi", "d"},  {"wid", "est"}, {" ", "widest"}, {"e", "r"},  {" low", "er"}};
  BpeResult all = train({dir / "c.txt"}, 1000, 1);
  CHECK(merges_text(all.merges) == merges_text(expected));
  CHECK(all.ran_out);
  CHECK(all.vocab_size == 256 + 15);
  CHECK(all.pretokens == 16);
  CHECK(all.unique_pretokens == 5);
  BpeResult four = train({dir / "c.txt"}, 260, 2);
  CHECK(merges_text(four.merges) == merges_text(Merges(expected.begin(), expected.begin() + 4)));
  CHECK_FALSE(four.ran_out);
  CHECK(four.vocab_size == 260);
}

TEST_CASE("bpe training: README.md in three files gives the reference's merges with 1 and 4 threads") {
  std::string readme = read_bytes("README.md");
  REQUIRE(readme.size() > 3000);
  TempDir dir("bpe");
  std::vector<std::string> files, documents;
  for (int i = 0; i < 3; ++i) {
    documents.push_back(readme.substr(readme.size() * i / 3, readme.size() / 3 + 1));
    files.push_back(dir / fmt::format("part{}.md", i));
    write_bytes(files.back(), documents.back());
  }
  const int64_t merges = 400;
  std::string expected = merges_text(reference_bpe(documents, "", merges));
  BpeResult one = train(files, 256 + merges, 1), four = train(files, 256 + merges, 4);
  CHECK(one.merges.size() == merges);
  CHECK(merges_text(one.merges) == expected);
  CHECK(merges_text(four.merges) == expected);
  CHECK(one.unique_pretokens == four.unique_pretokens);
  CHECK(train(files, 256 + merges, 4).merges == four.merges);  // the same run twice
}

TEST_CASE("bpe training: a 1 MB file counted in chunks cut at safe cuts gives the merges of the whole text") {
  // docs/*.md three times: over 256 KiB per chunk with 4 threads, so the
  // file is cut at tokenizer::safe_cuts and each chunk counted apart.
  std::string text;
  std::vector<std::string> docs;
  for (const auto& entry : std::filesystem::directory_iterator("docs"))
    if (entry.path().extension() == ".md") docs.push_back(entry.path().string());
  std::sort(docs.begin(), docs.end());
  for (int copy = 0; copy < 3; ++copy)
    for (const std::string& doc : docs) text += read_bytes(doc);
  REQUIRE(text.size() > (size_t{1} << 20));
  REQUIRE(napkin::tokenizer::safe_cuts(text, 4).size() == 3);
  TempDir dir("bpe");
  write_bytes(dir / "docs.md", text);
  const int64_t merges = 150;
  std::string expected = merges_text(reference_bpe({text}, "", merges));
  CHECK(merges_text(train({dir / "docs.md"}, 256 + merges, 4).merges) == expected);
  CHECK(merges_text(train({dir / "docs.md"}, 256 + merges, 3).merges) == expected);
}

TEST_CASE("bpe training: special tokens split the text, are never merged, and chunks are not cut inside one") {
  TempDir dir("bpe");
  std::string docs;
  for (int i = 0; i < 20; ++i) docs += "ab<|endoftext|>cd<|endoftext|>";
  write_bytes(dir / "docs.txt", docs);
  // Pre-tokens "ab" and "cd", 20 each: ("c", "d") wins the tie, then ("a",
  // "b"); nothing of "<|endoftext|>" is merged, and "bc" never forms.
  BpeResult r = train({dir / "docs.txt"}, 1000, 2, {"<|endoftext|>"});
  CHECK(merges_text(r.merges) == merges_text({{"c", "d"}, {"a", "b"}}));
  CHECK(r.ran_out);
  CHECK(r.unique_pretokens == 2);
  CHECK(r.vocab_size == 256 + 2 + 1);
  // Without the special token its bytes are text like any other.
  CHECK(train({dir / "docs.txt"}, 1000, 2).merges.size() > 2);

  // "x\ny" holds a safe cut (after "x\n", before "y"), and every newline of
  // this 700 KB file is in one: cutting there would count " x", "\n" and
  // "ydolor" instead of dropping the special token.
  std::string lines;
  for (int i = 0; i < 50000; ++i) lines += (i % 3 == 0 ? "lorem ipsum x\ny" : "dolor sit x\ny");
  write_bytes(dir / "lines.txt", lines);
  REQUIRE_FALSE(napkin::tokenizer::safe_cuts(lines, 4).empty());
  std::string expected = merges_text(reference_bpe({lines}, "x\ny", 30));
  CHECK(merges_text(train({dir / "lines.txt"}, 256 + 1 + 30, 4, {"x\ny"}).merges) == expected);
}

TEST_CASE("bpe training: at the same position the longer special token is the one removed") {
  TempDir dir("bpe");
  write_bytes(dir / "t.txt", "qq<s>xrr<s>qq");
  // "<s>x" (not "<s>" then "xrr"): the pre-tokens are "qq", "rr", "qq".
  BpeResult r = train({dir / "t.txt"}, 1000, 1, {"<s>", "<s>x"});
  CHECK(merges_text(r.merges) == merges_text({{"q", "q"}, {"r", "r"}}));
  CHECK(r.unique_pretokens == 2);
}

TEST_CASE("bpe training: an empty corpus, a corpus of special tokens only, a vocab below 256 + specials, bad special tokens, a missing file") {
  TempDir dir("bpe");
  write_bytes(dir / "empty.txt", "");
  write_bytes(dir / "eot.txt", "<|endoftext|><|endoftext|>");
  write_bytes(dir / "text.txt", "some text");
  CHECK(error_of([&] { train({dir / "empty.txt"}, 1000, 1); }) == dir / "empty.txt" + " has no text to train on");
  CHECK(error_of([&] { train({dir / "empty.txt", dir / "eot.txt"}, 1000, 1, {"<|endoftext|>"}); }) ==
        "the corpus (2 files) has no text to train on besides special tokens");
  CHECK(error_of([&] { train({dir / "text.txt"}, 256, 1, {"<|endoftext|>"}); }) ==
        "--vocab 256 is too small: the 256 byte tokens and 1 special token take 257; ask for more to have merges");
  CHECK(train({dir / "text.txt"}, 257, 1, {"<|endoftext|>"}).merges.empty());
  CHECK(error_of([&] { train({dir / "text.txt"}, 1000, 1, {""}); }) == "--special: a special token cannot be empty");
  CHECK(error_of([&] { train({dir / "text.txt"}, 1000, 1, {"<s>", "<s>"}); }) == "--special: \"<s>\" is given twice");
  CHECK(error_of([&] { train({dir / "text.txt"}, 1000, 1, {"<\xff>"}); }).find("is not UTF-8 text") != std::string::npos);
  CHECK(error_of([&] { train({dir / "text.txt"}, 1000, 1, {"a"}); }) ==
        "--special \"a\": a special token of one byte would replace that byte's token; use a longer text such as "
        "\"<|endoftext|>\"");
  CHECK(error_of([&] { train({dir / "missing.txt"}, 1000, 1); }).find("missing.txt: cannot open") != std::string::npos);
}

TEST_CASE("bpe training: any bytes, not only UTF-8, and ties compare bytes as unsigned") {
  TempDir dir("bpe");
  // "\xff\xff" is one pre-token (two bytes that start no UTF-8 character,
  // "other" characters) and " aa" another: three pairs of count 1, and the
  // greatest left byte is 0xff (a signed comparison would put it below ' ').
  write_bytes(dir / "bytes.bin", "\xff\xff aa");
  CHECK(merges_text(train({dir / "bytes.bin"}, 1000, 1).merges) ==
        merges_text({{"\xff", "\xff"}, {"a", "a"}, {" ", "aa"}}));

  // Every byte value, in a pseudo-random order, against the reference.
  std::string noise;
  uint32_t x = 12345;
  for (int i = 0; i < 60000; ++i) {
    x = x * 1103515245u + 12345u;
    noise += static_cast<char>(i % 7 == 0 ? ' ' : static_cast<char>(x >> 24) % 8 + ((x >> 16) & 1 ? 0x41 : 0xe0));
  }
  for (int b = 0; b < 256; ++b) noise += static_cast<char>(b);
  write_bytes(dir / "noise.bin", noise);
  std::string expected = merges_text(reference_bpe({noise}, "", 200));
  CHECK(merges_text(train({dir / "noise.bin"}, 256 + 200, 1).merges) == expected);
  CHECK(merges_text(train({dir / "noise.bin"}, 256 + 200, 3).merges) == expected);
}
