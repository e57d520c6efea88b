#!/usr/bin/env bash
# Packed against padded sequences on ragged fine-tuning records (Vim's
# documentation, each paragraph a prompt (its first line) and completion:
# bench/text_corpus.py --ragged), completion-only loss: useful (target)
# tokens per second, input tokens per second, padding and documents per
# step, three runs per arm, medians and the packed/padded ratio.
#   bench/packing.sh OUT        the CPU: quickstart's model over bytes, seq_len 512
#   bench/packing.sh OUT cuda   the GPU: Qwen2-0.5B's shape in bf16, Qwen3's tokenizer
#                               (.cache/tokenizers/qwen3), seq_len 2048
set -euo pipefail
out=$1
device=${2:-cpu}
trainer=${TRAINER:-build/bin/trainer}
corpus=.cache/corpus/vim-ragged.jsonl
[ -f "$corpus" ] || python3 bench/text_corpus.py --ragged "$corpus"
mkdir -p "$out"
if [ "$device" = cuda ]; then
  model="vocab_size = 151936
hidden_size = 896
intermediate_size = 4864
num_hidden_layers = 24
num_attention_heads = 14
num_key_value_heads = 2"
  data="tokenizer = '.cache/tokenizers/qwen3'
seq_len = 2048"
  training="steps = 30
micro_batch_size = 8
precision = 'bf16'"
else
  model="vocab_size = 258
hidden_size = 64
intermediate_size = 128
num_hidden_layers = 2
num_attention_heads = 4
num_key_value_heads = 2"
  data="seq_len = 512"
  training="steps = 25
micro_batch_size = 8"
fi
cat >"$out/packing.toml" <<TOML
[run]
device = "$device"
seed = 5
[model]
name = "qwen2"
$model
[dataset]
name = "jsonl"
path = "$corpus"
$data
[training]
$training
[optimizer]
lr = 1e-3
TOML
echo "commit $(git rev-parse --short HEAD)$(git diff --quiet || echo '+changes'), device $device"
printf '%-7s %-4s %14s %14s %12s %10s %10s\n' arm run target_tok/s input_tok/s pad_fraction docs/step step_ms
for run in 1 2 3; do
  for arm in padded packed; do
    dir="$out/$arm-$run"
    rm -rf "$dir"
    "$trainer" run "$out/packing.toml" --set run.output_dir="$dir" \
      --set dataset.pack=$([ $arm = packed ] && echo true || echo false) >"$dir.log" 2>&1
    python3 - "$dir/metrics.jsonl" "$arm" "$run" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])][5:]  # the first five steps warm up
seconds = sum(r["step_seconds"] for r in rows)
mean = lambda key: sum(r[key] for r in rows) / len(rows)
print(f"{sys.argv[2]:7s} {sys.argv[3]:4s} {sum(r['target_tokens'] for r in rows) / seconds:14.0f} "
      f"{sum(r['input_tokens'] for r in rows) / seconds:14.0f} {mean('pad_fraction'):12.3f} {mean('documents'):10.1f} "
      f"{1000 * seconds / len(rows):10.1f}")
PY
  done
done | tee "$out/table.txt"
python3 - "$out/table.txt" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
median = lambda arm, col: statistics.median(float(r[col]) for r in rows if r[0] == arm)
print(f"median target tokens/s: padded {median('padded', 2):.0f}, packed {median('packed', 2):.0f}: "
      f"packed/padded {median('packed', 2) / median('padded', 2):.2f}x")
PY
