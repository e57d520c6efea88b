#!/usr/bin/env bash
# Stages what the GPU machine lacks beyond ../shared/device/stage-deps.sh's
# header-only libraries: the tokenizer's PCRE2 and utf8proc (headers and
# shared libraries from this Debian machine, into .deps/include and .deps/lib,
# found there through CMAKE_PREFIX_PATH and the build tree's RPATH), and
# Qwen3's tokenizer files in .cache/tokenizers (the tokenizer tests and the
# tok and tokb stages). Run from the project root after stage-deps.sh; carry
# ".deps" and ".cache/tokenizers".
set -euo pipefail
root=$(git rev-parse --show-toplevel)
multiarch=/usr/lib/$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)
mkdir -p "$root/.deps/include" "$root/.deps/lib"
for header in pcre2.h utf8proc.h; do
  [ -f "/usr/include/$header" ] || { echo "missing /usr/include/$header (apt-get install libpcre2-dev libutf8proc-dev)" >&2; exit 1; }
  cp "/usr/include/$header" "$root/.deps/include/"
done
for lib in libpcre2-8 libutf8proc; do
  # The real file under its soname and the unversioned link name the linker looks for.
  real=$(readlink -f "$multiarch/$lib.so")
  soname=$(objdump -p "$real" | awk '/SONAME/ {print $2}')
  cp "$real" "$root/.deps/lib/$soname"
  ln -sf "$soname" "$root/.deps/lib/$lib.so"
done
if [ ! -f "$root/.cache/tokenizers/qwen3/tokenizer.json" ]; then
  bash "$root/scripts/fetch-tokenizer.sh"
fi
echo "staged: $(du -sh "$root/.deps" | cut -f1) in .deps (pcre2, utf8proc added); carry [\".deps\", \".cache/tokenizers\"]"
