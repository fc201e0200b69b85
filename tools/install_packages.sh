#!/usr/bin/env bash
# Installs the Debian 12 packages named as arguments that are not installed
# yet (one apt-get for all of them; nothing when all are present). Sourced by
# tools/setup.sh (what napkin needs) and tools/test.sh (what only the tests need).
set -euo pipefail

install_missing_packages() {
  local missing=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  ((${#missing[@]})) || return 0
  echo "napkin: installing ${missing[*]}"
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}
