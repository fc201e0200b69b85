// How a language model's token ids become text, and a prompt's text becomes
// ids, for the sampler and the trainer's --sample-every: a byte-level model's
// ids (vocabulary <= 256) are bytes; a model trained on a tokenizer's ids
// (train.data.tokenizer in its YAML, or --tokenizer) decodes by that
// tokenizer.json; any other model's ids print as numbers.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runtime/tokenizer.h"

namespace napkin::runtime {

class TokenText {
 public:
  // `vocab`: the model's vocabulary (its logits' last dimension). Loads the
  // tokenizer when `tokenizer_path` is set; throws Error when it cannot be
  // read, is not a byte-level BPE, or has more tokens than the model (ids the
  // model was never trained to emit: the model is not of this tokenizer).
  TokenText(int64_t vocab, const std::string& tokenizer_path);

  // Whether ids print as text (bytes or a tokenizer's tokens).
  bool is_text() const { return tokenizer_.has_value() || vocab_ <= 256; }
  // What an id prints as: its bytes, its token's bytes (a special token's
  // text), or the number and a space. A model whose vocabulary is padded past
  // the tokenizer's (GPT-2's 50,304 for 50,257) can sample an id the
  // tokenizer has no token for: it prints as "<|id N|>" and is counted.
  std::string piece(int64_t id);
  // The ids of a prompt's text (a tokenizer's encoding, with its special
  // tokens, or the bytes); "" gives the default start: the tokenizer's
  // <|endoftext|>, else a newline. Throws Error when the model cannot read
  // the text (a model of ids with no tokenizer).
  std::vector<int64_t> encode(const std::string& text, bool given) const;
  // The ids printed as "<|id N|>" so far.
  int64_t unknown_ids() const { return unknown_; }
  const std::string& tokenizer_path() const { return path_; }

 private:
  int64_t vocab_;
  std::string path_;
  std::optional<tokenizer::Tokenizer> tokenizer_;
  int64_t unknown_ = 0;
};

}  // namespace napkin::runtime
