// `napkin data encode`: text files into a token file that train.data
// {format: tokens} reads, with a byte-level BPE tokenizer.json (GPT-2's
// kind, runtime/tokenizer.h) or, without one, byte-level tokens (every byte
// its own id, a vocabulary of 256).
//
// Streaming and parallel: each file is read in blocks, a block is cut where
// encoding its two sides apart gives the ids of encoding it whole (a safe
// cut, runtime/pretokenize.h, or the start of a special token), the text
// after the last cut waits for the next block, and the cut text is split the
// same way into parts that the threads encode, one tokenizer::Encoder each.
// So memory is bounded by the block size whatever the corpus size, and the
// file is the same for any thread count and block size: the ids of
// Encoder::encode of each file whole, in order. Each input file is one
// document; --eot puts the end-of-text token before each.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace napkin::tools {

struct EncodeOptions {
  std::vector<std::string> inputs;  // text files (any bytes: byte-level BPE needs no UTF-8), one document each
  std::string output;
  std::string tokenizer;            // tokenizer.json; "" for byte-level tokens
  std::string dtype;                // "u16", "u32", or "": u16 when the vocabulary fits in it, else u32
  bool llmc = false;                // llm.c's 1,024-byte header before the tokens
  bool eot = false;                 // the end-of-text token before each document
  int threads = 0;                  // <= 0: every CPU this process may use
  size_t block_bytes = size_t{16} << 20;  // bytes read at a time (tests use tiny blocks)
};

struct EncodeSummary {
  std::string dtype;  // "u16" or "u32"
  int64_t vocab = 0;
  int64_t tokens = 0, bytes = 0;
  double seconds = 0;
  int threads = 0;
};

// Writes the token file atomically (a temporary file beside it, renamed over
// it). Returns what it wrote, or nullopt with `error` set to the line to
// print (an unreadable or non-regular input, an output that is an input or a
// directory, a tokenizer.json napkin cannot use, ids that do not fit the
// dtype, --eot without an end-of-text token); nothing is left behind then.
std::optional<EncodeSummary> encode_text_files(const EncodeOptions& options, std::string& error);

// "wrote F: 1,234 u16 tokens of 2 files (5,000 bytes, 4.05 bytes/token), 12.3 MB/s on 4 threads".
std::string summary_line(const EncodeOptions& options, const EncodeSummary& summary);

}  // namespace napkin::tools
