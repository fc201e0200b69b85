#!/usr/bin/env bash
# Installs what napkin needs from Debian 12 (only what is missing) and builds it
# in Release under build/. Idempotent and quick when everything is present.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(cmake ninja-build g++ ccache clang libclang-rt-14-dev
          libyaml-cpp-dev doctest-dev libcli11-dev libfmt-dev nlohmann-json3-dev llvm-19-dev libdnnl-dev
          openmpi-bin)  # mpirun and libmpi for the data-parallel tests; trainers dlopen libmpi only under mpirun
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "napkin setup: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Headless Chromium for the test that renders `napkin report --html` in a
# real browser. Optional: where it cannot be installed, that test says it is
# skipped and everything else runs.
if ! command -v chromium >/dev/null 2>&1; then
  echo "napkin setup: installing chromium (for the HTML report's browser test)"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
      chromium >/dev/null; } || echo "napkin setup: chromium could not be installed; the browser test will be skipped"
fi

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
ninja -C build -j2 | grep -v '^\[' || true
test -x build/tools/napkin

# The built-in GPT's training data (models/gpt.yaml reads data/tiny.u16):
# byte-level tokens of this repository's own documentation, so the data is
# ours to use and needs no download. Made once; delete it to remake.
if [ ! -f data/tiny.u16 ]; then
  build/tools/napkin data encode README.md docs/*.md -o data/tiny.u16
fi
