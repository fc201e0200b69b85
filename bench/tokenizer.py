#!/usr/bin/env python3
"""Byte-level BPE (issue 39): napkin's `data bpe` and `data encode --tokenizer` against Hugging Face `tokenizers`,
`tiktoken` and a plain Python implementation of CS336's training (bench/bpe_reference.py), on a real corpus.

Run with the bench venv (bash bench/peers/setup.sh installs tokenizers, tiktoken and regex into it):
    ~/.cache/napkin/bench-venv/bin/python bench/tokenizer.py [--only correctness,speed,scaling] [--json OUT]
    ~/.cache/napkin/bench-venv/bin/python bench/tokenizer.py --write-fixtures

The corpus (public domain, from Debian packages; the script installs them with apt-get when missing and
extracts the text once into ~/.cache/napkin/bpe-corpus, each book one document, one file):
  kjv/  the King James Version, 66 books, 4.3 MB of ASCII: package bible-kjv-text (printed by bible-kjv's
        `bible`); the translation of 1611 is out of copyright (the package's copyright file says so);
  web/  the World English Bible with Deuterocanon, 81 books and its glossary, 7.0 MB of UTF-8 (curly quotes,
        dashes): package sword-text-web (printed by diatheke as plain text); "The World English Bible is in the
        Public Domain" (its copyright file).

Checks (--only correctness), each a failure when it does not hold:
  1. napkin trains a --vocab (10,000) tokenizer twice, with 2 threads and with 1: the same bytes;
  2. `tokenizers` loads napkin's tokenizer.json as is; `tokenizers`' own BpeTrainer (models.BPE with
     pre_tokenizers.ByteLevel(add_prefix_space=False), ByteLevel's 256 characters as the initial alphabet, the
     same vocab and special token) trains a second one on the same documents;
  3. with each of the two: `napkin data encode --tokenizer T --eot` of all documents equals, id for id, the
     special token followed by `tokenizers`' encode(document).ids for each document in order; and decoding
     napkin's ids gives each document back, byte for byte, both through `tokenizers`' decode and through the
     tokenizer.json's vocabulary read here;
  3b. the same with a third tokenizer `tokenizers` trains pre-tokenizing by Llama 3's pattern (a Split by it, then
     ByteLevel without a regex, as Llama 3's tokenizer.json has it);
  4. napkin's tokenizer has bench/bpe_reference.py's merges, all of them, in the same order (SPEC39's rule);
  (tiktoken's ids with napkin's merges are compared too and reported, not required: tiktoken merges by the rank of
  the joined bytes, not of the pair, which can differ from BPE on rare pieces.)

Speed (--only speed), side by side on the whole corpus, --threads (2) threads for each tool that has threads,
each run in its own process (peak memory: that process's maximum resident set, from wait4), best of --repeat:
  encoding MB/s: `napkin data encode --tokenizer` (the whole command: reading files, loading the tokenizer,
     writing the token file) vs tiktoken (an Encoding whose mergeable_ranks are napkin's tokens by id and whose
     pat_str is GPT-2's; encode_ordinary_batch, num_threads) vs `tokenizers` (napkin's tokenizer.json;
     encode_batch on RAYON_NUM_THREADS threads): the peers' times are of the encode call alone, text in memory;
  training time for a --vocab vocabulary: `napkin data bpe` vs `tokenizers`' trainer (train_from_iterator on
     the documents in memory) vs bench/bpe_reference.py (one thread, run once).
Scaling (--only scaling): napkin's training and encoding time at 1x, 2x and 4x, the exponent of a least-squares
line through log(time) against log(bytes) at most 1.1, in two series: distinct text (every 4th book, every 2nd,
all: more distinct words as well) and copies (the corpus given once, twice, 4 times: 11 to 45 MB).

--write-fixtures writes what CI checks offline (tests/e2e/bpe_fixture_test.cpp) into tests/e2e/data/bpe: two
slices of the corpus (kjv.txt, web.txt, about 24 KB each), hf_tokenizer.json (`tokenizers`' trainer on them,
vocab 1000, <|endoftext|>), hf_ids.u16 (its ids for `--eot kjv.txt web.txt`), reference_merges.txt
(bench/bpe_reference.py on them, vocab 600) and reference_ids.u16 (the ids of the same two documents with the
tokenizer made of those merges in napkin's id layout, encoded by `tokenizers`).

Exit status 0 when every check passed (and the scaling exponent and encoding speed met their targets), 1 otherwise.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))
import bpe_reference  # noqa: E402
from bible_corpus import CORPUS_DIR, corpus, ensure_packages  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAPKIN = os.path.join(ROOT, "build", "tools", "napkin")
FIXTURE_DIR = os.path.join(ROOT, "tests", "e2e", "data", "bpe")
SPECIAL = "<|endoftext|>"
TIME = "/usr/bin/time"  # GNU time, for peak memory (apt-get install time)


# ---------------------------------------------------------------------------------------------------------------
# The corpus


def read_texts(paths):
    texts = []
    for p in paths:
        with open(p, encoding="utf-8") as f:
            texts.append(f.read())
    return texts


def total_bytes(paths):
    return sum(os.path.getsize(p) for p in paths)


# ---------------------------------------------------------------------------------------------------------------
# The peers, each run in a process of its own (--worker KIND JSON): they print one JSON line with their seconds


# Llama 3's pre-tokenization pattern (tiktoken's cl100k_base), which its tokenizer.json applies with a Split
# before a ByteLevel pre-tokenizer without its own regex.
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                  r"\s*[\r\n]+|\s+(?!\S)|\s+")


def hf_trainer_tokenizer(vocab, special, pattern="gpt2"):
    """tokenizers' BPE and its trainer, pre-tokenizing by GPT-2's pattern (a ByteLevel pre-tokenizer) or by Llama
    3's (a Split by it, then ByteLevel without a regex, as Llama 3's tokenizer.json does)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    if pattern == "llama3":
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=[special], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    return tok, trainer


