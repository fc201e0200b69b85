#include "runtime/tokenizer.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <queue>

#include "runtime/error.h"
#include "runtime/pretokenize.h"

namespace napkin::tokenizer {
namespace {

using Json = nlohmann::json;

// The pre-tokenization patterns as tokenizer.json spells them in a Split
// pre-tokenizer (a ByteLevel pre-tokenizer with use_regex applies GPT-2's
// implicitly): runtime/pretokenize.h cuts by them.
constexpr std::string_view kGpt2Pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
constexpr std::string_view kLlama3Pattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

std::string utf8(char32_t c) {
  std::string s;
  if (c < 0x80) s += static_cast<char>(c);
  else if (c < 0x800) {
    s += static_cast<char>(0xC0 | (c >> 6));
    s += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    s += static_cast<char>(0xE0 | (c >> 12));
    s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (c & 0x3F));
  }
  return s;
}

// bytes_to_unicode of openai/gpt-2's encoder.py: printable bytes stand for
// themselves, the other 68 take the characters from U+0100 on, in byte order.
struct ByteAlphabet {
  std::array<std::string, 256> chars;
  std::array<int16_t, 324> byte_of;  // code point (< 324) -> byte, or -1
  ByteAlphabet() {
    byte_of.fill(-1);
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const char32_t c = printable ? static_cast<char32_t>(b) : next++;
      chars[b] = utf8(c);
      byte_of[c] = static_cast<int16_t>(b);
    }
  }
};

const ByteAlphabet& alphabet() {
  static const ByteAlphabet a;
  return a;
}

std::string spell(std::string_view bytes) {
  std::string s;
  for (char b : bytes) s += alphabet().chars[static_cast<uint8_t>(b)];
  return s;
}

// The bytes a vocabulary entry spells, or false when a character is outside
// GPT-2's byte alphabet (the tokenizer is not byte-level).
bool unspell(std::string_view spelled, std::string& bytes) {
  bytes.clear();
  for (size_t i = 0; i < spelled.size();) {
    const auto b0 = static_cast<uint8_t>(spelled[i]);
    char32_t c;
    size_t n;
    if (b0 < 0x80) c = b0, n = 1;
    else if ((b0 & 0xE0) == 0xC0 && i + 1 < spelled.size()) {
      c = ((b0 & 0x1F) << 6) | (static_cast<uint8_t>(spelled[i + 1]) & 0x3F);
      n = 2;
    } else return false;
    if (c >= alphabet().byte_of.size() || alphabet().byte_of[c] < 0) return false;
    bytes += static_cast<char>(alphabet().byte_of[c]);
    i += n;
  }
  return true;
}

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

std::string type_of(const Json& j) {
  return j.is_object() && j.contains("type") && j["type"].is_string() ? j["type"].get<std::string>() : std::string();
}

bool is_null_or(const Json& j, const char* key, const Json& value) {
  return !j.contains(key) || j[key].is_null() || j[key] == value;
}

// Checks that a pre_tokenizer is of GPT-2's kind: a ByteLevel one applying
// GPT-2's pattern itself, or (Llama 3's layout) a Split by GPT-2's or Llama
// 3's pattern followed by a ByteLevel one that does not, and sets `pattern`.
// Returns what is unsupported, or "".
std::string pre_tokenizer_problem(const Json& p, Pattern& pattern) {
  pattern = Pattern::Gpt2;
  const std::string type = type_of(p);
  if (type == "ByteLevel") {
    if (!is_null_or(p, "add_prefix_space", false)) return "a ByteLevel pre-tokenizer with add_prefix_space: true";
    if (!is_null_or(p, "use_regex", true)) return "a ByteLevel pre-tokenizer without its regex and no Split before it";
    return "";
  }
  if (type == "Sequence" && p.contains("pretokenizers") && p["pretokenizers"].is_array() &&
      p["pretokenizers"].size() == 2) {
    const Json& split = p["pretokenizers"][0];
    const Json& byte_level = p["pretokenizers"][1];
    if (type_of(split) != "Split" || type_of(byte_level) != "ByteLevel")
      return "a Sequence pre-tokenizer other than [Split, ByteLevel]";
    const Json& spelled = split.value("pattern", Json());
    const std::string regex = spelled.is_object() && spelled.contains("Regex") && spelled["Regex"].is_string()
                                  ? spelled["Regex"].get<std::string>()
                                  : "";
    if (regex == kLlama3Pattern) {
      pattern = Pattern::Llama3;
    } else if (regex != kGpt2Pattern) {
      return fmt::format("a Split pre-tokenizer by the pattern {} (napkin pre-tokenizes by GPT-2's or Llama 3's "
                         "pattern only)",
                         regex.empty() ? split.value("pattern", Json()).dump() : regex);
    }
    if (split.value("behavior", std::string("Isolated")) != "Isolated" || !is_null_or(split, "invert", false))
      return "a Split pre-tokenizer that does not isolate its matches";
    // tokenizers' ByteLevel applies GPT-2's regex unless use_regex is false.
    if (!is_null_or(byte_level, "add_prefix_space", false) || !byte_level.contains("use_regex") ||
        byte_level["use_regex"] != false)
      return "a ByteLevel pre-tokenizer after a Split that adds a prefix space or splits again (use_regex is not false)";
    return "";
  }
  if (p.is_null()) return "no pre-tokenizer (a byte-level BPE needs GPT-2's ByteLevel pre-tokenizer)";
  return fmt::format("a {} pre-tokenizer (napkin reads byte-level BPE tokenizers, whose pre-tokenizer is ByteLevel)",
                     type.empty() ? p.dump() : type);
}

}  // namespace

