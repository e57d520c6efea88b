#!/usr/bin/env python3
"""Communication overlap over real NCCL: step time at N GPUs of one host, overlap on and off.

Each row trains a transformer of `--hidden` width and `--layers` blocks
(qwen2, synthetic data, bf16) for --steps steps at --nproc ranks over nccl,
once with the strategy's overlap off (ddp: overlap = false; zero3:
prefetch = 0) and once on, and reports the mean step time of the steps
after the first two, the share of the step the overlap saved, and whether
the losses of the two runs are identical (overlap changes when results
arrive, never the sums). Needs a host with --nproc GPUs; `trainer run`
fails naming the missing device otherwise.

    python3 bench/overlap_nccl.py [--trainer build-gpu/bin/trainer] [--nproc 8]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (label, strategy, overrides without overlap, overrides with it)
ARMS = [
    ("ddp, 25 MB buckets", "ddp", ["strategy.overlap=false"], []),
    ("zero2, 25 MB buckets", "zero2", None, []),
    ("zero3", "zero3", ["strategy.prefetch=0"], []),
]


def run(args, work, name, strategy, overrides):
    out = os.path.join(work, name)
    command = [args.trainer, "run", os.path.join(ROOT, "configs/quickstart.toml"), "--nproc", str(args.nproc),
               "--set", f"run.output_dir={out}", "--set", f"training.steps={args.steps}",
               "--set", "run.device=cuda", "--set", "distributed.backend=nccl",
               "--set", "training.precision=bf16", "--set", "dataset.seq_len=1024",
               "--set", f"training.micro_batch_size={args.micro_batch}",
               "--set", f"model.hidden_size={args.hidden}", "--set", f"model.intermediate_size={4 * args.hidden}",
               "--set", f"model.num_hidden_layers={args.layers}", "--set", "model.num_attention_heads=16",
               "--set", "model.num_key_value_heads=4", "--set", f"strategy.name={strategy}"]
    for override in overrides:
        command += ["--set", override]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"{' '.join(command)}\n{result.stderr[-3000:]}")
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    timed = [r["step_seconds"] for r in rows[2:]]
    return 1000 * sum(timed) / len(timed), [r["loss"] for r in rows]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trainer", default=os.path.join(ROOT, "build-gpu/bin/trainer"))
    parser.add_argument("--nproc", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--micro-batch", type=int, default=2)
    parser.add_argument("--steps", type=int, default=12)
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="overlap-nccl-")
    print(f"qwen2 {args.layers} x {args.hidden}, bf16, micro-batch {args.micro_batch} x 1024 tokens, "
          f"{args.nproc} GPUs over nccl, {args.steps} steps (first 2 not timed)\n")
    print("| strategy | step ms, overlap off | step ms, overlap on | saved | same losses |")
    print("| --- | ---: | ---: | ---: | --- |")
    failed = False
    for i, (label, strategy, off, on) in enumerate(ARMS):
        if off is None:  # zero2 always streams its buckets: only the on row
            fast, _ = run(args, work, f"arm{i}-on", strategy, on)
            print(f"| {label} | - | {fast:.1f} | - | - |")
            continue
        slow, losses_off = run(args, work, f"arm{i}-off", strategy, off)
        fast, losses_on = run(args, work, f"arm{i}-on", strategy, on)
        same = losses_off == losses_on
        failed |= not same
        print(f"| {label} | {slow:.1f} | {fast:.1f} | {100 * (slow - fast) / slow:.0f}% | {same} |")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