def tiktoken_encoding(tokenizer_json):
    """tiktoken with napkin's merges: a napkin-trained tokenizer's ids are BPE ranks (bytes 0-255, merge r is
    256 + r), so mergeable_ranks is its vocabulary, bytes -> id."""
    import tiktoken
    with open(tokenizer_json, encoding="utf-8") as f:
        spec = json.load(f)
    specials = {t["content"]: t["id"] for t in spec.get("added_tokens", [])}
    ranks = {bpe_reference.unspell(token): i for token, i in spec["model"]["vocab"].items() if token not in specials}
    return tiktoken.Encoding("napkin", pat_str=bpe_reference.GPT2_PATTERN, mergeable_ranks=ranks,
                             special_tokens=specials)


def worker(kind, spec):
    paths = spec["docs"]
    texts = read_texts(paths)
    threads = spec.get("threads", 2)
    start = time.perf_counter()
    if kind == "hf_train":
        tok, trainer = hf_trainer_tokenizer(spec["vocab"], SPECIAL, spec.get("pattern", "gpt2"))
        start = time.perf_counter()
        tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
        seconds = time.perf_counter() - start
        tok.save(spec["out"])
    elif kind == "ref_train":
        merges = bpe_reference.train_bpe(texts, spec["vocab"], [SPECIAL])
        seconds = time.perf_counter() - start
        bpe_reference.write_merges(spec["out"], merges)
    elif kind == "hf_encode":
        from tokenizers import Tokenizer
        tok = Tokenizer.from_file(spec["tokenizer"])
        start = time.perf_counter()
        encodings = tok.encode_batch(texts)
        seconds = time.perf_counter() - start
        assert len(encodings) == len(texts)
    elif kind == "tiktoken_encode":
        enc = tiktoken_encoding(spec["tokenizer"])
        start = time.perf_counter()
        ids = enc.encode_ordinary_batch(texts, num_threads=threads)
        seconds = time.perf_counter() - start
        assert len(ids) == len(texts)
    else:
        raise SystemExit(f"unknown worker {kind}")
    print(json.dumps({"seconds": seconds}))


class Measured:
    def __init__(self, seconds, wall, cpu, peak_rss):
        self.seconds, self.wall, self.cpu, self.peak_rss = seconds, wall, cpu, peak_rss

    def cores(self):
        """The process's CPU time over its wall time: how many cores it kept busy on average."""
        return self.cpu / self.wall