const std::string& byte_char(uint8_t b) { return alphabet().chars[b]; }

SpecialFinder::SpecialFinder(std::string_view text, const std::vector<SpecialToken>& specials)
    : text_(text), specials_(specials) {
  for (const SpecialToken& s : specials) next_.push_back(s.text.empty() ? std::string_view::npos : text.find(s.text));
}

SpecialFinder::Found SpecialFinder::next(size_t from) {
  Found best;
  for (size_t k = 0; k < specials_.size(); ++k) {
    if (next_[k] < from) next_[k] = text_.find(specials_[k].text, from);
    if (next_[k] < best.at ||
        (next_[k] == best.at && best.special && specials_[k].text.size() > best.special->text.size()))
      best = {next_[k], &specials_[k]};
  }
  return best;
}

bool crosses_special(std::string_view text, size_t pos, const std::vector<SpecialToken>& specials) {
  for (const SpecialToken& s : specials)
    for (size_t start = pos >= s.text.size() ? pos - s.text.size() + 1 : 0; start < pos; ++start)
      if (text.compare(start, s.text.size(), s.text) == 0) return true;
  return false;
}

Tokenizer Tokenizer::load(const std::string& path) {
  try {
    return load_json(path);
  } catch (const nlohmann::json::exception& e) {  // a field of the wrong type ("ignore_merges": null)
    throw runtime::Error(fmt::format("{}: not a tokenizer.json napkin can read: {}", path, e.what()));
  }
}

