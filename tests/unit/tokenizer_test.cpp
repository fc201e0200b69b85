// Byte-level BPE: GPT-2's pre-tokenization against the pieces Python's
// `regex` module cuts by the same pattern, the safe cuts parallel encoding
// relies on, tokenizer.json in and out, and encoding against a plain
// reference BPE. (Hugging Face tokenizers' own ids are checked offline by
// tests/e2e/bpe_fixture_test.cpp.)
#include <doctest/doctest.h>

#include <random>
#include <string>
#include <vector>

#include "runtime/pretokenize.h"
#include "runtime/tokenizer.h"
#include "runtime/unicode_classes.h"
#include "support/test_io.h"

namespace napkin {
namespace {

std::vector<std::string> pieces(std::string_view text) {
  std::vector<std::string> out;
  tokenizer::for_each_piece(text, [&](std::string_view p) { out.emplace_back(p); });
  return out;
}

using Pieces = std::vector<std::string>;

TEST_CASE("pretokenize: GPT-2's pattern cuts as Python's regex module does") {
  // Each expected list was printed by regex.findall(GPT-2's pattern, text) (regex 2024).
  CHECK(pieces("Hello world's end") == Pieces{"Hello", " world", "'s", " end"});
  CHECK(pieces("  two  spaces\n\n  x") == Pieces{" ", " two", " ", " spaces", "\n\n ", " x"});
  CHECK(pieces("don't I'LL we've 'sup ''s") ==
        Pieces{"don", "'t", " I", "'", "LL", " we", "'ve", " '", "sup", " ''", "s"});
  CHECK(pieces("x   \n\tword") == Pieces{"x", "   \n", "\t", "word"});
  CHECK(pieces("tail   ") == Pieces{"tail", "   "});
  CHECK(pieces(" ") == Pieces{" "});
  CHECK(pieces("caf\u00e9 123 \u00dcn\u00efc\u00f6d\u00e9 \u00bd \u56db\u4e94\u516d \u0663\u0664 \u2014 ok!!\u00a0nbsp"
               "\u3000ideo") == Pieces{"caf\u00e9", " 123", " \u00dcn\u00efc\u00f6d\u00e9", " \u00bd",
                                      " \u56db\u4e94\u516d", " \u0663\u0664", " \u2014", " ok", "!!", "\u00a0", "nbsp",
                                      "\u3000", "ideo"});
  CHECK(pieces("a\r\n\r\nb") == Pieces{"a", "\r\n\r", "\n", "b"});
  CHECK(pieces("?'s!  'll") == Pieces{"?'", "s", "!", " ", " '", "ll"});
  CHECK(pieces("end.\nNext line\n\n") == Pieces{"end", ".", "\n", "Next", " line", "\n\n"});
  CHECK(pieces("\n\n\nfoo") == Pieces{"\n\n", "\n", "foo"});
}

std::vector<std::string> llama3_pieces(std::string_view text) {
  std::vector<std::string> out;
  tokenizer::for_each_piece(text, [&](std::string_view p) { out.emplace_back(p); }, tokenizer::Pattern::Llama3);
  return out;
}

TEST_CASE("pretokenize: Llama 3's pattern cuts as Python's regex module does") {
  // Each expected list was printed by regex.findall(Llama 3's pattern, text) (regex 2024).
  CHECK(llama3_pieces("Hello world's end") == Pieces{"Hello", " world", "'s", " end"});
  CHECK(llama3_pieces("I'LL DON'T we'Ve") == Pieces{"I", "'LL", " DON", "'T", " we", "'Ve"});
  CHECK(llama3_pieces("  two  spaces\n\n  x") == Pieces{" ", " two", " ", " spaces", "\n\n", " ", " x"});
  CHECK(llama3_pieces("x   \n\tword") == Pieces{"x", "   \n", "\tword"});
  CHECK(llama3_pieces("tail   ") == Pieces{"tail", "   "});
  CHECK(llama3_pieces("(hello) [world]!!\n\nnext") == Pieces{"(hello", ")", " [", "world", "]!!\n\n", "next"});
  CHECK(llama3_pieces("12345 678 9") == Pieces{"123", "45", " ", "678", " ", "9"});
  CHECK(llama3_pieces("a.\n\nb") == Pieces{"a", ".\n\n", "b"});
  CHECK(llama3_pieces("end.\r\nNext") == Pieces{"end", ".\r\n", "Next"});
  CHECK(llama3_pieces("café ½½½½ 四五六 ok!!\u00a0nbsp") ==
        Pieces{"café", " ", "½½½", "½", " 四五六", " ok", "!!", "\u00a0nbsp"});
  CHECK(llama3_pieces(" \n b") == Pieces{" \n", " b"});
  CHECK(llama3_pieces("\tword ,word") == Pieces{"\tword", " ,", "word"});
  CHECK(llama3_pieces("?'s!  'll") == Pieces{"?'", "s", "!", " ", " '", "ll"});
  CHECK(llama3_pieces("a  \n b") == Pieces{"a", "  \n", " b"});
}

TEST_CASE("pretokenize: bytes that are not UTF-8 are one-byte 'other' characters, and every byte is kept") {
  // 0xff and a lone continuation byte 0x80 and a truncated 3-byte sequence.
  const std::string text = "ab\xff\x80 cd \xe2\x82 x";
  CHECK(pieces(text) == Pieces{"ab", "\xff\x80", " cd", " \xe2\x82", " x"});
  char32_t c;
  CHECK(unicode::decode_utf8("\xed\xa0\x80", 0, c) == 1);  // a surrogate is not well-formed
  CHECK(c == unicode::kInvalidByte);
  CHECK(unicode::decode_utf8("\xf0\x9f\x98\x80", 0, c) == 4);
  CHECK(c == 0x1F600);
  CHECK(unicode::decode_utf8("\xc0\xaf", 0, c) == 1);  // overlong '/'
  CHECK(unicode::is_letter(U'\u00e9'));
  CHECK(unicode::is_number(U'\u00bd'));
  CHECK_FALSE(unicode::is_letter(U'\u2014'));
  CHECK(unicode::is_whitespace(U'\u3000'));
}

TEST_CASE("pretokenize: cutting at a safe cut gives the same pieces as the whole text") {
  const std::string text = testing::read_bytes(std::string(NAPKIN_SOURCE_DIR) + "/README.md");
  REQUIRE(text.size() > 2000);
  const Pieces whole = pieces(text);
  const std::vector<size_t> cuts = tokenizer::safe_cuts(text, 16);
  CHECK(cuts.size() == 15);
  Pieces joined;
  size_t from = 0;
  for (size_t k = 0; k <= cuts.size(); ++k) {
    const size_t to = k < cuts.size() ? cuts[k] : text.size();
    CHECK(tokenizer::is_safe_cut(text, to) == (k < cuts.size()));
    for (std::string& p : pieces(std::string_view(text).substr(from, to - from))) joined.push_back(std::move(p));
    from = to;
  }
  CHECK(joined == whole);
  // The same cuts hold for Llama 3's pattern.
  Pieces joined_llama3;
  from = 0;
  for (size_t k = 0; k <= cuts.size(); ++k) {
    const size_t to = k < cuts.size() ? cuts[k] : text.size();
    for (std::string& p : llama3_pieces(std::string_view(text).substr(from, to - from)))
      joined_llama3.push_back(std::move(p));
    from = to;
  }
  CHECK(joined_llama3 == llama3_pieces(text));
  // Before a newline is not a cut: Llama 3's punctuation takes the newlines after it.
  CHECK_FALSE(tokenizer::is_safe_cut("end.\nNext", 4));
  CHECK(llama3_pieces("end.\nNext") == Pieces{"end", ".\n", "Next"});
  // The rule is needed: after a space, cutting changes GPT-2's pieces.
  CHECK_FALSE(tokenizer::is_safe_cut("a  \nb", 3));
  CHECK(pieces("a  \nb") == Pieces{"a", "  ", "\n", "b"});
  CHECK(pieces("a ") == Pieces{"a", " "});
  CHECK(pieces(" \nb") == Pieces{" ", "\n", "b"});
  CHECK_FALSE(tokenizer::is_safe_cut("a b", 2));  // " b" is one piece
  CHECK(tokenizer::is_safe_cut("a b", 1));
  CHECK(tokenizer::safe_cuts("no_space_at_all\nlines\n", 4).empty());
  // A text whose lines all start with spaces (the KJV's verses) has cuts too.
  CHECK(tokenizer::safe_cuts("   1:1 In the beginning\n\n   1:2 And the earth", 4).size() == 3);
}

// Plain BPE: merge ranks applied in order to the whole piece, a rank at a
// time (slow and obviously right; equals lowest-rank-first).
std::vector<int32_t> reference_encode(const tokenizer::Tokenizer& t, std::string_view text) {
  std::vector<int32_t> out;
  tokenizer::for_each_piece(text, [&](std::string_view piece) {
    std::vector<std::string> parts;
    for (char b : piece) parts.emplace_back(1, b);
    for (const auto& [l, r] : t.merges()) {
      for (size_t i = 0; i + 1 < parts.size();) {
        if (parts[i] == t.token_bytes(l) && parts[i + 1] == t.token_bytes(r)) {
          parts[i] += parts[i + 1];
          parts.erase(parts.begin() + static_cast<std::ptrdiff_t>(i) + 1);
        } else {
          ++i;
        }
      }
    }
    for (const std::string& p : parts) {
      for (int32_t id = 0; id < t.vocab_size(); ++id)
        if (t.token_bytes(id) == p) {
          out.push_back(id);
          break;
        }
    }
  });
  return out;
}

tokenizer::Tokenizer small_tokenizer() {
  return tokenizer::Tokenizer::from_merges(
      {{" ", "t"}, {"h", "e"}, {" t", "he"}, {"i", "n"}, {" ", "a"}, {"e", "r"}, {"o", "n"}, {"a", "b"}, {"ab", "c"},
       {"b", "c"}, {"a", "bc"}, {"\xff", "\x80"}, {"a", "a"}},
      {"<|endoftext|>"});
}

TEST_CASE("tokenizer: encoding equals a plain BPE, and decoding gives the text back") {
  const tokenizer::Tokenizer t = small_tokenizer();
  // "abc" is made twice (ab+c, a+bc): the second merge reuses the first's id.
  CHECK(t.vocab_size() == 256 + 12 + 1);
  CHECK(t.special_id("<|endoftext|>") == 268);
  const std::string text = "the theater in on abc aaaa a bc\xff\x80 there, other " + testing::read_bytes(
                               std::string(NAPKIN_SOURCE_DIR) + "/docs/model-language.md").substr(0, 3000);
  tokenizer::Encoder e(t);
  std::vector<int32_t> ids;
  e.encode_ordinary(text, ids);
  CHECK(ids == reference_encode(t, text));
  CHECK(ids.size() < text.size());
  CHECK(t.decode(ids) == text);
  // Twice (the cache answers the second time) gives the same.
  std::vector<int32_t> again;
  e.encode_ordinary(text, again);
  CHECK(again == ids);
}

TEST_CASE("tokenizer: long pieces (merged by a heap, not a scan per merge) encode as a plain BPE") {
  const tokenizer::Tokenizer t = tokenizer::Tokenizer::from_merges(
      {{"=", "="}, {"==", "=="}, {"a", "b"}, {"ab", "ab"}, {"b", "a"}, {"abab", "a"}, {"====", "="}, {"c", "ab"}},
      {});
  std::string text = std::string(5001, '=') + " " + "c";
  for (int i = 0; i < 700; ++i) text += i % 7 == 0 ? "cab" : i % 5 == 0 ? "ba" : "ab";
  text += " x" + std::string(65, '=') + " " + std::string(64, '=');
  tokenizer::Encoder e(t);
  std::vector<int32_t> ids;
  e.encode(text, ids);
  CHECK(ids == reference_encode(t, text));
  CHECK(t.decode(ids) == text);
}

TEST_CASE("tokenizer: a pair merged twice takes its last rank, as tokenizers does") {
  // tokenizers 0.23 encodes "abc" with the merges "a b", "b c", "a b" as [a, bc] (bench-venv, 2026-11-28):
  // its BpeBuilder collects the merges into a map, the later entry overwriting.
  const tokenizer::Tokenizer t = tokenizer::Tokenizer::from_merges({{"a", "b"}, {"b", "c"}, {"a", "b"}}, {});
  CHECK(t.vocab_size() == 258);
  tokenizer::Encoder e(t);
  std::vector<int32_t> ids;
  e.encode("abc", ids);
  CHECK(ids == std::vector<int32_t>{'a', 257});
}

TEST_CASE("tokenizer: special tokens split the text and are never merged") {
  const tokenizer::Tokenizer t = small_tokenizer();
  tokenizer::Encoder e(t);
  std::vector<int32_t> ids;
  e.encode("the<|endoftext|>the <|endoftext|><|endoftext|>", ids);
  const int32_t eot = t.special_id("<|endoftext|>");
  CHECK(std::count(ids.begin(), ids.end(), eot) == 3);
  CHECK(ids.back() == eot);
  CHECK(t.decode(ids) == "the<|endoftext|>the <|endoftext|><|endoftext|>");
  std::vector<int32_t> plain;
  e.encode_ordinary("<|endoftext|>", plain);
  CHECK(std::count(plain.begin(), plain.end(), eot) == 0);
  CHECK(testing::error_of([&] { t.decode({5, 269}); }) == "token id 269 is not in the tokenizer's vocabulary [0, 269)");
}

TEST_CASE("tokenizer: tokenizer.json written and read back encodes the same") {
  testing::TempDir dir("tokenizer");
  const tokenizer::Tokenizer t = small_tokenizer();
  testing::write_bytes(dir / "tokenizer.json", t.to_json());
  const tokenizer::Tokenizer back = tokenizer::Tokenizer::load(dir / "tokenizer.json");
  CHECK(back.vocab_size() == t.vocab_size());
  CHECK(back.merges() == t.merges());
  CHECK(back.special_id("<|endoftext|>") == t.special_id("<|endoftext|>"));
  for (int32_t id = 0; id < t.vocab_size(); ++id) CHECK(back.token_bytes(id) == t.token_bytes(id));
  CHECK(tokenizer::byte_char(' ') == "\u0120");  // 'Ġ'
  CHECK(tokenizer::byte_char('a') == "a");
  CHECK(tokenizer::byte_char(0xad) == "\u0143");
  // Merges written as pairs (tokenizers >= 0.20) read the same as "a b" strings.
  std::string json = testing::read_bytes(dir / "tokenizer.json");
  const size_t at = json.find("\"Ġ t\"");
  REQUIRE(at != std::string::npos);
  json.replace(at, std::string("\"Ġ t\"").size(), "[\"Ġ\", \"t\"]");
  testing::write_bytes(dir / "pairs.json", json);
  CHECK(tokenizer::Tokenizer::load(dir / "pairs.json").merges() == t.merges());
}

TEST_CASE("tokenizer: a Llama 3 tokenizer.json (a Split by its pattern) is read, written and encodes by it") {
  testing::TempDir dir("tokenizer");
  // "(" + "t" joins only where a piece holds both: in Llama 3's "(the", not in GPT-2's "(", "the".
  tokenizer::Tokenizer gpt2 = tokenizer::Tokenizer::from_merges({{"(", "t"}, {"h", "e"}, {"1", "2"}}, {"<|endoftext|>"});
  std::string json = gpt2.to_json();
  // Llama 3's pre-tokenizer layout, as its tokenizer.json has it.
  const std::string byte_level =
      R"({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true})";
  const size_t at = json.find("\"pre_tokenizer\"");
  REQUIRE(at != std::string::npos);
  const size_t end = json.find('}', at) + 1;
  json.replace(at, end - at,
               R"("pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": )"
               R"("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|)"
               R"(\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}, "behavior": "Isolated", "invert": false}, )"
               R"({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}]})");
  testing::write_bytes(dir / "llama3.json", json);
  const tokenizer::Tokenizer t = tokenizer::Tokenizer::load(dir / "llama3.json");
  CHECK(t.pattern() == tokenizer::Pattern::Llama3);
  const std::string text = "(the theater) 12345 THE'S\n\n";
  std::vector<int32_t> ids;
  tokenizer::Encoder(t).encode(text, ids);
  CHECK(t.decode(ids) == text);
  CHECK(std::count(ids.begin(), ids.end(), t.merges()[0].first) == 0);  // "(" was merged
  std::vector<int32_t> pieces_ids;
  for (const std::string& p : llama3_pieces(text)) tokenizer::Encoder(t).encode_ordinary(p, pieces_ids);
  CHECK(ids == pieces_ids);
  std::vector<int32_t> by_gpt2;
  tokenizer::Encoder(gpt2).encode(text, by_gpt2);
  CHECK(ids != by_gpt2);
  CHECK(std::count(by_gpt2.begin(), by_gpt2.end(), t.merges()[0].first) == 1);
  // Written back, it is still Llama 3's.
  testing::write_bytes(dir / "again.json", t.to_json());
  CHECK(tokenizer::Tokenizer::load(dir / "again.json").pattern() == tokenizer::Pattern::Llama3);
}

TEST_CASE("tokenizer: a tokenizer.json of another kind is refused by what it is") {
  testing::TempDir dir("tokenizer");
  const auto load_error = [&](const std::string& json) {
    testing::write_bytes(dir / "t.json", json);
    return testing::error_of([&] { tokenizer::Tokenizer::load(dir / "t.json"); });
  };
  CHECK(load_error(R"({"model": {"type": "WordPiece", "vocab": {}}})").find("a WordPiece tokenizer") !=
        std::string::npos);
  CHECK(load_error(R"({"model": {"type": "Unigram", "vocab": []}})").find("a Unigram tokenizer") != std::string::npos);
  const std::string bpe = R"({"type": "BPE", "vocab": {"a": 0}, "merges": []})";
  CHECK(load_error(R"({"normalizer": {"type": "NFC"}, "pre_tokenizer": {"type": "ByteLevel"}, "model": )" + bpe + "}")
            .find("a NFC normalizer") != std::string::npos);
  CHECK(load_error(R"({"pre_tokenizer": {"type": "Whitespace"}, "model": )" + bpe + "}")
            .find("a Whitespace pre-tokenizer") != std::string::npos);
  CHECK(load_error(R"({"pre_tokenizer": {"type": "ByteLevel"}, "model": )" + bpe + "}")
            .find("no token for byte 0x00") != std::string::npos);
  CHECK(load_error(R"({"pre_tokenizer": {"type": "ByteLevel"}, "model": {"type": "BPE", "vocab": {"▁the": 0}, )"
                   R"("merges": []}})")
            .find("not spelled in GPT-2's byte alphabet") != std::string::npos);
  CHECK(load_error("{\"model\": ").find("not a tokenizer.json") != std::string::npos);
  // A field of the wrong type, an id past the vocabulary: errors naming the file, not crashes.
  std::string json = small_tokenizer().to_json();
  std::string wrong = json;
  wrong.replace(wrong.find("\"ignore_merges\": false"), std::string("\"ignore_merges\": false").size(),
                "\"ignore_merges\": null");
  CHECK(load_error(wrong).find(dir / "t.json" + ": not a tokenizer.json napkin can read") != std::string::npos);
  wrong = json;
  wrong.replace(wrong.find("\"id\": 268"), std::string("\"id\": 268").size(), "\"id\": 2000000000");
  CHECK(load_error(wrong).find("id 2000000000 is past the 270 tokens of the vocab and added_tokens") != std::string::npos);
  CHECK(load_error(R"({"pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": )"
                   R"({"Regex": "\\p{N}{1,3}"}, "behavior": "Isolated"}, {"type": "ByteLevel", "use_regex": false}]}, )"
                   R"("model": )" + bpe + "}")
            .find("GPT-2's or Llama 3's pattern only") != std::string::npos);
  // After a Split, a ByteLevel that does not say use_regex: false splits by GPT-2's regex again (tokenizers' default).
  CHECK(load_error(R"({"pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": )"
                   R"({"Regex": "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"}, )"
                   R"("behavior": "Isolated"}, {"type": "ByteLevel"}]}, "model": )" + bpe + "}")
            .find("use_regex is not false") != std::string::npos);
  // A special token spelled like a token of the vocabulary cannot be written.
  CHECK(testing::error_of([] { tokenizer::Tokenizer::from_merges({{" ", "x"}}, {"\u0120x"}); })
            .find("is the spelling of token 256") != std::string::npos);
}

}  // namespace
}  // namespace napkin