def measure(cmd, env=None, what=None):
    """Runs cmd in its own process under GNU time: its wall and CPU seconds and peak resident set (bytes), and the
    time the process reports on its last line ({"seconds": S}) when it prints one, else the wall time. (GNU time
    forks it from a small process: Linux keeps a process's peak across exec, so the peak that wait4 gives a child
    forked from this Python would never be below this Python's own.)"""
    with tempfile.NamedTemporaryFile("r") as rss:
        start = time.perf_counter()
        p = subprocess.run([TIME, "-f", "%M %U %S", "-o", rss.name, *cmd], capture_output=True, text=True, env=env)
        wall = time.perf_counter() - start
        peak_kib, user, system = rss.read().strip().splitlines()[-1].split()
    if p.returncode != 0:
        raise SystemExit(f"{what or cmd[0]} failed (exit {p.returncode}): {' '.join(cmd)[:300]}\n{p.stderr[-3000:]}")
    seconds = wall
    lines = p.stdout.strip().splitlines()
    if lines and lines[-1].startswith("{"):
        seconds = json.loads(lines[-1])["seconds"]
    return Measured(seconds, wall, float(user) + float(system), int(peak_kib) * 1024)


def run_worker(kind, spec, threads):
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="true")
    return measure([sys.executable, os.path.abspath(__file__), "--worker", kind, json.dumps(spec)], env=env,
                   what=kind)


def best(runs):
    return min(runs, key=lambda m: m.seconds)


# ---------------------------------------------------------------------------------------------------------------
# napkin


def napkin_bpe(napkin, docs, vocab, out, threads):
    return measure([napkin, "data", "bpe", *docs, "--vocab", str(vocab), "-o", out, "--special", SPECIAL,
                    "--threads", str(threads)], what="napkin data bpe")


def napkin_encode(napkin, docs, tokenizer, out, threads, eot=True):
    return measure([napkin, "data", "encode", *docs, "-o", out, "--tokenizer", tokenizer, "--threads", str(threads)]
                   + (["--eot"] if eot else []), what="napkin data encode")


def read_ids(path, vocab_size):
    dtype = np.uint16 if vocab_size <= 65536 else np.uint32
    return np.fromfile(path, dtype=dtype).astype(np.int64)


def split_at(ids, eot):
    """Documents of a token file whose every document starts with eot."""
    starts = np.flatnonzero(ids == eot)
    if len(starts) == 0 or starts[0] != 0:
        return None
    return [ids[a + 1:b] for a, b in zip(starts, list(starts[1:]) + [len(ids)])]


def vocab_bytes(tokenizer_json):
    """id -> bytes from a byte-level tokenizer.json's vocabulary and added tokens (independent of tokenizers)."""
    with open(tokenizer_json, encoding="utf-8") as f:
        spec = json.load(f)
    table = {i: bpe_reference.unspell(token) for token, i in spec["model"]["vocab"].items()}
    for t in spec.get("added_tokens", []):
        table[t["id"]] = t["content"].encode("utf-8")
    return table


def napkin_merges(tokenizer_json):
    with open(tokenizer_json, encoding="utf-8") as f:
        merges = json.load(f)["model"]["merges"]
    return [tuple(bpe_reference.unspell(side) for side in (m.split(" ") if isinstance(m, str) else m))
            for m in merges]


# ---------------------------------------------------------------------------------------------------------------
# Checks


class Report:
    def __init__(self):
        self.failures = []
        self.results = {}

    def check(self, ok, what):
        print(f"  {'PASS' if ok else 'FAIL'}  {what}")
        if not ok:
            self.failures.append(what)
        return ok


