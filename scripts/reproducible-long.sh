#!/usr/bin/env bash
# Reproducible mode over a long run: the quickstart model for STEPS (default
# 500) optimizer steps at three splits of its global batch of 8 (micro x
# accumulation x world: 8x1x1, 2x2x2 and 1x4x2, the last two over gloo) and,
# with STRATEGY, under that strategy (default zero2). Every split must end
# with one hash of the final weights (summary.json's parameters_xxh3_128)
# and the same loss and gradient norm at every step (`trainer compare
# --rtol 0`). Exit 0 when they do. Kept out of the test suite for its
# time (137 s on two cores, beside an hour of CI); the figure is in
# README.md, Reproducible mode.
#   scripts/reproducible-long.sh [OUT]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/reproducible-long}
steps=${STEPS:-500}
strategy=${STRATEGY:-zero2}
trainer=${TRAINER:-build/bin/trainer}
rm -rf "$out"
mkdir -p "$out"
run() {  # NAME MICRO ACCUM WORLD
  "$trainer" run configs/quickstart.toml --set run.output_dir="$out/$1" --set training.steps="$steps" \
    --set training.reproducible=true --set training.micro_batch_size="$2" --set training.grad_accum_steps="$3" \
    --nproc "$4" --set strategy.name="$strategy" >"$out/$1.log" 2>&1
}
start=$(date +%s)
run 8x1x1 8 1 1
run 2x2x2 2 2 2
run 1x4x2 1 4 2
hashes=$(for s in 8x1x1 2x2x2 1x4x2; do
  python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['parameters_xxh3_128'])" "$out/$s/summary.json"
done | sort -u)
echo "final weights: $(echo "$hashes" | wc -l) hash(es): $(echo $hashes)"
status=0
"$trainer" compare --rtol 0 --quiet "$out/8x1x1" "$out/2x2x2" "$out/1x4x2" || status=1
[ "$(echo "$hashes" | wc -l)" = 1 ] || status=1
echo "$steps steps x 3 splits with $strategy in $(( $(date +%s) - start )) s: $([ $status = 0 ] && echo "one result" || echo "DIFFER")"
exit $status
