// napkin data encode with a tokenizer.json: the token file it writes, read
// block by block on several threads, must hold exactly the ids of
// tokenizer::Encoder::encode of each input file whole (the reference,
// computed here in one piece), whatever the block size and thread count; its
// llm.c header and u32 ids must read back through the trainer's Dataset; and
// every refusal leaves nothing behind.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "runtime/dataset.h"
#include "runtime/tokenizer.h"
#include "support/test_io.h"

namespace fs = std::filesystem;
namespace tk = napkin::tokenizer;
namespace rt = napkin::runtime;

namespace {

using napkin::testing::read_bytes;
using napkin::testing::TempDir;
using napkin::testing::write_bytes;
using Run = napkin::testing::CommandResult;
Run sh(const std::string& command) { return napkin::testing::run_in_source_tree(command); }

// A small tokenizer: a few English merges and three special tokens, one of
// which ("=\n=") spans a safe cut of the pre-tokenization, so a block cut
// there would split it.
const std::vector<std::pair<std::string, std::string>> kMerges = {
    {"t", "h"}, {"th", "e"}, {" ", "the"}, {"a", "n"}, {"an", "d"}, {" ", "and"}, {"\n", "\n"},
    {"e", "r"}, {"i", "n"}, {"in", "g"}, {" ", "c"}, {" c", "a"}, {" ca", "t"}, {"o", "g"}};
const std::vector<std::string> kSpecials = {"<|endoftext|>", "<|pad|>", "=\n="};

tk::Tokenizer write_tokenizer(const std::string& path, const std::vector<std::string>& specials = kSpecials) {
  tk::Tokenizer t = tk::Tokenizer::from_merges(kMerges, specials);
  write_bytes(path, t.to_json());
  return t;
}

// Pseudo-random text: words, numbers, contractions, other scripts, bytes
// that are not UTF-8, blank lines, trailing spaces; with `specials`, special
// tokens (whole, adjacent, and "<|endof" cut short); with `newlines` false,
// no newline at all, so no safe cut.
std::string random_text(uint32_t seed, size_t bytes, bool specials, bool newlines) {
  static const std::vector<std::string> kWords = {
      "the", "cat", "and", "dog", "ran", "in", "thing", "over", "The", "It's", "we'll", "café", "日本語", "2024",
      "x=1;", "  ", "\t", "!!", "\xff\xfe", "naïve", "Ünïcödé", "...", "'s", "42nd", "—", "🙂"};
  static const std::vector<std::string> kBreaks = {"\n", "\n\n", " \n", "\n  ", ".\n", "\r\n"};
  static const std::vector<std::string> kSpecialUses = {"<|endoftext|>", "<|pad|>", "=\n=", "<|endoftext|><|pad|>",
                                                        "<|endof", "a=\n=b", "<|endoftext|>\n"};
  std::mt19937 rng(seed);
  std::string text;
  while (text.size() < bytes) {
    const uint32_t r = rng() % 100;
    if (specials && r < 4) text += kSpecialUses[rng() % kSpecialUses.size()];
    else if (newlines && r < 16) text += kBreaks[rng() % kBreaks.size()];
    else text += (rng() % 3 == 0 ? "" : " ") + kWords[rng() % kWords.size()];
  }
  return text;
}

// The ids napkin must write: each document encoded whole, --eot's id before each.
std::vector<int32_t> reference(const tk::Tokenizer& t, const std::vector<std::string>& docs, int32_t eot = -1) {
  tk::Encoder e(t);
  std::vector<int32_t> ids;
  for (const std::string& d : docs) {
    if (eot >= 0) ids.push_back(eot);
    e.encode(d, ids);
  }
  return ids;
}

// A token file's ids (`width` bytes each, little-endian) after `skip` bytes.
std::vector<int32_t> read_ids(const std::string& path, size_t width, size_t skip = 0) {
  const std::string bytes = read_bytes(path);
  REQUIRE(bytes.size() >= skip);
  REQUIRE((bytes.size() - skip) % width == 0);
  std::vector<int32_t> ids((bytes.size() - skip) / width);
  for (size_t i = 0; i < ids.size(); ++i) {
    uint32_t v = 0;
    std::memcpy(&v, bytes.data() + skip + i * width, width);
    ids[i] = static_cast<int32_t>(v);
  }
  return ids;
}

std::string no_temp_files(const std::string& dir) {
  std::string left;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().find(".tmp") != std::string::npos) left += e.path().string() + " ";
  return left;
}

}  // namespace