def check_encoding(report, napkin, docs, texts, tokenizer_json, label, tmp, threads):
    """napkin's --eot encoding of all docs against tokenizers' encode of each; napkin's ids decoded back."""
    from tokenizers import Tokenizer
    hf = Tokenizer.from_file(tokenizer_json)
    eot = hf.token_to_id(SPECIAL)
    out = os.path.join(tmp, f"{label}.tokens")
    napkin_encode(napkin, docs, tokenizer_json, out, threads)
    ids = read_ids(out, hf.get_vocab_size())
    per_doc = split_at(ids, eot)
    report.check(per_doc is not None and len(per_doc) == len(docs),
                 f"{label}: napkin's token file holds {len(docs)} documents, each after {SPECIAL} ({eot})")
    if per_doc is None or len(per_doc) != len(docs):
        return
    expected = hf.encode_batch(texts)
    differ = [i for i, (got, want) in enumerate(zip(per_doc, expected)) if got.tolist() != want.ids]
    report.check(not differ, f"{label}: napkin's ids equal tokenizers' for {len(docs) - len(differ)}/{len(docs)} "
                             f"documents ({len(ids):,} tokens)"
                 + (f"; first differing: {os.path.relpath(docs[differ[0]], CORPUS_DIR)}" if differ else ""))
    table = vocab_bytes(tokenizer_json)
    texts_bytes = [t.encode("utf-8") for t in texts]
    bad_vocab = [i for i, d in enumerate(per_doc) if b"".join(table[t] for t in d.tolist()) != texts_bytes[i]]
    decoded = hf.decode_batch([d.tolist() for d in per_doc], skip_special_tokens=False)
    bad_hf = [i for i, d in enumerate(decoded) if d != texts[i]]
    report.check(not bad_vocab and not bad_hf,
                 f"{label}: decode(encode(x)) == x for every document (tokenizers' decode: {len(docs) - len(bad_hf)}"
                 f"/{len(docs)}, the vocabulary's bytes: {len(docs) - len(bad_vocab)}/{len(docs)})")
    report.results[f"{label}_tokens"] = int(len(ids))
    return per_doc


def correctness(report, args, docs, tmp):
    texts = read_texts(docs)
    print(f"\ncorrectness: {len(docs)} documents, {total_bytes(docs) / 1e6:.2f} MB, vocab {args.vocab}")
    napkin_json = os.path.join(tmp, "napkin.json")
    again = os.path.join(tmp, "napkin-1thread.json")
    napkin_bpe(args.napkin, docs, args.vocab, napkin_json, args.threads)
    napkin_bpe(args.napkin, docs, args.vocab, again, 1)
    with open(napkin_json, "rb") as a, open(again, "rb") as b:
        report.check(a.read() == b.read(), f"napkin data bpe is deterministic: {args.threads} threads and 1 thread "
                                           "write the same tokenizer.json")
    from tokenizers import Tokenizer
    try:
        loaded = Tokenizer.from_file(napkin_json)
        merges = len(napkin_merges(napkin_json))
        ok = merges == args.vocab - 257 and loaded.token_to_id(SPECIAL) == loaded.get_vocab_size() - 1
        print(f"    napkin's tokenizer.json: {merges} merges, {loaded.get_vocab_size()} tokens (merges that make the "
              "same bytes share an id)")
    except Exception as e:  # noqa: BLE001 (any refusal is the finding)
        print(f"    tokenizers refused it: {e}")
        ok = False
    report.check(ok, f"tokenizers loads napkin's tokenizer.json as is ({args.vocab} - 257 merges, {SPECIAL} last)")
    if not ok:
        return
    hf_json = os.path.join(tmp, "hf.json")
    run_worker("hf_train", {"docs": docs, "vocab": args.vocab, "out": hf_json}, args.threads)
    common = len(set(napkin_merges(napkin_json)) & set(napkin_merges(hf_json)))
    print(f"    tokenizers' trainer: {common} of its merges are napkin's too (ties are broken differently)")

    napkin_docs = check_encoding(report, args.napkin, docs, texts, napkin_json, "napkin-trained", tmp, args.threads)
    check_encoding(report, args.napkin, docs, texts, hf_json, "tokenizers-trained", tmp, args.threads)
    llama3_json = os.path.join(tmp, "hf-llama3.json")
    run_worker("hf_train", {"docs": docs, "vocab": args.vocab, "out": llama3_json, "pattern": "llama3"}, args.threads)
    check_encoding(report, args.napkin, docs, texts, llama3_json, "tokenizers-trained-llama3", tmp, args.threads)
    if napkin_docs is not None:
        enc = tiktoken_encoding(napkin_json)
        tk = enc.encode_ordinary_batch(texts, num_threads=args.threads)
        same = sum(1 for a, b in zip(napkin_docs, tk) if a.tolist() == b)
        print(f"    tiktoken with napkin's merges: the same ids for {same}/{len(docs)} documents (not required)")
        report.results["tiktoken_same_documents"] = same

    ref_txt = os.path.join(tmp, "reference_merges.txt")
    ref = run_worker("ref_train", {"docs": docs, "vocab": args.vocab, "out": ref_txt}, 1)
    want, got = bpe_reference.read_merges(ref_txt), napkin_merges(napkin_json)
    first = next((i for i, (a, b) in enumerate(zip(want, got)) if a != b), None)
    report.check(want == got, f"napkin's merges equal bench/bpe_reference.py's, all {len(want)} in order "
                              f"(the reference took {ref.seconds:.1f} s)"
                 + (f"; first difference at rank {first}: reference {want[first]} napkin {got[first]}"
                    if first is not None else "" if len(want) == len(got) else f"; {len(got)} merges from napkin"))


