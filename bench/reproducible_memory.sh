#!/usr/bin/env bash
# Reproducible mode's memory against ddp on the CPU, from the counting
# allocator (memory.json): bytes per parameter after set-up, after the first
# step, and at the first step's peak. The model (quickstart's, widened to
# hidden 512 and 4 layers: 10.6M parameters, micro-batch 2 x 32 tokens, two
# accumulation steps, bf16) holds far more state than activations, so the
# figures are the per-parameter cost of each mode.
#   bench/reproducible_memory.sh [OUT]
set -euo pipefail
out=${1:-/tmp/reproducible-memory}
trainer=${TRAINER:-build/bin/trainer}
mkdir -p "$out"
for arm in "ddp" "reproducible --set training.reproducible=true"; do
  read -r name extra <<<"$arm"
  rm -rf "${out:?}/$name"
  # shellcheck disable=SC2086
  "$trainer" run configs/quickstart.toml --set run.output_dir="$out/$name" --set training.steps=3 \
    --set model.hidden_size=512 --set model.intermediate_size=1024 --set model.num_hidden_layers=4 \
    --set model.num_attention_heads=8 --set model.num_key_value_heads=8 --set training.micro_batch_size=2 \
    --set training.grad_accum_steps=2 --set training.precision=bf16 $extra >"$out/$name.log" 2>&1
  python3 - "$out/$name/memory.json" "$name" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))[0]
params = m["parameter_bytes"] / 2  # bf16 parameters
print(f"{sys.argv[2]:13s} {params:,.0f} parameters, bytes per parameter: after set-up "
      f"{m['measured_after_setup_bytes'] / params:.2f}, after the first step {m['measured_after_first_step_bytes'] / params:.2f}, "
      f"first step's peak {m['measured_first_step_peak_bytes'] / params:.2f}")
PY
done
