#!/usr/bin/env bash
# Runs every test: builds everything setup.sh left out (the test suite, the
# benchmarks' executables), runs the doctest suites through ctest (unit,
# golden, error corpus), then a short libFuzzer run of the frontend
# (NAPKIN_FUZZ_SECONDS, default 60; 0 skips it). Expects tools/setup.sh to have run.
set -euo pipefail
cd "$(dirname "$0")/.."

# What only the tests need: clang and its sanitizer runtime for the fuzz
# build, and headless Chromium for the test that renders `napkin report
# --html` in a real browser. Chromium is optional: where it cannot be
# installed, that test says it is skipped and everything else runs.
source tools/install_packages.sh
install_missing_packages clang libclang-rt-14-dev
if ! command -v chromium >/dev/null 2>&1; then
  install_missing_packages chromium ||
    echo "napkin test: chromium could not be installed; the browser test will be skipped"
fi

ninja -C build -j2 | { grep -v '^\[' || true; }  # grep alone may find nothing; a failed build stops here
ctest --test-dir build --output-on-failure -j2

seconds="${NAPKIN_FUZZ_SECONDS:-60}"
if [ "$seconds" -gt 0 ]; then
  CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DNAPKIN_FUZZ=ON -DNAPKIN_TESTS=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  ninja -C build-fuzz -j2 napkin_frontend_fuzz | { grep -v '^\[' || true; }
  corpus=$(mktemp -d)
  cp tests/fuzz/corpus/* "$corpus"/
  echo "fuzzing the frontend for ${seconds}s"
  # -timeout=60: a legal 10,000-block model takes ~40 s to lower under ASan; slower than that is a hang.
  build-fuzz/tests/fuzz/napkin_frontend_fuzz "$corpus" -dict=tests/fuzz/napkin.dict -max_total_time="$seconds" \
    -timeout=60 -rss_limit_mb=4096 -print_final_stats=1 2>&1 | tail -n 12
  rm -rf "$corpus"
fi
