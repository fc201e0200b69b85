// GPT-2's pre-tokenization: the text is cut into pieces by the pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// (tried left to right at each position, as a backtracking regex engine
// does), and byte-level BPE merges only within a piece. Written by hand
// rather than with a regex engine: it is the hot loop of encoding and of
// training, and the pattern is fixed.
#pragma once

#include <cstddef>
#include <string_view>
#include <vector>

namespace napkin::tokenizer {

// The end of the piece that starts at text[begin] (begin < text.size()).
size_t gpt2_piece_end(std::string_view text, size_t begin);

// Calls fn(piece) for each piece of `text`, in order.
template <typename Fn>
void for_each_piece(std::string_view text, Fn&& fn) {
  for (size_t i = 0; i < text.size();) {
    size_t end = gpt2_piece_end(text, i);
    fn(text.substr(i, end - i));
    i = end;
  }
}

// True when cutting `text` at `pos` (0 < pos < size) and pre-tokenizing the
// two sides apart gives the same pieces as pre-tokenizing it whole: pos is
// right after an ASCII non-whitespace byte and right before an ASCII
// whitespace byte ("end| of", "end.|\n"). Why: no piece holds both a
// non-space and a space that follows it (a space only ever leads a piece),
// so a piece ends at pos in the whole text, and the piece before it, a run
// that ends at a non-space, ends there alone too; the pattern has no
// lookbehind, so what follows is cut the same from pos. A cut after a space
// is not safe: `\s+(?!\S)` looks ahead. Parallel encoding and training cut
// files only at such points (and at special tokens, which split the text
// anyway).
bool is_safe_cut(std::string_view text, size_t pos);

// Up to `parts` - 1 safe cuts (increasing) that split `text` into pieces of
// about equal size: each is the first safe cut at or after the ideal
// position. A text without safe cuts stays whole.
std::vector<size_t> safe_cuts(std::string_view text, size_t parts);

}  // namespace napkin::tokenizer