TEST_CASE("data encode: the token file is Encoder::encode of each file whole, for any --threads and block size") {
  TempDir tmp("encode-equal");
  const std::string json = tmp / "tokenizer.json";
  const tk::Tokenizer t = write_tokenizer(json);
  // Safe cuts and special tokens; special tokens but no line breaks between
  // words (cuts mostly at special tokens' starts); neither (a file without
  // any cut is held whole); empty; safe cuts only.
  const std::vector<std::string> docs = {random_text(1, 30000, true, true), random_text(2, 3000, true, false),
                                         random_text(3, 2000, false, false), "", random_text(4, 5000, false, true)};
  std::string inputs;
  for (size_t i = 0; i < docs.size(); ++i) {
    write_bytes(tmp / fmt::format("d{}.txt", i), docs[i]);
    inputs += " " + tmp / fmt::format("d{}.txt", i);
  }
  const std::vector<int32_t> want = reference(t, docs);
  REQUIRE(want.size() > 10000);
  for (const char* block : {"9", "300", "100000"})
    for (const char* threads : {"1", "3"}) {
      CAPTURE(block);
      CAPTURE(threads);
      const std::string out = tmp / "out.u16";
      Run r = sh(fmt::format("{} data encode{} -o {} --tokenizer {} --threads {} --block-bytes {}", NAPKIN_BINARY, inputs,
                             out, json, threads, block));
      INFO(r.out);
      REQUIRE(r.status == 0);
      CHECK(r.out.find(fmt::format("{} u16 tokens of 5 files", rt::with_commas(static_cast<int64_t>(want.size())))) !=
            std::string::npos);
      CHECK(r.out.find(fmt::format("on {} thread", threads)) != std::string::npos);
      CHECK(read_ids(out, 2) == want);
    }
  // Without --tokenizer: byte-level tokens, one per byte, the same way.
  for (const char* block : {"9", "100000"}) {
    Run r = sh(fmt::format("{} data encode{} -o {} --threads 3 --block-bytes {}", NAPKIN_BINARY, inputs, tmp / "b.u16",
                           block));
    INFO(r.out);
    REQUIRE(r.status == 0);
    std::vector<int32_t> bytes;
    for (const std::string& d : docs)
      for (char c : d) bytes.push_back(static_cast<unsigned char>(c));
    CHECK(read_ids(tmp / "b.u16", 2) == bytes);
    CHECK(r.out.find("byte-level u16 tokens") != std::string::npos);
  }
  CHECK(no_temp_files(tmp.path) == "");
}