# ---------------------------------------------------------------------------------------------------------------
# Speed and scaling


def mb(x):
    return f"{x / 2**20:8.1f}"


def speed(report, args, docs, tmp):
    size = total_bytes(docs)
    print(f"\nspeed: {len(docs)} documents, {size / 1e6:.2f} MB, {args.threads} threads, best of {args.repeat}")
    napkin_json = os.path.join(tmp, "speed-napkin.json")
    hf_json = os.path.join(tmp, "speed-hf.json")
    train = {}
    train["napkin data bpe"] = best([napkin_bpe(args.napkin, docs, args.vocab, napkin_json, args.threads)
                                     for _ in range(args.repeat)])
    train["tokenizers BpeTrainer"] = best([run_worker("hf_train", {"docs": docs, "vocab": args.vocab, "out": hf_json},
                                                      args.threads) for _ in range(args.repeat)])
    if not args.skip_reference:
        train["bpe_reference.py (1 thread)"] = run_worker(
            "ref_train", {"docs": docs, "vocab": args.vocab, "out": os.path.join(tmp, "speed-ref.txt")}, 1)
    out = os.path.join(tmp, "speed.tokens")
    enc = {}
    enc["napkin data encode"] = best([napkin_encode(args.napkin, docs, napkin_json, out, args.threads, eot=False)
                                      for _ in range(args.repeat)])
    spec = {"docs": docs, "tokenizer": napkin_json, "threads": args.threads}
    enc["tiktoken"] = best([run_worker("tiktoken_encode", spec, args.threads) for _ in range(args.repeat)])
    enc["tokenizers encode_batch"] = best([run_worker("hf_encode", spec, args.threads) for _ in range(args.repeat)])

    print("  (cores: the process's CPU time over its wall time, imports and loading included)")
    print(f"\n  training, vocab {args.vocab}          seconds   peak MiB   cores   vs napkin")
    base = train["napkin data bpe"].seconds
    for name, m in train.items():
        print(f"  {name:32s} {m.seconds:8.2f} {mb(m.peak_rss)} {m.cores():7.2f}   {m.seconds / base:6.2f}x")
    print(f"\n  encoding (napkin's tokenizer)       MB/s    seconds   peak MiB   cores   napkin's speed / its")
    napkin_speed = size / 1e6 / enc["napkin data encode"].seconds
    for name, m in enc.items():
        print(f"  {name:32s} {size / 1e6 / m.seconds:7.1f} {m.seconds:9.2f} {mb(m.peak_rss)} {m.cores():7.2f}   "
              f"{napkin_speed / (size / 1e6 / m.seconds):6.2f}x")
    for name in ("tiktoken", "tokenizers encode_batch"):
        report.check(enc[name].seconds >= enc["napkin data encode"].seconds,
                     f"napkin encodes at least as fast as {name}")
    report.results["speed"] = {
        "corpus_bytes": size, "threads": args.threads, "vocab": args.vocab,
        "training": {k: {"seconds": m.seconds, "process_seconds": m.wall, "process_cpu_seconds": m.cpu,
                         "peak_rss_bytes": m.peak_rss} for k, m in train.items()},
        "encoding": {k: {"seconds": m.seconds, "process_seconds": m.wall, "process_cpu_seconds": m.cpu,
                         "mb_per_s": size / 1e6 / m.seconds, "peak_rss_bytes": m.peak_rss} for k, m in enc.items()},
    }


def exponent(sizes, seconds):
    xs, ys = np.log(np.array(sizes, float)), np.log(np.array(seconds, float))
    return float(np.polyfit(xs, ys, 1)[0])


