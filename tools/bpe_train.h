// `napkin data bpe`: byte-level BPE training as GPT-2 defines it, on text
// files of any bytes. The corpus is cut at the special tokens' texts (which
// are dropped: they are never merged), pre-tokenized by GPT-2's pattern
// (runtime/pretokenize.h), and each distinct pre-token is counted; then the
// most frequent adjacent pair of tokens within pre-tokens (weighted by the
// pre-tokens' counts) is merged into a new token, again and again, until the
// vocabulary has the size asked for. Ties go to the lexicographically greater
// pair of byte strings (left bytes first, then right bytes), CS336's rule, so
// the result depends on nothing but the corpus and the options: not on the
// thread count, the order of the files' chunks, or hashing.
//
// Counting runs in parallel over chunks of the files (cut at
// tokenizer::safe_cuts, where pre-tokens cannot straddle), each thread
// counting into its own hash maps, merged after. Merging is incremental: the
// count of every pair and the pre-tokens each pair occurs in are kept, a merge
// rewrites only the pre-tokens that contain its pair and adjusts the counts
// of the pairs around each occurrence, and the most frequent pair comes from a
// lazy max-heap (entries whose count went stale are re-queued when popped).
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <utility>
#include <vector>

namespace napkin::tools {

struct BpeOptions {
  // The size of the vocabulary to reach, counting everything: the 256 bytes,
  // the merged tokens and the special tokens.
  int64_t vocab_size = 0;
  // Texts matched verbatim in the corpus (leftmost, then longest): they cut
  // the text and are not part of any pre-token.
  std::vector<std::string> specials;
  // Counting threads; <= 0: runtime::default_thread_count().
  int threads = 0;
};

// Where training reports its progress (merges done of all, ETA): nowhere
// when `out` is null; in place (carriage returns) when `terminal`, else a
// line every 2 seconds.
struct BpeProgress {
  std::ostream* out = nullptr;
  bool terminal = false;
};

struct BpeResult {
  // The merges by rank, as the byte strings of their left and right tokens.
  // A merge whose bytes are already a token (("a", "bc") after ("ab", "c"))
  // makes no new token: Hugging Face's trainer does the same, so there can be
  // more merges than vocab_size - 256 - specials.
  std::vector<std::pair<std::string, std::string>> merges;
  int64_t vocab_size = 0;     // reached: 256 + distinct merged tokens + specials
  bool ran_out = false;       // no pair of tokens was left to merge before the vocab_size asked for
  int64_t corpus_bytes = 0;   // bytes of the files, special tokens included
  int64_t pretokens = 0;      // pre-tokens in the corpus
  int64_t unique_pretokens = 0;
  double seconds = 0;
};

// Trains on the files `corpus`. Throws runtime::Error for a file that cannot
// be read, an empty special token, a vocab_size below 256 + specials, and a
// corpus with no text outside the special tokens.
BpeResult train_bpe(const std::vector<std::string>& corpus, const BpeOptions& options, const BpeProgress& progress);

}  // namespace napkin::tools
