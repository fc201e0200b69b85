// Byte-level BPE tokenizers of GPT-2's kind, read from and written to Hugging
// Face's tokenizer.json: a vocabulary of byte strings, a ranked list of
// merges, GPT-2's or Llama 3's pre-tokenization (runtime/pretokenize.h) and special tokens
// ("<|endoftext|>") that are matched in the text before pre-tokenization and
// never merged. The trainer's sampler decodes with it, `napkin data encode`
// encodes with it, `napkin data bpe` writes one.
//
// What tokenizer.json holds: the vocabulary ("model.vocab") maps each token's
// bytes, spelled in GPT-2's byte-to-character alphabet (byte 0x20 is 'Ġ'), to
// its id; "model.merges" lists the merges by rank ("Ġ t" or ["Ġ", "t"]); the
// special tokens are "added_tokens". Anything else (a WordPiece or Unigram
// model, a BPE without the ByteLevel pre-tokenizer, a normalizer) is refused
// by name.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "runtime/pretokenize.h"

namespace napkin::tokenizer {

struct SpecialToken {
  std::string text;  // matched verbatim in the text
  int32_t id = 0;
};

// Special tokens' occurrences in a text, as Hugging Face tokenizers finds its
// added tokens: the leftmost first, the longest of those that start at the
// same byte (an empty text never occurs). Each special's next occurrence is
// kept, so a text is searched once per special, not once per match.
class SpecialFinder {
 public:
  SpecialFinder(std::string_view text, const std::vector<SpecialToken>& specials);
  struct Found {
    size_t at = std::string_view::npos;  // npos: none left
    const SpecialToken* special = nullptr;
  };
  // The next occurrence that starts at or after `from`.
  Found next(size_t from);

 private:
  std::string_view text_;
  const std::vector<SpecialToken>& specials_;
  std::vector<size_t> next_;
};

// True when an occurrence of a special token covers both text[pos - 1] and
// text[pos] (0 < pos): cutting the text there would hide it from both sides.
bool crosses_special(std::string_view text, size_t pos, const std::vector<SpecialToken>& specials);

class Tokenizer {
 public:
  // Reads a tokenizer.json; throws runtime::Error naming the file and what is
  // wrong or unsupported.
  static Tokenizer load(const std::string& path);
  // The tokenizer napkin data bpe trained: ids 0-255 are the 256 bytes in
  // order, merge r (rank r, left and right as byte strings already in the
  // vocabulary) makes id 256 + r, and the special tokens follow.
  static Tokenizer from_merges(const std::vector<std::pair<std::string, std::string>>& merges,
                               const std::vector<std::string>& specials);

  // tokenizer.json text that Hugging Face's `tokenizers` loads as is.
  std::string to_json() const;

  int64_t vocab_size() const { return static_cast<int64_t>(tokens_.size()); }
  const std::string& token_bytes(int32_t id) const { return tokens_.at(static_cast<size_t>(id)); }
  const std::vector<SpecialToken>& specials() const { return specials_; }
  // The id of a special token's text, or -1.
  int32_t special_id(std::string_view text) const;
  const std::vector<std::pair<int32_t, int32_t>>& merges() const { return merges_; }
  // The pre-tokenization pattern: GPT-2's, or Llama 3's (tiktoken's cl100k).
  Pattern pattern() const { return pattern_; }
  // The id of the one-byte token of byte `b` (every byte-level BPE has all 256).
  int32_t byte_id(uint8_t b) const { return byte_ids_[b]; }

  // The text of `ids` (bytes, which need not be UTF-8 when the ids cut a
  // character). Throws runtime::Error for an id outside [0, vocab_size()).
  std::string decode(const std::vector<int32_t>& ids) const;

 private:
  friend class Encoder;
  static Tokenizer load_json(const std::string& path);  // load's body; nlohmann's type errors escape it
  std::vector<std::string> tokens_;                      // id -> bytes (ids with no token: "")
  std::unordered_map<std::string, int32_t> ids_;         // bytes -> id
  std::array<int32_t, 256> byte_ids_{};                  // byte -> the id of its one-byte token
  std::vector<std::pair<int32_t, int32_t>> merges_;      // rank -> (left, right)
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merge_of_;  // (left << 32 | right) -> (rank, result)
  std::vector<SpecialToken> specials_;
  bool ignore_merges_ = false;  // a piece that is a token is that token (Llama 3's tokenizer.json)
  Pattern pattern_ = Pattern::Gpt2;
};

// Encodes text with one tokenizer. Not thread-safe (it caches each piece's
// ids): one Encoder per thread, all reading the same Tokenizer.
class Encoder {
 public:
  explicit Encoder(const Tokenizer& t) : t_(t) {}
  // Appends the ids of `text` to `out`: special tokens' texts become their
  // ids, the rest is pre-tokenized and merged. Equal to Hugging Face
  // tokenizers' encode(text, add_special_tokens=False).ids (the
  // post-processor's tokens, Llama 3's <|begin_of_text|>, are not added).
  void encode(std::string_view text, std::vector<int32_t>& out);
  // The same without matching special tokens (their texts are plain text).
  void encode_ordinary(std::string_view text, std::vector<int32_t>& out);

 private:
  void encode_piece(std::string_view piece, std::vector<int32_t>& out);
  // Merges a piece longer than kLongPiece bytes in O(n log n).
  void merge_long(std::vector<int32_t>& ids) const;
  static constexpr size_t kLongPiece = 64;
  // Looked up by string_view, so a cached piece costs no string copy.
  struct PieceHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  const Tokenizer& t_;
  std::unordered_map<std::string, std::vector<int32_t>, PieceHash, std::equal_to<>> cache_;
  std::vector<int32_t> ids_;  // encode_piece's work buffer
};

// GPT-2's map from bytes to printable characters (bytes_to_unicode in
// openai/gpt-2's encoder.py), in which tokenizer.json spells tokens: the UTF-8
// of byte b's character.
const std::string& byte_char(uint8_t b);

}  // namespace napkin::tokenizer
