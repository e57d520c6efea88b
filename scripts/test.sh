#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test (GoogleTest via CTest).
#   scripts/test.sh [ctest options, e.g. -R Recipe or -L gpu]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
"$root/scripts/build.sh"
cd "$root/build"
ctest --output-on-failure -j "${TRAINER_TEST_JOBS:-2}" "$@"