def scaling(report, args, docs, tmp):
    """napkin's training and encoding time at 1x, 2x and 4x, in two series: distinct text (every 4th book, every
    2nd, all: more distinct words too) and copies (the corpus once, twice, four times: the same distinct words,
    each count multiplied, so only what is per byte grows)."""
    series = [("distinct text: every 4th book, every 2nd, all", [docs[::4], docs[::2], docs]),
              ("copies: the corpus once, twice, 4 times", [docs, docs * 2, docs * 4])]
    print(f"\nscaling: napkin at 1x, 2x, 4x, {args.threads} threads, best of {args.repeat}")
    report.results["scaling"] = []
    for title, parts in series:
        print(f"  {title}\n    corpus MB   train s   peak MiB   encode s   peak MiB")
        rows = []
        for i, part in enumerate(parts):
            json_path = os.path.join(tmp, f"scale{i}.json")
            t = best([napkin_bpe(args.napkin, part, args.vocab, json_path, args.threads) for _ in range(args.repeat)])
            e = best([napkin_encode(args.napkin, part, json_path, os.path.join(tmp, "scale.tokens"), args.threads,
                                    eot=False) for _ in range(args.repeat)])
            rows.append((total_bytes(part), t, e))
            print(f"    {total_bytes(part) / 1e6:9.2f} {t.seconds:9.2f} {mb(t.peak_rss)} {e.seconds:10.2f} "
                  f"{mb(e.peak_rss)}")
        sizes = [r[0] for r in rows]
        k_train = exponent(sizes, [r[1].seconds for r in rows])
        k_encode = exponent(sizes, [r[2].seconds for r in rows])
        report.check(k_train <= 1.1, f"{title.split(':')[0]}: training time grows as size^{k_train:.2f} (at most 1.1)")
        report.check(k_encode <= 1.1, f"{title.split(':')[0]}: encoding time grows as size^{k_encode:.2f} "
                                      "(at most 1.1)")
        report.results["scaling"].append({
            "series": title, "bytes": sizes, "train_seconds": [r[1].seconds for r in rows],
            "train_peak_rss_bytes": [r[1].peak_rss for r in rows], "encode_seconds": [r[2].seconds for r in rows],
            "encode_peak_rss_bytes": [r[2].peak_rss for r in rows], "train_exponent": k_train,
            "encode_exponent": k_encode})


# ---------------------------------------------------------------------------------------------------------------
# CI fixtures


FIXTURE_SLICE_BYTES = 24_000
FIXTURE_HF_VOCAB = 1000
FIXTURE_REFERENCE_VOCAB = 600


def fixture_slice(path, start_fraction):
    """About FIXTURE_SLICE_BYTES of whole lines from `path`, starting at a line near start_fraction of it."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines(keepends=True)
    i = int(len(lines) * start_fraction)
    out = []
    while i < len(lines) and sum(len(s.encode()) for s in out) < FIXTURE_SLICE_BYTES:
        out.append(lines[i])
        i += 1
    return "".join(out)


def hf_ids_with_eot(tokenizer, texts):
    eot = tokenizer.token_to_id(SPECIAL)
    ids = []
    for text in texts:
        ids += [eot] + tokenizer.encode(text).ids
    return np.array(ids, dtype="<u2")


def napkin_layout_tokenizer(merges):
    """The tokenizer napkin's training makes of `merges` (SPEC39's id layout: bytes, then merge r's bytes as the
    next id, unless an earlier merge made the same bytes), built with tokenizers' own BPE."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    vocab = {bpe_reference.spell(bytes([b])): b for b in range(256)}
    for left, right in merges:
        vocab.setdefault(bpe_reference.spell(left + right), len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[(bpe_reference.spell(a), bpe_reference.spell(b))
                                                    for a, b in merges]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(SPECIAL, special=True)])
    assert tok.token_to_id(SPECIAL) == len(vocab)
    return tok


