#!/usr/bin/env python3
"""Loads the tensorboard logger's event files with TensorBoard's own reader.

Runs a short training (the quick-start recipe, on the CPU or CUDA) with the
`tensorboard` and `jsonl` loggers for 25 steps (checkpoints at 10 and 20),
resumes it from step 20 to 30 (the event file of the resumed run is a second
file in the same directory; steps 21-25 of the first must be dropped), then
reads the directory with tensorboard's EventAccumulator and compares every
scalar with metrics.jsonl (float32: the event files hold float32 values).
Then a fresh run of 15 steps with another learning rate into the same
directory (run.overwrite): TensorBoard must show its 15 steps alone. Exit 0
when all agree. Where tensorboard is installed (the GPU machine):

    python3 bench/tensorboard_check.py --trainer build-gpu/bin/trainer
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

import numpy as np
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

TAGS = {  # tag -> (metrics.jsonl field, scale)
    "loss_metrics/global_avg_loss": ("loss", 1.0),
    "grad_norm": ("grad_norm", 1.0),
    "lr": ("lr", 1.0),
    "throughput(tps)": ("tokens_per_second", 1.0),
    "target_tokens": ("target_tokens", 1.0),
    "time/step_seconds": ("step_seconds", 1.0),
}


def check(out):
    """The number of tags on which TensorBoard's reader and metrics.jsonl disagree."""
    rows = {r["step"]: r for r in map(json.loads, open(f"{out}/run/metrics.jsonl"))}
    logdir = f"{out}/run/tensorboard"
    files = sorted(os.listdir(logdir))
    print(f"event files: {files}")
    accumulator = EventAccumulator(logdir, size_guidance={"scalars": 0})
    accumulator.Reload()
    tags = accumulator.Tags()["scalars"]
    print(f"tags read by tensorboard: {tags}")
    bad = 0
    for tag, (field, scale) in TAGS.items():
        if tag not in tags:
            print(f"MISSING tag {tag}")
            bad += 1
            continue
        events = accumulator.Scalars(tag)
        steps = [e.step for e in events]
        if steps != sorted(rows):
            print(f"{tag}: steps {steps} against metrics.jsonl's {sorted(rows)}")
            bad += 1
        worst = 0
        for e in events:
            expected = np.float32(rows[e.step][field] * scale) if e.step in rows else np.float32("nan")
            if not (math.isclose(e.value, expected, rel_tol=0, abs_tol=0) or (math.isnan(e.value) and math.isnan(expected))):
                worst += 1
        print(f"{tag}: {len(events)} scalars, {worst} differ from metrics.jsonl as float32")
        bad += worst > 0
    return bad


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trainer", default="build-gpu/bin/trainer")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    out = tempfile.mkdtemp(prefix="tensorboard-check-")
    recipe = os.path.join(out, "recipe.toml")
    with open("configs/quickstart.toml") as f, open(recipe, "w") as g:
        g.write(f.read() + "\n[[logger]]\nname = 'tensorboard'\n\n[[logger]]\nname = 'jsonl'\n")
    common = [args.trainer, "run", recipe, "--set", f"run.output_dir={out}/run", "--set", f"run.device={args.device}",
              "--set", "checkpoint.interval=10"]
    subprocess.run(common + ["--set", "training.steps=25"], check=True, stdout=subprocess.DEVNULL)
    subprocess.run(common + ["--set", "training.steps=30", "--set", "checkpoint.resume=auto"], check=True,
                   stdout=subprocess.DEVNULL)
    bad = check(out)
    subprocess.run(common + ["--set", "training.steps=15", "--set", "optimizer.lr=0.001", "--set", "run.overwrite=true",
                             "--set", f"checkpoint.dir={out}/fresh-checkpoints"], check=True, stdout=subprocess.DEVNULL)
    bad += check(out)
    print("PASS: TensorBoard's reader agrees with metrics.jsonl" if bad == 0 else f"FAIL: {bad} tags disagree")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
