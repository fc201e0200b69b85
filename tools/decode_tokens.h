// `napkin data decode`: a token file back to text, to see what a model is
// trained on. The file is what `napkin data encode` or llm.c writes: raw u16,
// u32 or i32 ids, or llm.c's header and its ids (runtime/dataset.h
// token_file_layout, as the trainer reads it); the text is the tokenizer's
// bytes for each id (special tokens as their text), or each byte itself
// without a tokenizer.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

namespace napkin::tools {

struct DecodeOptions {
  std::string input;      // the token file
  std::string tokenizer;  // tokenizer.json; "" for byte-level ids (< 256)
  std::string dtype;      // a raw file's ids: "u16", "u32", "i32", or "": u16 when the vocabulary fits, else u32
  int64_t first = 0;      // the first id decoded
  int64_t count = -1;     // ids decoded (-1: to the end)
};

// Writes the text to `out`. Returns false with `error` set to the line to
// print: an unreadable file, a size that is not whole ids, an llm.c header
// that does not hold, a tokenizer.json napkin cannot use, an id outside the
// vocabulary (with its position), --first past the end.
bool decode_token_file(const DecodeOptions& options, std::ostream& out, std::string& error);

}  // namespace napkin::tools
