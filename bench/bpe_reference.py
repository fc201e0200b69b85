#!/usr/bin/env python3
"""Byte-level BPE training as CS336's assignment 1 states it, written plainly in Python: the reference that
bench/tokenizer.py times `napkin data bpe` against and whose merges napkin's must equal (SPEC39's rule).

    python bench/bpe_reference.py CORPUS... --vocab N [--special TEXT]... -o merges.txt

The algorithm (CS336 assignment 1, section 2):
  - each corpus file is a document; special tokens' texts split it and are removed (never merged);
  - each part is cut into pre-tokens by GPT-2's pattern (the `regex` module, as CS336 does), counted;
  - the vocabulary starts as the 256 bytes; each step merges the most frequent adjacent pair (counted within
    pre-tokens, weighted by the pre-token's count), ties broken by the lexicographically greater pair of byte
    strings (left bytes, then right bytes), until vocab = 256 + #specials + #merges reaches N or no pair is left.
Pair counts are kept incrementally (each merge rewrites only the pre-tokens that contain the pair, found through a
pair -> pre-tokens index), but the most frequent pair is found by a scan of all pair counts at every merge:
"straightforward", not tuned.

merges.txt: one merge per line in rank order, "LEFT RIGHT", each side spelled in GPT-2's byte-to-character
alphabet (as tokenizer.json and GPT-2's merges.txt spell them), after a "#version: 0.2" line.
"""
import argparse
import sys
import time
from collections import Counter, defaultdict

import regex

# GPT-2's pre-tokenization pattern (openai/gpt-2 encoder.py; CS336 writes the contractions as '(?:[sdmt]|ll|ve|re)).
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
_PIECE = regex.compile(GPT2_PATTERN)


def bytes_to_unicode():
    """GPT-2's map from the 256 bytes to printable characters (openai/gpt-2 encoder.py)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
        range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(printable, chars)}


BYTE_CHAR = bytes_to_unicode()
CHAR_BYTE = {c: b for b, c in BYTE_CHAR.items()}


def spell(token: bytes) -> str:
    """A token's bytes in GPT-2's byte-to-character alphabet."""
    return "".join(BYTE_CHAR[b] for b in token)


def unspell(text: str) -> bytes:
    return bytes(CHAR_BYTE[c] for c in text)


def pretoken_counts(texts, specials):
    """Counts of each pre-token's bytes over the documents `texts` (str), split at the special tokens first."""
    counts = Counter()
    splitter = regex.compile("|".join(regex.escape(s) for s in sorted(specials, key=len, reverse=True))) \
        if specials else None
    for text in texts:
        for part in (splitter.split(text) if splitter else [text]):
            counts.update(m.group().encode("utf-8") for m in _PIECE.finditer(part))
    return counts


def train_bpe(texts, vocab_size, specials=()):
    """The merges (a list of (left bytes, right bytes), by rank) of a vocabulary of vocab_size tokens:
    256 bytes, the merges, the special tokens."""
    if vocab_size < 256 + len(specials):
        raise ValueError(f"vocab {vocab_size} < 256 bytes + {len(specials)} special tokens")
    words = []  # [symbols (list of bytes), count]
    for token, count in pretoken_counts(texts, specials).items():
        words.append([[bytes([b]) for b in token], count])

    pair_counts = defaultdict(int)
    pair_words = defaultdict(set)  # pair -> indices of words that contained it (may hold stale indices)
    for i, (symbols, count) in enumerate(words):
        for pair in zip(symbols, symbols[1:]):
            pair_counts[pair] += count
            pair_words[pair].add(i)

    merges = []
    while len(merges) < vocab_size - 256 - len(specials) and pair_counts:
        best = max(pair_counts, key=lambda p: (pair_counts[p], p))
        merges.append(best)
        left, right = best
        joined = left + right
        for i in list(pair_words.pop(best)):
            symbols, count = words[i]
            merged = []
            j = 0
            while j < len(symbols):
                if j + 1 < len(symbols) and symbols[j] == left and symbols[j + 1] == right:
                    merged.append(joined)
                    j += 2
                else:
                    merged.append(symbols[j])
                    j += 1
            if len(merged) == len(symbols):
                continue  # a stale index: this word lost the pair to an earlier merge
            for pair in zip(symbols, symbols[1:]):
                pair_counts[pair] -= count
                if pair_counts[pair] == 0:
                    del pair_counts[pair]
            for pair in zip(merged, merged[1:]):
                pair_counts[pair] += count
                pair_words[pair].add(i)
            words[i][0] = merged
    return merges


def write_merges(path, merges):
    with open(path, "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n")
        for left, right in merges:
            f.write(f"{spell(left)} {spell(right)}\n")


def read_merges(path):
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    return [tuple(unspell(side) for side in line.split(" ")) for line in lines if line and not line.startswith("#")]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("corpus", nargs="+", help="text files (UTF-8), each a document")
    ap.add_argument("--vocab", type=int, required=True)
    ap.add_argument("--special", action="append", default=[])
    ap.add_argument("-o", "--output", required=True, help="merges.txt to write")
    args = ap.parse_args()
    start = time.perf_counter()
    texts = []
    for path in args.corpus:
        with open(path, encoding="utf-8") as f:
            texts.append(f.read())
    merges = train_bpe(texts, args.vocab, args.special)
    seconds = time.perf_counter() - start
    write_merges(args.output, merges)
    print(f"bpe_reference: {len(merges)} merges in {seconds:.2f} s -> {args.output}", file=sys.stderr)


if __name__ == "__main__":
    main()
