#include "runtime/token_text.h"

#include <fmt/format.h>

#include "runtime/error.h"

namespace napkin::runtime {

TokenText::TokenText(int64_t vocab, const std::string& tokenizer_path) : vocab_(vocab), path_(tokenizer_path) {
  if (tokenizer_path.empty()) return;
  tokenizer_ = tokenizer::Tokenizer::load(tokenizer_path);
  if (tokenizer_->vocab_size() > vocab)
    throw Error(fmt::format("{}: the tokenizer has {} tokens, more than the model's vocabulary of {}: the model was "
                            "not made for this tokenizer (its vocab dim must be at least {})",
                            tokenizer_path, tokenizer_->vocab_size(), vocab, tokenizer_->vocab_size()));
}

std::string TokenText::piece(int64_t id) {
  if (tokenizer_) {
    if (id < tokenizer_->vocab_size()) return tokenizer_->token_bytes(static_cast<int32_t>(id));
    ++unknown_;
    return fmt::format("<|id {}|>", id);
  }
  if (vocab_ <= 256) return std::string(1, static_cast<char>(id));
  return fmt::format("{} ", id);
}

std::vector<int64_t> TokenText::encode(const std::string& text, bool given) const {
  std::vector<int64_t> ids;
  if (tokenizer_) {
    if (!given) {
      const int32_t eot = tokenizer_->special_id("<|endoftext|>");
      return {eot >= 0 ? eot : tokenizer_->byte_id('\n')};
    }
    std::vector<int32_t> encoded;
    tokenizer::Encoder(*tokenizer_).encode(text, encoded);
    ids.assign(encoded.begin(), encoded.end());
    return ids;
  }
  if (vocab_ > 256)
    throw Error(fmt::format("the model's vocabulary has {} tokens, not bytes, and no tokenizer is named: give the "
                            "prompt as token ids with --prompt-ids FILE (whitespace-separated), or the tokenizer.json "
                            "its data was encoded with (--tokenizer, or train.data.tokenizer in the model)",
                            vocab_));
  const std::string start = given ? text : std::string("\n");
  for (size_t i = 0; i < start.size(); ++i) {
    const auto byte = static_cast<unsigned char>(start[i]);
    if (byte >= vocab_)
      throw Error(fmt::format("--prompt: byte {} (0x{:02x}) at offset {} is outside the model's vocabulary of {} bytes",
                              byte, byte, i, vocab_));
    ids.push_back(byte);
  }
  return ids;
}

}  // namespace napkin::runtime
