#!/usr/bin/env bash
# Installs what napkin needs from Debian 12 (only what is missing) and builds
# `napkin` in Release under build/. Idempotent and quick when everything is present.
set -euo pipefail
cd "$(dirname "$0")/.."

# What building napkin and running the main job need; doctest because the
# build is configured with its tests (tools/test.sh installs what only the
# tests need: clang for the fuzz build, Chromium for the browser test).
source tools/install_packages.sh
install_missing_packages cmake ninja-build g++ ccache \
  libyaml-cpp-dev doctest-dev libcli11-dev libfmt-dev nlohmann-json3-dev llvm-19-dev libdnnl-dev \
  openmpi-bin  # mpirun and libmpi for data-parallel runs; trainers dlopen libmpi only under mpirun

# Only what the main job needs: `napkin` and what a trainer it builds links
# (the runtime). The test suite is built by tools/test.sh, which needs it.
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
ninja -C build -j2 napkin | { grep -v '^\[' || true; }  # grep alone may find nothing; a failed build stops here
test -x build/tools/napkin

# The built-in GPT's training data (models/gpt.yaml reads data/tiny.u16):
# byte-level tokens of this repository's own documentation, so the data is
# ours to use and needs no download. Made once; delete it to remake.
if [ ! -f data/tiny.u16 ]; then
  build/tools/napkin data encode README.md docs/*.md -o data/tiny.u16
fi
