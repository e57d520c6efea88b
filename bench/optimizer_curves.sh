#!/usr/bin/env bash
# The optimizers' loss curves, one recipe each for adamw, muon and lion
# (same data, seed, schedule; each optimizer at its usual learning rate),
# compared with `trainer compare --html`.
#   bench/optimizer_curves.sh quickstart OUT   the quickstart task, 300 steps on the CPU
#   bench/optimizer_curves.sh text OUT         real text (Vim's documentation, a Debian
#       package's shipped prose, in .cache/corpus/vim-docs.jsonl: bench/text_corpus.py)
#       tokenized with Qwen3's tokenizer (.cache/tokenizers/qwen3), a 12-layer qwen2 of
#       hidden 768, 300 steps of 16 x 1024 tokens on CUDA in bf16
# With VARY=precision (text task): adamw in bf16 against fp8 instead of the
# three optimizers (issue goal: the last losses within 1%).
# Prints each run's last losses and compare's summary; the report is OUT/report.html.
set -euo pipefail
task=$1
out=$2
trainer=${TRAINER:-build/bin/trainer}
mkdir -p "$out"
declare -A lr
if [ "$task" = quickstart ]; then
  base=(configs/quickstart.toml --set training.steps=300 --set lr_schedule.name=cosine --set lr_schedule.warmup_steps=20)
  lr=([adamw]=3e-3 [muon]=3e-3 [lion]=3e-4)
else
  corpus=.cache/corpus/vim-docs.jsonl
  [ -f "$out/text.bin" ] || "$trainer" tokenize "$corpus" --tokenizer .cache/tokenizers/qwen3 --out "$out/text.bin"
  cat >"$out/text.toml" <<TOML
[run]
device = "cuda"
seed = 5
[model]
name = "qwen2"
vocab_size = 151936
hidden_size = 768
intermediate_size = 2048
num_hidden_layers = 12
num_attention_heads = 12
num_key_value_heads = 4
[dataset]
name = "tokens"
path = "$out/text.bin"
dtype = "uint32"
vocab_size = 151936
seq_len = 1024
[training]
steps = 300
micro_batch_size = 16
precision = "bf16"
[lr_schedule]
name = "cosine"
warmup_steps = 30
min_lr = 0.0
TOML
  base=("$out/text.toml")
  lr=([adamw]=1e-3 [muon]=1e-3 [lion]=1e-4)
fi
# Each arm: its name, then the optimizer and the precision it runs.
arms=("adamw adamw bf16" "muon muon bf16" "lion lion bf16")
[ "${VARY:-optimizer}" = precision ] && arms=("bf16 adamw bf16" "fp8 adamw fp8")
[ "$task" = quickstart ] && [ "${VARY:-optimizer}" = precision ] && { echo "VARY=precision needs the text task (CUDA)" >&2; exit 2; }
runs=()
for arm in "${arms[@]}"; do
  read -r name optimizer precision <<<"$arm"
  rm -rf "${out:?}/$name"
  extra=()
  [ "$task" = quickstart ] || extra=(--set training.precision=$precision)
  "$trainer" run "${base[@]}" --set run.output_dir="$out/$name" --set optimizer.name=$optimizer \
    --set optimizer.lr=${lr[$optimizer]} --set optimizer.weight_decay=0.1 "${extra[@]}" >"$out/$name.log" 2>&1
  runs+=("$out/$name")
  python3 - "$out/$name/metrics.jsonl" "$name" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
last = [r["loss"] for r in rows[-20:]]
print(f"{sys.argv[2]:6s} steps {len(rows)}  loss first {rows[0]['loss']:.4f}  mean of the last 20 {sum(last) / len(last):.4f}"
      f"  median step {sorted(r['step_seconds'] for r in rows[5:])[len(rows[5:]) // 2] * 1000:.1f} ms")
PY
done
"$trainer" compare "${runs[@]}" --quiet --html "$out/report.html" || true