TEST_CASE("data encode: --llmc writes llm.c's header (u16 and u32), which the trainer's Dataset reads back") {
  TempDir tmp("encode-llmc");
  const std::string json = tmp / "tokenizer.json", text = tmp / "t.txt";
  const tk::Tokenizer t = write_tokenizer(json);
  const std::string doc = random_text(5, 4000, true, true);
  write_bytes(text, doc);
  const std::vector<int32_t> want = reference(t, {doc});
  for (const char* dtype : {"u16", "u32"}) {
    CAPTURE(dtype);
    const std::string out = tmp / fmt::format("t.{}.bin", dtype);
    Run r = sh(fmt::format("{} data encode {} -o {} --tokenizer {} --llmc --dtype {} --threads 2 --block-bytes 500",
                           NAPKIN_BINARY, text, out, json, dtype));
    INFO(r.out);
    REQUIRE(r.status == 0);
    const bool u32 = std::string(dtype) == "u32";
    const std::vector<int32_t> header = read_ids(out, 4);  // the first 256 are the header
    REQUIRE(header.size() > 256);
    CHECK(header[0] == (u32 ? 20240801 : 20240520));
    CHECK(header[1] == (u32 ? 7 : 1));
    CHECK(header[2] == static_cast<int32_t>(want.size()));
    for (size_t i = 3; i < 256; ++i) CHECK(header[i] == 0);
    CHECK(read_ids(out, u32 ? 4 : 2, 1024) == want);

    // The trainer's reader: windows of 4 ids and their next ids, in order.
    constexpr int64_t kSeq = 4;
    std::vector<int32_t> x(kSeq), y(kSeq);
    rt::DataSpec spec;
    spec.path = out;
    spec.order = rt::DataOrder::Sequential;
    spec.vocab_bound = t.vocab_size();
    auto data = rt::Dataset::open(spec, {{"x", rt::DType::I32, {1, kSeq}, reinterpret_cast<char*>(x.data())},
                                         {"y", rt::DType::I32, {1, kSeq}, reinterpret_cast<char*>(y.data())}});
    CHECK(data->describe().find(rt::with_commas(static_cast<int64_t>(want.size())) + " llm.c .bin") != std::string::npos);
    for (int64_t step : {0, 7, 31}) {
      data->fill_train(step);
      for (int64_t i = 0; i < kSeq; ++i) {
        CHECK(x[size_t(i)] == want[size_t(step * kSeq + i)]);
        CHECK(y[size_t(i)] == want[size_t(step * kSeq + i + 1)]);
      }
    }
  }
}

TEST_CASE("data encode: a vocabulary over 65,536 writes u32 ids by default, which round-trip, and --dtype u16 is refused") {
  TempDir tmp("encode-u32");
  // 65,300 merges of two bytes each, the text's common pairs last (ids over
  // 65,535): a vocabulary of 65,556 + 1 special.
  const std::vector<std::pair<std::string, std::string>> last = {
      {"t", "h"}, {"h", "e"}, {"c", "a"}, {"a", "t"}, {"a", "n"}, {"n", "d"}, {"d", "o"}, {"o", "g"}};
  std::vector<std::pair<std::string, std::string>> merges;
  for (int a = 0; a < 256; ++a)
    for (int b = 0; b < 256 && merges.size() < 65300 - last.size(); ++b) {
      std::pair<std::string, std::string> m(std::string(1, char(a)), std::string(1, char(b)));
      if (std::find(last.begin(), last.end(), m) == last.end()) merges.push_back(m);
    }
  merges.insert(merges.end(), last.begin(), last.end());
  const tk::Tokenizer t = tk::Tokenizer::from_merges(merges, {"<|endoftext|>"});
  REQUIRE(t.vocab_size() > 65536);
  const std::string json = tmp / "big.json", text = tmp / "t.txt", out = tmp / "t.u32";
  write_bytes(json, t.to_json());
  const std::string doc = random_text(6, 3000, true, true);
  write_bytes(text, doc);
  const std::vector<int32_t> want = reference(t, {doc}, t.special_id("<|endoftext|>"));
  int32_t largest = 0;
  for (int32_t id : want) largest = std::max(largest, id);
  REQUIRE(largest > 65535);

  Run r = sh(fmt::format("{} data encode {} -o {} --tokenizer {} --eot --block-bytes 100", NAPKIN_BINARY, text, out, json));
  INFO(r.out);
  REQUIRE(r.status == 0);
  CHECK(r.out.find("u32 tokens") != std::string::npos);
  CHECK(read_ids(out, 4) == want);
  // The trainer reads a raw u32 file as such.
  std::vector<int32_t> x(8), y(8);
  rt::DataSpec spec;
  spec.path = out;
  spec.token_dtype = rt::DType::U32;
  spec.order = rt::DataOrder::Sequential;
  auto data = rt::Dataset::open(spec, {{"x", rt::DType::I32, {1, 8}, reinterpret_cast<char*>(x.data())},
                                       {"y", rt::DType::I32, {1, 8}, reinterpret_cast<char*>(y.data())}});
  data->fill_train(2);
  CHECK(x == std::vector<int32_t>(want.begin() + 16, want.begin() + 24));

  r = sh(fmt::format("{} data encode {} -o {} --tokenizer {} --dtype u16", NAPKIN_BINARY, text, tmp / "t.u16", json));
  CHECK(r.status == 1);
  CHECK(r.out.find("--dtype u16: " + json + " has 65,557 ids, more than the 65,536 a u16 holds; write --dtype u32") !=
        std::string::npos);
  CHECK(!fs::exists(tmp / "t.u16"));
}

