#!/usr/bin/env bash
# Runs every test: the doctest suites through ctest (unit, golden, error corpus),
# then a short libFuzzer run of the frontend (NAPKIN_FUZZ_SECONDS, default 60;
# 0 skips it). Expects tools/setup.sh to have run.
set -euo pipefail
cd "$(dirname "$0")/.."

ninja -C build -j2 | grep -v '^\[' || true
ctest --test-dir build --output-on-failure -j2

seconds="${NAPKIN_FUZZ_SECONDS:-60}"
if [ "$seconds" -gt 0 ]; then
  CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DNAPKIN_FUZZ=ON -DNAPKIN_TESTS=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  ninja -C build-fuzz -j2 napkin_frontend_fuzz | grep -v '^\[' || true
  corpus=$(mktemp -d)
  cp tests/fuzz/corpus/* "$corpus"/
  echo "fuzzing the frontend for ${seconds}s"
  # -timeout=60: a legal 10,000-block model takes ~40 s to lower under ASan; slower than that is a hang.
  build-fuzz/tests/fuzz/napkin_frontend_fuzz "$corpus" -dict=tests/fuzz/napkin.dict -max_total_time="$seconds" \
    -timeout=60 -rss_limit_mb=4096 -print_final_stats=1 2>&1 | tail -n 12
  rm -rf "$corpus"
fi
