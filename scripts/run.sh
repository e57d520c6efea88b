#!/usr/bin/env bash
# Quick start: installs what is missing, builds, then trains a recipe.
#   scripts/run.sh configs/quickstart.toml [--set key=value]...
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
if [ $# -lt 1 ]; then
  echo "usage: scripts/run.sh RECIPE [trainer run options]" >&2
  exit 2
fi
"$root/scripts/setup.sh"
"$root/scripts/build.sh" >/dev/null
exec "$root/build/bin/trainer" run "$@"
