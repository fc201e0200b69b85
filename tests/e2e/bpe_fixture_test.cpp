// Byte-level BPE against Hugging Face tokenizers and CS336's training, offline: tests/e2e/data/bpe holds what
// bench/tokenizer.py --write-fixtures saved (SOURCE.txt says from where): two slices of public-domain text
// (kjv.txt, web.txt: ASCII, and UTF-8 with curly quotes), the tokenizer.json that tokenizers' BpeTrainer trained
// on them (vocab 1000, <|endoftext|>) with the ids tokenizers encodes them to (hf_ids.u16), the merges
// bench/bpe_reference.py (CS336's algorithm, plain Python) trains on them at vocab 600, and the ids tokenizers
// encodes them to with those merges in napkin's id layout (reference_ids.u16). Each ids file holds
// <|endoftext|> before each document, as `napkin data encode --eot kjv.txt web.txt` writes. napkin's training
// must give the reference's merges, with any thread count, and napkin's encoding tokenizers' ids, id for id.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "runtime/tokenizer.h"
#include "support/test_io.h"

namespace {

using napkin::testing::read_bytes;
using napkin::testing::TempDir;
namespace tok = napkin::tokenizer;

const std::string kFixture = "tests/e2e/data/bpe";
const std::string kDocuments = kFixture + "/kjv.txt " + kFixture + "/web.txt";
constexpr int kReferenceVocab = 600;

std::string fixture_path(const std::string& name) {
  return std::string(NAPKIN_SOURCE_DIR) + "/" + kFixture + "/" + name;
}
std::string fixture(const std::string& name) { return read_bytes(fixture_path(name)); }

void run_napkin(const std::string& args) {
  const std::string command = fmt::format("{} {}", NAPKIN_BINARY, args);
  napkin::testing::CommandResult r = napkin::testing::run_in_source_tree(command);
  INFO(command);
  INFO(r.out);
  REQUIRE(r.status == 0);
}

std::vector<uint16_t> u16s(const std::string& bytes) {
  std::vector<uint16_t> ids(bytes.size() / 2);
  std::memcpy(ids.data(), bytes.data(), ids.size() * 2);
  return ids;
}

// "" when the token files are equal, else where they first differ.
std::string difference(const std::string& got_bytes, const std::string& want_bytes) {
  const std::vector<uint16_t> got = u16s(got_bytes), want = u16s(want_bytes);
  for (size_t i = 0; i < got.size() && i < want.size(); ++i)
    if (got[i] != want[i]) return fmt::format("token {}: napkin {}, expected {}", i, got[i], want[i]);
  if (got_bytes.size() != want_bytes.size())
    return fmt::format("napkin wrote {} bytes, expected {}", got_bytes.size(), want_bytes.size());
  return "";
}

// reference_merges.txt: "LEFT RIGHT" a line, spelled in GPT-2's byte-to-character alphabet.
std::vector<std::pair<std::string, std::string>> reference_merges() {
  std::map<std::string, char> byte_of;
  for (int b = 0; b < 256; ++b) byte_of[tok::byte_char(static_cast<uint8_t>(b))] = static_cast<char>(b);
  auto bytes = [&](const std::string& spelled) {
    std::string out;
    for (size_t i = 0; i < spelled.size();) {
      const size_t n = (spelled[i] & 0x80) == 0 ? 1 : 2;  // the alphabet is U+0021..U+0143
      out += byte_of.at(spelled.substr(i, n));
      i += n;
    }
    return out;
  };
  std::vector<std::pair<std::string, std::string>> merges;
  std::istringstream lines(fixture("reference_merges.txt"));
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.find(' ');
    merges.emplace_back(bytes(line.substr(0, space)), bytes(line.substr(space + 1)));
  }
  return merges;
}

}  // namespace

TEST_CASE("bpe fixture: napkin data bpe trains bench/bpe_reference.py's merges (CS336's rule), with 1 thread or 2") {
  TempDir dir("bpe-fixture-train");
  for (int threads : {1, 2})
    run_napkin(fmt::format("data bpe {} --vocab {} --special '<|endoftext|>' --threads {} -o {}", kDocuments,
                       kReferenceVocab, threads, dir / fmt::format("t{}.json", threads)));
  CHECK(read_bytes(dir / "t1.json") == read_bytes(dir / "t2.json"));

  const tok::Tokenizer trained = tok::Tokenizer::load(dir / "t2.json");
  const auto want = reference_merges();
  REQUIRE(want.size() == kReferenceVocab - 257);
  REQUIRE(trained.merges().size() == want.size());
  for (size_t r = 0; r < want.size(); ++r) {
    const auto& [left, right] = trained.merges()[r];
    INFO("merge rank ", r);
    REQUIRE(trained.token_bytes(left) == want[r].first);
    REQUIRE(trained.token_bytes(right) == want[r].second);
  }
  REQUIRE(trained.specials().size() == 1);
  CHECK(trained.specials()[0].text == "<|endoftext|>");
  CHECK(trained.specials()[0].id == trained.vocab_size() - 1);
}

TEST_CASE("bpe fixture: napkin data encode --tokenizer gives tokenizers' ids, with its tokenizer.json and napkin's") {
  TempDir dir("bpe-fixture-encode");
  run_napkin(fmt::format("data encode {} --tokenizer {}/hf_tokenizer.json --eot -o {}", kDocuments, kFixture,
                     dir / "hf.u16"));
  CHECK(difference(read_bytes(dir / "hf.u16"), fixture("hf_ids.u16")) == "");

  run_napkin(fmt::format("data bpe {} --vocab {} --special '<|endoftext|>' -o {}", kDocuments, kReferenceVocab,
                     dir / "napkin.json"));
  run_napkin(fmt::format("data encode {} --tokenizer {} --eot -o {}", kDocuments, dir / "napkin.json",
                     dir / "napkin.u16"));
  CHECK(difference(read_bytes(dir / "napkin.u16"), fixture("reference_ids.u16")) == "");
}

TEST_CASE("bpe fixture: a tokenizer.json of Llama 3's layout (a Split by its pattern) encodes to tokenizers' ids") {
  TempDir dir("bpe-fixture-llama3");
  run_napkin(fmt::format("data encode {} --tokenizer {}/llama3_tokenizer.json --eot -o {}", kDocuments, kFixture,
                         dir / "llama3.u16"));
  CHECK(difference(read_bytes(dir / "llama3.u16"), fixture("llama3_ids.u16")) == "");
  // Not GPT-2's ids: the pattern matters on this text.
  CHECK(read_bytes(dir / "llama3.u16") != fixture("hf_ids.u16"));
}

TEST_CASE("bpe fixture: napkin decodes tokenizers' ids back to the documents, byte for byte") {
  const tok::Tokenizer hf = tok::Tokenizer::load(fixture_path("hf_tokenizer.json"));
  const int32_t eot = hf.special_id("<|endoftext|>");
  REQUIRE(eot >= 0);
  const std::vector<uint16_t> ids = u16s(fixture("hf_ids.u16"));
  REQUIRE((!ids.empty() && ids[0] == eot));
  std::vector<std::vector<int32_t>> documents;
  for (uint16_t id : ids) {
    if (id == eot) documents.emplace_back();
    else documents.back().push_back(id);
  }
  REQUIRE(documents.size() == 2);
  CHECK(hf.decode(documents[0]) == fixture("kjv.txt"));
  CHECK(hf.decode(documents[1]) == fixture("web.txt"));
}
