#!/usr/bin/env bash
# How long the README's first command takes to reach its first training step
# from a fresh clone, without ccache (Debian packages already installed): the
# build setup.sh does, `napkin data encode`, then `napkin train models/gpt.yaml`
# until its first step line. Run it alone on a quiet machine.
#
#   bash bench/fresh_setup_time.sh [COMMIT ...]     (default: HEAD; e.g. 851dbcc HEAD)
#
# A commit before issue 36 built everything in setup (the tests too); this
# script builds what that commit's tools/setup.sh built: all targets when its
# setup.sh runs a plain `ninja -C build`, else `napkin` alone.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export CCACHE_DISABLE=1
for commit in "${@:-HEAD}"; do
  dir="$work/$commit"
  git clone -q "$repo" "$dir"
  git -C "$dir" checkout -q "$commit"
  cd "$dir"
  target=napkin
  grep -q "ninja -C build -j2 napkin" tools/setup.sh || target=all
  start=$(date +%s.%N)
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
  ninja -C build -j2 "$target" >/dev/null 2>&1
  mkdir -p data && build/tools/napkin data encode README.md docs/*.md -o data/tiny.u16 >/dev/null
  built=$(date +%s.%N)
  first=""
  while read -r line; do
    case "$line" in step*) first=$(date +%s.%N); break ;; esac
  done < <(XDG_CACHE_HOME="$dir/cache" timeout 900 build/tools/napkin train models/gpt.yaml -- --steps 50 --log-every 1 \
             --checkpoint-dir "$dir/ck" --metrics "$dir/m.jsonl" 2>&1)
  pkill -f -- "$dir/" || true  # the trainer, still running its 50 steps
  printf '%s: built (%s) in %.1f s, first step line at %.1f s\n' "$commit" "$target" \
    "$(echo "$built - $start" | bc)" "$(echo "${first:-$built} - $start" | bc)"
done
