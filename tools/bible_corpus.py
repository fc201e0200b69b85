#!/usr/bin/env python3
"""A real corpus of public-domain English from Debian packages, each book one document, one file: the King James
Version (bible-kjv-text, printed by bible-kjv's `bible`: 66 books, 4.3 MB of ASCII; the translation of 1611 is out
of copyright, as the package's copyright file says) and the World English Bible with Deuterocanon (sword-text-web,
printed by diatheke as plain text: 79 documents, 7.0 MB of UTF-8; "The World English Bible is in the Public Domain",
its copyright file). 11.28 MB in all.

    python3 tools/bible_corpus.py [--dir DIR]    # installs the packages when missing, extracts once, prints the paths

tools/bpe_data.sh trains models/llama-bpe.yaml's tokenizer on it and encodes it; bench/tokenizer.py measures
napkin's BPE against Hugging Face tokenizers and tiktoken on it. Standard library only (the system python3).
"""
import argparse
import os
import re
import shutil
import subprocess
import sys

CORPUS_DIR = os.path.join(os.path.expanduser("~"), ".cache", "napkin", "bpe-corpus")
CORPUS_VERSION = "1"  # bump when the extraction changes: the cached corpus is then made anew
PACKAGES = ["bible-kjv", "bible-kjv-text", "sword-text-web", "diatheke"]
WEB_MODULE = "engWEB2015eb"


def ensure_packages(extra=()):
    """apt-get installs the packages the corpus comes from (and `extra`) when they are missing."""
    missing = [p for p in PACKAGES + list(extra)
               if "install ok installed" not in subprocess.run(["dpkg-query", "-W", "-f=${Status}", p],
                                                                capture_output=True, text=True).stdout]
    if not missing:
        return
    sudo = [] if os.geteuid() == 0 else ["sudo"]
    print(f"corpus: apt-get install {' '.join(missing)}", file=sys.stderr)
    subprocess.run(sudo + ["apt-get", "update", "-qq"], check=True)
    subprocess.run(sudo + ["apt-get", "install", "-y", "-qq", "--no-install-recommends"] + missing, check=True,
                   env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"), stdout=subprocess.DEVNULL)


def package_version(name):
    return subprocess.run(["dpkg-query", "-W", "-f=${Version}", name], capture_output=True, text=True).stdout


def kjv_books():
    """(name, text) of the 66 books, as bible-kjv's `bible` prints them unwrapped: a "Book N" line before each
    chapter, a verse a line."""
    text = subprocess.run(["bible", "-l0", "Gen1:1-Rev22:21"], capture_output=True, text=True, check=True).stdout
    books = []
    for chapter in re.split(r"\n(?=[1-3]? ?[A-Z][A-Za-z ]+ \d+\n\n)", text.strip("\n")):
        name = re.match(r"([1-3]? ?[A-Z][A-Za-z ]+) (\d+)\n", chapter).group(1)
        if not books or books[-1][0] != name:
            books.append((name, []))
        books[-1][1].append(chapter)
    return [(name, "\n".join(chapters) + "\n") for name, chapters in books]


def web_books():
    """(name, text) of the World English Bible's books as diatheke prints them in plain text: "Book C:V: text" a
    verse, poetry on further lines (the module's name after the last verse is dropped)."""
    text = subprocess.run(["diatheke", "-b", WEB_MODULE, "-f", "plain", "-k", "Genesis 1:1-Revelation 22:21"],
                          capture_output=True, text=True, check=True).stdout
    text = text[:text.rindex(f"({WEB_MODULE})")]
    books = []
    for line in text.splitlines(keepends=True):
        m = re.match(r"\s*([1-4I]*\s?[A-Z][A-Za-z ]*?) \d+:\d+: ", line)
        if m and (not books or books[-1][0] != m.group(1)):
            books.append((m.group(1), []))
        books[-1][1].append(line)
    return [(name, "".join(lines)) for name, lines in books]


def corpus(directory=CORPUS_DIR):
    """The documents' paths (kjv/ then web/, in canonical book order), extracted once into `directory`."""
    stamp = os.path.join(directory, "SOURCE.txt")
    if os.path.exists(stamp) and open(stamp).readline().strip() == f"corpus version {CORPUS_VERSION}":
        with open(os.path.join(directory, "FILES.txt")) as f:
            return [os.path.join(directory, line.strip()) for line in f if line.strip()]
    shutil.rmtree(directory, ignore_errors=True)
    paths = []
    for source, books in (("kjv", kjv_books()), ("web", web_books())):
        os.makedirs(os.path.join(directory, source))
        for i, (name, text) in enumerate(books):
            path = os.path.join(source, f"{i + 1:02d}-{name.replace(' ', '_')}.txt")
            with open(os.path.join(directory, path), "w", encoding="utf-8") as f:
                f.write(text)
            paths.append(path)
    with open(os.path.join(directory, "FILES.txt"), "w") as f:
        f.write("".join(p + "\n" for p in paths))
    with open(stamp, "w") as f:
        f.write(f"corpus version {CORPUS_VERSION}\n"
                f"kjv/: King James Version (1611, public domain), Debian bible-kjv-text "
                f"{package_version('bible-kjv-text')}, printed by `bible -l0 Gen1:1-Rev22:21` (bible-kjv)\n"
                f"web/: World English Bible with Deuterocanon (public domain), Debian sword-text-web "
                f"{package_version('sword-text-web')}, printed by `diatheke -b {WEB_MODULE} -f plain`\n")
    return [os.path.join(directory, p) for p in paths]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default=CORPUS_DIR, help="where the corpus is extracted (once)")
    args = ap.parse_args()
    ensure_packages()
    for path in corpus(args.dir):
        print(path)


if __name__ == "__main__":
    main()
