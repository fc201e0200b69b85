// Pre-tokenization: the text is cut into pieces by a fixed pattern (its
// alternatives tried left to right at each position, as a backtracking regex
// engine does), and byte-level BPE merges only within a piece. GPT-2's
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// or Llama 3's (tiktoken's cl100k_base): case-insensitive contractions, a
// letter run with one leading non-letter, numbers in threes, punctuation
// with its newlines
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
//   \s*[\r\n]+|\s+(?!\S)|\s+
// Written by hand rather than with a regex engine: it is the hot loop of
// encoding and of training, and the patterns are fixed.
#pragma once

#include <cstddef>
#include <string_view>
#include <vector>

namespace napkin::tokenizer {

enum class Pattern { Gpt2, Llama3 };

// The end of the piece that starts at text[begin] (begin < text.size()).
size_t gpt2_piece_end(std::string_view text, size_t begin);
size_t llama3_piece_end(std::string_view text, size_t begin);

// Calls fn(piece) for each piece of `text`, in order.
template <typename Fn>
void for_each_piece(std::string_view text, Fn&& fn, Pattern pattern = Pattern::Gpt2) {
  for (size_t i = 0; i < text.size();) {
    size_t end = pattern == Pattern::Gpt2 ? gpt2_piece_end(text, i) : llama3_piece_end(text, i);
    fn(text.substr(i, end - i));
    i = end;
  }
}

// True when cutting `text` at `pos` (0 < pos < size) and pre-tokenizing the
// two sides apart gives the same pieces as pre-tokenizing it whole, by
// either pattern: pos is right after an ASCII non-whitespace byte and right
// before an ASCII space or tab ("end| of", "end.|\tx"). Why: no piece holds
// both a non-space and a space or tab that follows it (those only ever lead
// a piece; Llama 3's punctuation takes the newlines after it, so a cut
// before a newline is not safe there), so a piece ends at pos in the whole
// text, and the piece before it, a run that ends at a non-space, ends there
// alone too; the patterns have no lookbehind, so what follows is cut the
// same from pos. A cut after a space is not safe: `\s+(?!\S)` looks ahead.
// Parallel encoding and training cut files only at such points (and at
// special tokens, which split the text anyway).
bool is_safe_cut(std::string_view text, size_t pos);

// Up to `parts` - 1 safe cuts (increasing) that split `text` into pieces of
// about equal size: each is the first safe cut at or after the ideal
// position. A text without safe cuts stays whole.
std::vector<size_t> safe_cuts(std::string_view text, size_t parts);

}  // namespace napkin::tokenizer