TEST_CASE("data encode: --eot puts <|endoftext|> or the only special token before each document, else it is an error") {
  TempDir tmp("encode-eot");
  const std::string a = tmp / "a.txt", b = tmp / "b.txt", out = tmp / "out.u16";
  write_bytes(a, "the cat\nand the dog");
  write_bytes(b, "");
  const std::vector<std::string> docs = {"the cat\nand the dog", "", "the cat\nand the dog"};

  const tk::Tokenizer t = write_tokenizer(tmp / "t.json");
  const int32_t eot = t.special_id("<|endoftext|>");
  Run r = sh(fmt::format("{} data encode {} {} {} -o {} --tokenizer {} --eot --block-bytes 4 --threads 2", NAPKIN_BINARY,
                         a, b, a, out, tmp / "t.json"));
  INFO(r.out);
  REQUIRE(r.status == 0);
  const std::vector<int32_t> ids = read_ids(out, 2);
  CHECK(ids == reference(t, docs, eot));
  // Before each document, the empty one too; nowhere else.
  CHECK(ids.front() == eot);
  CHECK(std::count(ids.begin(), ids.end(), eot) == 3);

  const tk::Tokenizer one = write_tokenizer(tmp / "one.json", {"<|doc|>"});
  r = sh(fmt::format("{} data encode {} -o {} --tokenizer {} --eot", NAPKIN_BINARY, a, out, tmp / "one.json"));
  REQUIRE(r.status == 0);
  CHECK(read_ids(out, 2) == reference(one, {docs[0]}, one.special_id("<|doc|>")));

  write_tokenizer(tmp / "two.json", {"<|a|>", "<|b|>"});
  r = sh(fmt::format("{} data encode {} -o {} --tokenizer {} --eot", NAPKIN_BINARY, a, tmp / "x.u16", tmp / "two.json"));
  CHECK(r.status == 1);
  CHECK(r.out.find(tmp / "two.json" + " has no <|endoftext|> special token and 2 others (<|a|>, <|b|>)") !=
        std::string::npos);
  write_tokenizer(tmp / "none.json", {});
  r = sh(fmt::format("{} data encode {} -o {} --tokenizer {} --eot", NAPKIN_BINARY, a, tmp / "x.u16", tmp / "none.json"));
  CHECK(r.status == 1);
  CHECK(r.out.find("(it has no special tokens)") != std::string::npos);
  r = sh(fmt::format("{} data encode {} -o {} --eot", NAPKIN_BINARY, a, tmp / "x.u16"));
  CHECK(r.status == 1);
  CHECK(r.out.find("byte-level tokens have none") != std::string::npos);
  CHECK(!fs::exists(tmp / "x.u16"));
  CHECK(no_temp_files(tmp.path) == "");
}

