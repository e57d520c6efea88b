#!/usr/bin/env bash
# Installs what the build needs from Debian's packages, where it is missing.
# Idempotent; run as root (or with sudo available).
set -euo pipefail
packages=(g++ cmake ninja-build libtorch-dev libgloo-dev libboost-dev libtomlplusplus-dev
          libspdlog-dev libgtest-dev libcli11-dev libxxhash-dev nlohmann-json3-dev
          libpcre2-dev libutf8proc-dev pkg-config curl)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "setup: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
# A fresh machine may have stale package lists: refresh once if the install fails.
$sudo apt-get install -y -q "${missing[@]}" >/dev/null ||
  { $sudo apt-get update -q >/dev/null && $sudo apt-get install -y -q "${missing[@]}" >/dev/null; }
