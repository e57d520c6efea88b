#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz with clang (ASan + UBSan) into
# build-fuzz/ and runs each for FUZZ_SECONDS (default 60) from its seed
# corpus in tests/fuzz/corpus/<target>; any crash, leak, hang or UB report
# fails the script and leaves the input in build-fuzz/crash-<target>-*.
# Found inputs worth keeping go into the seed corpus as regression cases.
# The mutations follow FUZZ_SEED (default 1), so a run repeats the inputs of
# an earlier one as far as it gets (CI is a regression gate that way);
# FUZZ_SEED=0 takes a fresh random seed each run, for exploring.
#   scripts/fuzz.sh [target...]     (targets: safetensors metrics manifest recipe jsonl-record hf-config
#                                     tokenizer tokenizer-json token-rows toml)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
if ! command -v clang++ >/dev/null || ! dpkg-query -W -f='${Status}' libclang-rt-14-dev 2>/dev/null | grep -q "ok installed"; then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get install -y -q clang libclang-rt-14-dev libfmt-dev libxxhash-dev nlohmann-json3-dev libpcre2-dev libutf8proc-dev >/dev/null ||
    { $sudo apt-get update -q >/dev/null && $sudo apt-get install -y -q clang libclang-rt-14-dev libfmt-dev libxxhash-dev nlohmann-json3-dev libpcre2-dev libutf8proc-dev >/dev/null; }
fi
seconds=${FUZZ_SECONDS:-60}
out=build-fuzz
mkdir -p "$out"
flags=(-std=c++17 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -DFMT_HEADER_ONLY
       -Icore/include -Icore/src)
declare -A sources=([safetensors]="core/src/util/SafetensorsHeader.cpp" [metrics]="core/src/tools/Metrics.cpp"
                    [manifest]="core/src/checkpoint/Manifest.cpp core/src/util/Hash.cpp"
                    [recipe]="core/src/recipe/Recipe.cpp core/src/recipe/TomlText.cpp core/src/recipe/CoreSections.cpp core/src/recipe/Options.cpp core/src/plugin/PluginRegistry.cpp"
                    [jsonl-record]="datasets/jsonl/JsonlRecord.cpp core/src/text/Tokenizer.cpp"
                    [hf-config]="models/qwen2/Qwen2Config.cpp core/src/recipe/Options.cpp"
                    [tokenizer]="core/src/text/Tokenizer.cpp" [tokenizer-json]="core/src/text/Tokenizer.cpp"
                    [token-rows]="core/src/tools/TokenRows.cpp" [toml]="core/src/recipe/TomlText.cpp")
declare -A names=([safetensors]=Safetensors [metrics]=Metrics [manifest]=Manifest [recipe]=Recipe
                  [jsonl-record]=JsonlRecord [hf-config]=HfConfig [tokenizer]=Tokenizer [tokenizer-json]=TokenizerJson
                  [token-rows]=TokenRows [toml]=Toml)
# The recipe target checks plugin names and keys against the build's plugins
# (scripts/build.sh first); TOML++'s internal assertions stay no-ops, as in
# the release build (with them on it aborts on input it then rejects cleanly).
torch_headers="-DBOOST_DLL_USE_STD_FS -I/usr/include/torch/csrc/api/include"  # Plugin.h's torch/version.h
declare -A extra=([recipe]="$torch_headers -DTOML_ASSERT(expr)=static_assert(true) -ldl"
                  [jsonl-record]="$torch_headers -Idatasets/jsonl" [hf-config]="$torch_headers -Imodels/qwen2"
                  [tokenizer]="-DTRAINER_HAS_TOKENIZER -lpcre2-8 -lutf8proc"
                  [tokenizer-json]="-DTRAINER_HAS_TOKENIZER -lpcre2-8 -lutf8proc" [toml]="-DTOML_ASSERT(expr)=static_assert(true)")
scripts/fetch-tokenizer.sh
export FUZZ_PLUGIN_DIR="$root/build/lib/trainer/plugins"
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(safetensors metrics manifest recipe jsonl-record hf-config tokenizer tokenizer-json token-rows
                                      toml)
status=0
# Runs function $1 for each target, TRAINER_BUILD_JOBS (default 2) at a
# time; status=1 when any of them fails.
each_target() {
  local pids=() pid t
  for t in "${targets[@]}"; do
    "$1" "$t" &
    pids+=($!)
    if [ ${#pids[@]} -ge "${TRAINER_BUILD_JOBS:-2}" ]; then
      wait "${pids[0]}" || status=1
      pids=("${pids[@]:1}")
    fi
  done
  for pid in "${pids[@]}"; do wait "$pid" || status=1; done
}
build() {
  # shellcheck disable=SC2086
  clang++ "${flags[@]}" "tests/fuzz/Fuzz${names[$1]}.cpp" ${sources[$1]} ${extra[$1]:-} -o "$out/fuzz-$1" \
    > "$out/build-$1.log" 2>&1 || { echo "fuzz $1: does not compile"; cat "$out/build-$1.log"; return 1; }
}
each_target build
[ $status -eq 0 ] || exit 1
# The targets run the same way (each is one process on one core); their
# reports print as each ends.
run() {
  local t=$1
  rm -rf "$out/corpus-$t" && mkdir -p "$out/corpus-$t"
  if "$out/fuzz-$t" -seed="${FUZZ_SEED:-1}" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 \
       -artifact_prefix="$out/crash-$t-" "$out/corpus-$t" "tests/fuzz/corpus/$t" >"$out/fuzz-$t.log" 2>&1; then
    runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$out/fuzz-$t.log" | grep -o '[0-9]*$')
    echo "fuzz $t: ${runs:-?} executions in ${seconds}s, no crash"
  else
    echo "fuzz $t: FAILED (see $out/fuzz-$t.log)"; tail -30 "$out/fuzz-$t.log"; return 1
  fi
}
each_target run
exit $status