TEST_CASE("data encode: a missing or non-byte-level tokenizer, an unreadable input, an output that is an input: refused, nothing written") {
  TempDir tmp("encode-errors");
  const std::string text = tmp / "t.txt", json = tmp / "t.json", out = tmp / "out.u16";
  write_bytes(text, "the cat");
  write_tokenizer(json);
  write_bytes(out, "old");  // a refused run leaves the old file as it was

  Run r = sh(fmt::format("{} data encode {} -o {} --tokenizer {}", NAPKIN_BINARY, text, out, tmp / "missing.json"));
  CHECK(r.status == 1);
  CHECK(r.out.find(tmp / "missing.json" + ": cannot read") != std::string::npos);

  write_bytes(tmp / "wp.json", R"({"model": {"type": "WordPiece", "vocab": {"[UNK]": 0}, "unk_token": "[UNK]"}})");
  r = sh(fmt::format("{} data encode {} -o {} --tokenizer {}", NAPKIN_BINARY, text, out, tmp / "wp.json"));
  CHECK(r.status == 1);
  CHECK(r.out.find("WordPiece") != std::string::npos);

  r = sh(fmt::format("{} data encode {} {} -o {} --tokenizer {}", NAPKIN_BINARY, text, tmp / "gone.txt", out, json));
  CHECK(r.status == 1);
  CHECK(r.out.find(tmp / "gone.txt" + ": cannot read") != std::string::npos);

  for (const std::string& input : {text, json}) {
    r = sh(fmt::format("{} data encode {} -o {} --tokenizer {}", NAPKIN_BINARY, text, input, json));
    CHECK(r.status == 1);
    CHECK(r.out.find("-o " + input + ": is also an input") != std::string::npos);
  }
  r = sh(fmt::format("{} data encode {} -o {} --tokenizer {} --dtype u8", NAPKIN_BINARY, text, out, json));
  CHECK(r.status != 0);
  CHECK(read_bytes(out) == "old");
  CHECK(read_bytes(text) == "the cat");
  CHECK(no_temp_files(tmp.path) == "");
}

TEST_CASE("data decode: a token file decodes to the text encoded (u16, u32, llm.c's header), by the tokenizer or bytes") {
  TempDir tmp("decode");
  const std::string json = tmp / "tokenizer.json";
  write_tokenizer(json);
  const std::vector<std::string> docs = {random_text(5, 4000, true, true), random_text(6, 3000, true, false)};
  write_bytes(tmp / "a.txt", docs[0]);
  write_bytes(tmp / "b.txt", docs[1]);
  const std::string inputs = tmp / "a.txt" + " " + tmp / "b.txt";
  for (const char* flags : {"--dtype u16", "--dtype u32", "--llmc", "--dtype u32 --llmc"}) {
    CAPTURE(flags);
    Run r = sh(fmt::format("{} data encode {} --tokenizer {} --eot {} -o {}", NAPKIN_BINARY, inputs, json, flags,
                           tmp / "t.bin"));
    REQUIRE(r.status == 0);
    // A raw u32 file says nothing of its width: --dtype tells it; llm.c's header tells it itself.
    const std::string dtype = std::string(flags) == "--dtype u32" ? " --dtype u32" : "";
    r = sh(fmt::format("{} data decode {} --tokenizer {}{} > {}", NAPKIN_BINARY, tmp / "t.bin", json, dtype,
                       tmp / "out.txt"));
    INFO(r.out);
    REQUIRE(r.status == 0);
    CHECK(read_bytes(tmp / "out.txt") == "<|endoftext|>" + docs[0] + "<|endoftext|>" + docs[1]);
  }
  // A slice: --first and --count ids.
  Run r = sh(fmt::format("{} data encode {} -o {}", NAPKIN_BINARY, tmp / "a.txt", tmp / "bytes.u16"));
  REQUIRE(r.status == 0);
  r = sh(fmt::format("{} data decode {} --first 10 --count 25", NAPKIN_BINARY, tmp / "bytes.u16"));
  CHECK(r.status == 0);
  CHECK(r.out == docs[0].substr(10, 25));
  // Ids past the vocabulary: an error with the position; a file that is not whole ids: an error.
  r = sh(fmt::format("{} data encode {} --tokenizer {} -o {}", NAPKIN_BINARY, tmp / "a.txt", json, tmp / "bpe.u16"));
  REQUIRE(r.status == 0);
  r = sh(fmt::format("{} data decode {}", NAPKIN_BINARY, tmp / "bpe.u16"));
  CHECK(r.status == 1);
  CHECK(r.out.find("is not in the byte vocabulary [0, 256): give the --tokenizer the file was encoded with") !=
        std::string::npos);
  write_bytes(tmp / "odd.u16", "abc");
  r = sh(fmt::format("{} data decode {}", NAPKIN_BINARY, tmp / "odd.u16"));
  CHECK(r.status == 1);
  CHECK(r.out.find("3 bytes is not a whole number of u16 tokens") != std::string::npos);
}
