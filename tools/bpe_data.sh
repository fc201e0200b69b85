#!/usr/bin/env bash
# models/llama-bpe.yaml's data: a 4,096-token byte-level BPE (with
# <|endoftext|>) trained on the two public-domain Bibles of
# tools/bible_corpus.py, and the corpus encoded with it, <|endoftext|> before
# each book. Idempotent: what exists is kept. Needs a built napkin
# (tools/setup.sh) and apt-get for the corpus's Debian packages.
#   bash tools/bpe_data.sh && build/tools/napkin train models/llama-bpe.yaml
set -euo pipefail
cd "$(dirname "$0")/.."
napkin=build/tools/napkin
tokenizer=data/bibles.tokenizer.json
tokens=data/bibles.u16
list=$(python3 tools/bible_corpus.py)  # not in a process substitution: set -e sees it fail
mapfile -t books <<< "$list"
if [ ! -f "$tokenizer" ]; then
  "$napkin" data bpe "${books[@]}" --vocab 4096 --special "<|endoftext|>" -o "$tokenizer"
fi
if [ ! -f "$tokens" ]; then
  "$napkin" data encode --tokenizer "$tokenizer" --eot "${books[@]}" -o "$tokens"
fi