def write_fixtures(docs, corpus_dir):
    from tokenizers import Tokenizer
    os.makedirs(FIXTURE_DIR, exist_ok=True)
    kjv = next(p for p in docs if "/kjv/" in p and p.endswith("Genesis.txt"))
    web = next(p for p in docs if "/web/" in p and "Psalms" in p)
    texts = [fixture_slice(kjv, 0.0), fixture_slice(web, 0.4)]
    names = ["kjv.txt", "web.txt"]
    for name, text in zip(names, texts):
        with open(os.path.join(FIXTURE_DIR, name), "w", encoding="utf-8") as f:
            f.write(text)
    tok, trainer = hf_trainer_tokenizer(FIXTURE_HF_VOCAB, SPECIAL)
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    hf_json = os.path.join(FIXTURE_DIR, "hf_tokenizer.json")
    tok.save(hf_json, pretty=False)
    hf_ids_with_eot(Tokenizer.from_file(hf_json), texts).tofile(os.path.join(FIXTURE_DIR, "hf_ids.u16"))
    tok, trainer = hf_trainer_tokenizer(FIXTURE_HF_VOCAB, SPECIAL, "llama3")
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    llama3_json = os.path.join(FIXTURE_DIR, "llama3_tokenizer.json")
    tok.save(llama3_json, pretty=False)
    hf_ids_with_eot(Tokenizer.from_file(llama3_json), texts).tofile(os.path.join(FIXTURE_DIR, "llama3_ids.u16"))
    merges = bpe_reference.train_bpe(texts, FIXTURE_REFERENCE_VOCAB, [SPECIAL])
    bpe_reference.write_merges(os.path.join(FIXTURE_DIR, "reference_merges.txt"), merges)
    hf_ids_with_eot(napkin_layout_tokenizer(merges), texts).tofile(os.path.join(FIXTURE_DIR, "reference_ids.u16"))
    import tokenizers
    with open(os.path.join(corpus_dir, "SOURCE.txt")) as f:
        sources = f.read().split("\n", 1)[1]
    with open(os.path.join(FIXTURE_DIR, "SOURCE.txt"), "w") as f:
        f.write(f"Written by bench/tokenizer.py --write-fixtures (tokenizers {tokenizers.__version__}).\n"
                f"kjv.txt: the start of {os.path.relpath(kjv, corpus_dir)} (King James Version, public domain)\n"
                f"web.txt: a slice of {os.path.relpath(web, corpus_dir)} (World English Bible, public domain)\n"
                f"{sources}")
    for name in sorted(os.listdir(FIXTURE_DIR)):
        path = os.path.join(FIXTURE_DIR, name)
        print(f"  {os.path.relpath(path, ROOT)}: {os.path.getsize(path):,} bytes")


# ---------------------------------------------------------------------------------------------------------------


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        worker(sys.argv[2], json.loads(sys.argv[3]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--napkin", default=NAPKIN, help="the napkin binary (default: build/tools/napkin)")
    ap.add_argument("--only", default="correctness,speed,scaling", help="a comma-separated subset of the parts")
    ap.add_argument("--vocab", type=int, default=10000, help="the trained vocabulary (256 + merges + 1 special)")
    ap.add_argument("--threads", type=int, default=2, help="threads of every tool that has threads")
    ap.add_argument("--repeat", type=int, default=3, help="timed runs of each, the best kept")
    ap.add_argument("--skip-reference", action="store_true", 
                    help="speed: do not time bpe_reference.py (about a minute)")
    ap.add_argument("--corpus-dir", default=CORPUS_DIR, help="where the corpus is extracted (once)")
    ap.add_argument("--json", help="write the results there")
    ap.add_argument("--write-fixtures", action="store_true", help="write tests/e2e/data/bpe and stop")
    args = ap.parse_args()

    ensure_packages(["time"])
    docs = corpus(args.corpus_dir)
    with open(os.path.join(args.corpus_dir, "SOURCE.txt")) as f:
        print(f"corpus: {len(docs)} documents, {total_bytes(docs) / 1e6:.2f} MB in {args.corpus_dir}\n"
              + "".join("  " + line for line in f.readlines()[1:]), end="")
    if args.write_fixtures:
        write_fixtures(docs, args.corpus_dir)
        return 0
    if not os.access(args.napkin, os.X_OK):
        raise SystemExit(f"{args.napkin} not found: build it (ninja -C build napkin) or pass --napkin")
    report = Report()
    only = set(args.only.split(","))
    with tempfile.TemporaryDirectory(prefix="napkin-bpe-bench-") as tmp:
        if "correctness" in only:
            correctness(report, args, docs, tmp)
        if "speed" in only:
            speed(report, args, docs, tmp)
        if "scaling" in only:
            scaling(report, args, docs, tmp)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(report.results, failures=report.failures), f, indent=1)
    print(f"\n{len(report.failures)} failed" + "".join(f"\n  {f}" for f in report.failures))
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