Tokenizer Tokenizer::load_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw runtime::Error(fmt::format("{}: cannot read the tokenizer", path));
  Json j;
  try {
    j = Json::parse(in);
  } catch (const Json::parse_error& e) {
    throw runtime::Error(fmt::format("{}: not a tokenizer.json: {}", path, e.what()));
  }
  const auto refuse = [&](const std::string& what) {
    throw runtime::Error(fmt::format("{}: {}: napkin reads byte-level BPE tokenizers of GPT-2's kind", path, what));
  };
  if (!j.is_object() || !j.contains("model") || !j["model"].is_object())
    throw runtime::Error(fmt::format("{}: not a tokenizer.json (no \"model\" object)", path));
  const Json& model = j["model"];
  const std::string type = type_of(model);
  if (!type.empty() && type != "BPE") refuse(fmt::format("a {} tokenizer", type));
  if (!model.contains("vocab") || !model["vocab"].is_object() || !model.contains("merges") ||
      !model["merges"].is_array())
    refuse("a model without a vocab object and a merges list");
  if (!is_null_or(model, "continuing_subword_prefix", "") || !is_null_or(model, "end_of_word_suffix", ""))
    refuse("a BPE with subword prefixes or word suffixes (not byte-level)");
  if (!is_null_or(model, "byte_fallback", false)) refuse("a BPE with byte fallback (SentencePiece's kind)");
  if (!is_null_or(model, "dropout", 0.0) && !(model["dropout"].is_number() && model["dropout"].get<double>() == 0))
    refuse("a BPE with dropout");
  if (j.contains("normalizer") && !j["normalizer"].is_null())
    refuse(fmt::format("a {} normalizer", type_of(j["normalizer"]).empty() ? j["normalizer"].dump()
                                                                             : type_of(j["normalizer"])));
  Tokenizer t;
  if (std::string p = pre_tokenizer_problem(j.value("pre_tokenizer", Json()), t.pattern_); !p.empty()) refuse(p);
  t.ignore_merges_ = model.value("ignore_merges", false);
  // Added tokens first: their texts are matched verbatim and need not be
  // spelled in the byte alphabet.
  std::unordered_map<int32_t, std::string> added;
  if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
    for (const Json& a : j["added_tokens"]) {
      if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() || !a.contains("content") ||
          !a["content"].is_string())
        throw runtime::Error(fmt::format("{}: an added token without an integer id and a content: {}", path, a.dump()));
      for (const char* flag : {"single_word", "lstrip", "rstrip"})
        if (a.value(flag, false))
          refuse(fmt::format("the added token {} with {}: true", a["content"].dump(), flag));
      const auto id = a["id"].get<int64_t>();
      if (id < 0 || id > std::numeric_limits<int32_t>::max())
        throw runtime::Error(fmt::format("{}: the added token {} has id {}", path, a["content"].dump(), id));
      added[static_cast<int32_t>(id)] = a["content"].get<std::string>();
      t.specials_.push_back({a["content"].get<std::string>(), static_cast<int32_t>(id)});
    }
  }
  // Ids are dense: each below the number of entries (a stray 2^31 would
  // otherwise allocate a table of that size).
  const int64_t entries = static_cast<int64_t>(model["vocab"].size() + added.size());
  const auto grow = [&](int64_t id) {
    if (id >= entries)
      throw runtime::Error(fmt::format("{}: id {} is past the {} tokens of the vocab and added_tokens", path, id,
                                       entries));
    if (id >= static_cast<int64_t>(t.tokens_.size())) t.tokens_.resize(static_cast<size_t>(id) + 1);
  };
  std::string bytes;
  for (const auto& [spelled, value] : model["vocab"].items()) {
    if (!value.is_number_integer() || value.get<int64_t>() < 0 ||
        value.get<int64_t>() > std::numeric_limits<int32_t>::max())
      throw runtime::Error(fmt::format("{}: vocab entry {} has id {}, not a non-negative integer", path,
                                       Json(spelled).dump(), value.dump()));
    const auto id = static_cast<int32_t>(value.get<int64_t>());
    if (added.count(id)) continue;
    if (!unspell(spelled, bytes))
      refuse(fmt::format("the vocab entry {} (id {}) is not spelled in GPT-2's byte alphabet (not a byte-level BPE)",
                         Json(spelled).dump(), id));
    grow(id);
    t.tokens_[id] = bytes;
    t.ids_[bytes] = id;
  }
  for (const auto& [id, text] : added) {
    grow(id);
    t.tokens_[id] = text;
  }
  for (int b = 0; b < 256; ++b) {
    auto one = t.ids_.find(std::string(1, static_cast<char>(b)));
    if (one != t.ids_.end()) {
      t.byte_ids_[b] = one->second;
      continue;
    }
    refuse(fmt::format("the vocab has no token for byte 0x{:02x} (spelled {}): not every byte can be encoded", b,
                         Json(byte_char(static_cast<uint8_t>(b))).dump()));
  }
  const Json& merges = model["merges"];
  t.merges_.reserve(merges.size());
  std::string left, right;
  for (size_t r = 0; r < merges.size(); ++r) {
    const Json& m = merges[r];
    std::string a, b;
    if (m.is_string()) {  // "Ġ t" (tokenizers < 0.20)
      const std::string s = m.get<std::string>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos)
        throw runtime::Error(fmt::format("{}: merge {} is {}, not two tokens separated by a space", path, r, m.dump()));
      a = s.substr(0, space), b = s.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {  // ["Ġ", "t"]
      a = m[0].get<std::string>(), b = m[1].get<std::string>();
    } else {
      throw runtime::Error(fmt::format("{}: merge {} is {}, not a pair of tokens", path, r, m.dump()));
    }
    if (!unspell(a, left) || !unspell(b, right))
      refuse(fmt::format("merge {} ({}) is not spelled in GPT-2's byte alphabet", r, m.dump()));
    const auto l = t.ids_.find(left), rr = t.ids_.find(right), result = t.ids_.find(left + right);
    if (l == t.ids_.end() || rr == t.ids_.end() || result == t.ids_.end())
      throw runtime::Error(fmt::format("{}: merge {} ({}) joins or makes a token that is not in the vocab", path, r,
                                       m.dump()));
    t.merges_.emplace_back(l->second, rr->second);
    // A pair listed twice takes its last rank, as tokenizers does (its
    // BpeBuilder collects the merges into a map, the later entry overwriting).
    t.merge_of_.insert_or_assign(pair_key(l->second, rr->second), std::pair{static_cast<int32_t>(r), result->second});
  }
  return t;
}

