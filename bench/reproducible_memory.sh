#!/usr/bin/env bash
# Reproducible mode's memory against ddp on the CPU, from the counting
# allocator (memory.json): bytes per parameter after set-up, after the first
# step, and at the first step's peak, for two widenings of the quickstart
# model whose state outweighs their activations (bf16, micro-batch 2 x 32
# tokens, two accumulation steps, 3 steps):
#   wide   hidden 512, 4 layers, vocabulary 64: 10.6M parameters, none above 0.6M
#   vocab  hidden 256, 2 layers, vocabulary 32768: 18.1M parameters, 16.8M of
#          them in the embedding and the output layer (a large parameter)
#   bench/reproducible_memory.sh [OUT]
set -euo pipefail
out=${1:-/tmp/reproducible-memory}
trainer=${TRAINER:-build/bin/trainer}
mkdir -p "$out"
declare -A model
model[wide]="model.hidden_size=512 model.intermediate_size=1024 model.num_hidden_layers=4 model.num_attention_heads=8 model.num_key_value_heads=8"
model[vocab]="model.hidden_size=256 model.intermediate_size=512 model.num_hidden_layers=2 model.num_attention_heads=4 model.num_key_value_heads=4 model.vocab_size=32768 dataset.vocab_size=32768"
for shape in wide vocab; do
  sets=()
  for kv in ${model[$shape]}; do sets+=(--set "$kv"); done
  for arm in "ddp" "reproducible --set training.reproducible=true"; do
    read -r name extra <<<"$arm"
    rm -rf "${out:?}/$shape-$name"
    # shellcheck disable=SC2086
    "$trainer" run configs/quickstart.toml --set run.output_dir="$out/$shape-$name" --set training.steps=3 "${sets[@]}" \
      --set training.micro_batch_size=2 --set training.grad_accum_steps=2 --set training.precision=bf16 $extra \
      >"$out/$shape-$name.log" 2>&1
    python3 - "$out/$shape-$name/memory.json" "$shape $name" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))[0]
params = m["parameter_bytes"] / 2  # bf16 parameters
print(f"{sys.argv[2]:18s} {params:,.0f} parameters, bytes per parameter: after set-up "
      f"{m['measured_after_setup_bytes'] / params:.2f}, after the first step {m['measured_after_first_step_bytes'] / params:.2f}, "
      f"first step's peak {m['measured_first_step_peak_bytes'] / params:.2f}")
PY
  done
done
