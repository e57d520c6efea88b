#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test (GoogleTest via CTest).
#   scripts/test.sh [ctest options, e.g. -R Recipe or -L '^gpu$']
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
# The tokenizer tests need a real tokenizer file; without the network they fail saying so.
"$root/scripts/fetch-tokenizer.sh" || echo "test.sh: could not fetch the Qwen3 tokenizer (see scripts/fetch-tokenizer.sh)" >&2
# The HTML report's test loads it in headless Chromium.
if ! command -v chromium >/dev/null; then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q chromium >/dev/null ||
    { $sudo apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q chromium >/dev/null; }
fi
"$root/scripts/build.sh"
cd "$root/build"
status=0
ctest --output-on-failure -j "${TRAINER_TEST_JOBS:-2}" "$@" | tee "$root/build/ctest-output.log" || status=1
# ctest counts a skipped test as passed: name them.
skipped=$(grep -E '\*\*\*Skipped|Not Run' "$root/build/ctest-output.log" | sed -E 's/.*Test +#[0-9]+: ([^ ]+).*/\1/' || true)
echo "test.sh: $(printf '%s' "$skipped" | grep -c . || true) test(s) skipped${skipped:+: $(echo $skipped)}"
exit $status