Tokenizer Tokenizer::from_merges(const std::vector<std::pair<std::string, std::string>>& merges,
                                 const std::vector<std::string>& specials) {
  Tokenizer t;
  for (int b = 0; b < 256; ++b) {
    t.tokens_.emplace_back(1, static_cast<char>(b));
    t.ids_[t.tokens_.back()] = b;
    t.byte_ids_[b] = b;
  }
  for (size_t r = 0; r < merges.size(); ++r) {
    const auto& [a, b] = merges[r];
    const auto l = t.ids_.find(a), rr = t.ids_.find(b);
    if (l == t.ids_.end() || rr == t.ids_.end())
      throw runtime::Error(fmt::format("merge {} joins a token that no earlier merge made", r));
    const int32_t left = l->second, right = rr->second;
    // Two merges can make the same bytes ("ab" + "c", "a" + "bc"): the second
    // reuses the first's id, as a vocabulary keyed by bytes must.
    auto [it, fresh] = t.ids_.try_emplace(a + b, static_cast<int32_t>(t.tokens_.size()));
    if (fresh) t.tokens_.push_back(a + b);
    t.merges_.emplace_back(left, right);
    t.merge_of_.insert_or_assign(pair_key(left, right), std::pair{static_cast<int32_t>(r), it->second});
  }
  for (const std::string& s : specials) {
    // tokenizer.json's vocab is keyed by text: a special token's text must
    // be neither a token's spelling nor anything but UTF-8 (JSON text).
    std::string bytes;
    if (unspell(s, bytes) && t.ids_.count(bytes))
      throw runtime::Error(fmt::format("the special token \"{}\" is the spelling of token {} in tokenizer.json: "
                                       "choose another text, such as \"<|endoftext|>\"",
                                       s, t.ids_.at(bytes)));
    t.specials_.push_back({s, static_cast<int32_t>(t.tokens_.size())});
    t.tokens_.push_back(s);
  }
  return t;
}

std::string Tokenizer::to_json() const {
  using Ordered = nlohmann::ordered_json;
  const Ordered byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true},
                              {"use_regex", true}};
  Ordered added = Ordered::array();
  for (const SpecialToken& s : specials_)
    added.push_back({{"id", s.id}, {"content", s.text}, {"single_word", false}, {"lstrip", false},
                     {"rstrip", false}, {"normalized", false}, {"special", true}});
  Ordered vocab = Ordered::object();
  for (size_t id = 0; id < tokens_.size(); ++id) {
    bool special = std::any_of(specials_.begin(), specials_.end(),
                               [&](const SpecialToken& s) { return s.id == static_cast<int32_t>(id); });
    if (special) vocab[tokens_[id]] = id;
    else if (ids_.count(tokens_[id]) && ids_.at(tokens_[id]) == static_cast<int32_t>(id)) vocab[spell(tokens_[id])] = id;
  }
  Ordered merges = Ordered::array();
  for (const auto& [l, r] : merges_) merges.push_back(spell(tokens_[l]) + " " + spell(tokens_[r]));
  Ordered post = byte_level;
  post["trim_offsets"] = false;
  Ordered pre_tokenizer = byte_level;
  if (pattern_ == Pattern::Llama3) {
    Ordered after_split = byte_level;
    after_split["use_regex"] = false;
    pre_tokenizer = {{"type", "Sequence"},
                     {"pretokenizers",
                      {{{"type", "Split"}, {"pattern", {{"Regex", std::string(kLlama3Pattern)}}},
                        {"behavior", "Isolated"}, {"invert", false}},
                       after_split}}};
  }
  const Ordered j = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer", pre_tokenizer},
      {"post_processor", post},
      {"decoder", byte_level},
      {"model",
       {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr}, {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", ignore_merges_},
        {"vocab", vocab}, {"merges", merges}}},
  };
  return j.dump(2) + "\n";
}

int32_t Tokenizer::special_id(std::string_view text) const {
  for (const SpecialToken& s : specials_)
    if (s.text == text) return s.id;
  return -1;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string text;
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size())
      throw runtime::Error(fmt::format("token id {} is not in the tokenizer's vocabulary [0, {})", id, vocab_size()));
    text += tokens_[static_cast<size_t>(id)];
  }
  return text;
}

