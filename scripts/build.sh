#!/usr/bin/env bash
# Configures (once) and builds into build/ with two jobs, warnings as errors.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
if [ ! -f build/CMakeCache.txt ]; then
  generator=()
  command -v ninja >/dev/null && generator=(-G Ninja)
  cmake -S . -B build "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTRAINER_WERROR=ON >/dev/null
fi
cmake --build build -j "${TRAINER_BUILD_JOBS:-2}"