void Encoder::encode(std::string_view text, std::vector<int32_t>& out) {
  if (t_.specials_.empty()) return encode_ordinary(text, out);
  // Special tokens split the text first (SpecialFinder's order).
  SpecialFinder finder(text, t_.specials_);
  size_t from = 0;
  for (SpecialFinder::Found f = finder.next(0); f.special; f = finder.next(from)) {
    encode_ordinary(text.substr(from, f.at - from), out);
    out.push_back(f.special->id);
    from = f.at + f.special->text.size();
  }
  encode_ordinary(text.substr(from), out);
}

void Encoder::encode_ordinary(std::string_view text, std::vector<int32_t>& out) {
  for_each_piece(text, [&](std::string_view piece) { encode_piece(piece, out); }, t_.pattern_);
}

void Encoder::merge_long(std::vector<int32_t>& ids) const {
  // Symbols in a linked list; candidate merges in a min-heap by (rank,
  // position), so equal ranks go leftmost first. An entry is stale once
  // either of its symbols has changed: it is dropped when it surfaces.
  struct Candidate {
    int32_t rank;
    int64_t at;
    int32_t left, right, result;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : at > o.at; }
  };
  const auto n = static_cast<int64_t>(ids.size());
  std::vector<int64_t> next(static_cast<size_t>(n)), prev(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) next[i] = i + 1 < n ? i + 1 : -1, prev[i] = i - 1;
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  const auto consider = [&](int64_t at) {
    if (at < 0 || next[at] < 0) return;
    auto m = t_.merge_of_.find(pair_key(ids[at], ids[next[at]]));
    if (m != t_.merge_of_.end()) heap.push({m->second.first, at, ids[at], ids[next[at]], m->second.second});
  };
  for (int64_t i = 0; i + 1 < n; ++i) consider(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    const int64_t right = next[c.at];
    if (right < 0 || ids[c.at] != c.left || ids[right] != c.right || ids[c.at] < 0) continue;
    ids[c.at] = c.result;
    ids[right] = -1;  // gone
    next[c.at] = next[right];
    if (next[right] >= 0) prev[next[right]] = c.at;
    consider(prev[c.at]);
    consider(c.at);
  }
  ids.erase(std::remove(ids.begin(), ids.end(), -1), ids.end());
}

void Encoder::encode_piece(std::string_view piece, std::vector<int32_t>& out) {
  if (piece.size() == 1) {
    out.push_back(t_.byte_ids_[static_cast<uint8_t>(piece[0])]);
    return;
  }
  if (auto hit = cache_.find(piece); hit != cache_.end()) {
    out.insert(out.end(), hit->second.begin(), hit->second.end());
    return;
  }
  std::vector<int32_t>& ids = ids_;
  ids.clear();
  if (t_.ignore_merges_) {
    if (auto whole = t_.ids_.find(std::string(piece)); whole != t_.ids_.end()) ids.push_back(whole->second);
  }
  if (ids.empty()) {
    for (char b : piece) ids.push_back(t_.byte_ids_[static_cast<uint8_t>(b)]);
    // Merge the adjacent pair of lowest rank (the leftmost among equals)
    // until no pair has a merge: tokenizers' and tiktoken's order. A scan
    // per merge is fastest for the short pieces of text; a long one (a run
    // of 100,000 '=') would make it quadratic, so it takes a heap.
    if (ids.size() > kLongPiece) merge_long(ids);
    while (ids.size() > 1 && ids.size() <= kLongPiece) {
      int32_t best_rank = std::numeric_limits<int32_t>::max(), best_result = -1;
      size_t best_at = 0;
      for (size_t i = 0; i + 1 < ids.size(); ++i) {
        auto m = t_.merge_of_.find(pair_key(ids[i], ids[i + 1]));
        if (m != t_.merge_of_.end() && m->second.first < best_rank)
          best_rank = m->second.first, best_result = m->second.second, best_at = i;
      }
      if (best_result < 0) break;
      ids[best_at] = best_result;
      ids.erase(ids.begin() + static_cast<std::ptrdiff_t>(best_at) + 1);
    }
  }
  out.insert(out.end(), ids.begin(), ids.end());
  // Bounded: a corpus of unique pieces must not grow the cache without end,
  // and a long piece (a run of one character) is not worth keeping twice.
  if (piece.size() > kLongPiece) return;
  if (cache_.size() >= (1u << 20)) cache_.clear();
  cache_.emplace(std::string(piece), ids);
}

}  // namespace napkin::tokenizer
