#!/usr/bin/env python3
"""Communication overlap on the CPU: step time at world size 2 over gloo with a simulated network latency.

Every collective of the test-only comm plugin `delayed-gloo`
(tests/fixtures/DelayedComm.cpp) completes no earlier than --delay-ms after
it started. A collective waited for at once pays the delay in full; one
started during backward and waited for later hides it behind compute. Each
row trains the quickstart recipe for --steps steps at 2 ranks (micro-batch 4,
no accumulation), once with no delay and once with it, and reports the mean
step time of the steps after the first two, the time the delay added, and
that time in units of the delay (the latencies a step exposes). The losses
of the two runs must be identical (the delay changes timing only).

    python3 bench/overlap_cpu.py [--trainer build/bin/trainer] [--delay-ms 50] [--only ddp]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

ARMS = [
    ("ddp, all-reduce at the boundary", "ddp", ["strategy.overlap=false", "strategy.bucket_mb=0.02"]),
    ("ddp, overlap (default)", "ddp", ["strategy.bucket_mb=0.02"]),
    ("zero2, one 25 MB bucket", "zero2", []),
    ("zero2, 0.02 MB buckets", "zero2", ["strategy.bucket_mb=0.02"]),
    ("zero3, no prefetch", "zero3", ["strategy.prefetch=0"]),
    ("zero3, prefetch 1 (default)", "zero3", []),
    ("zero3, prefetch 2", "zero3", ["strategy.prefetch=2"]),
]


def run(trainer, fixture, work, name, strategy, overrides, delay_ms, steps):
    out = os.path.join(work, f"{name}-{delay_ms}")
    command = [trainer, "run", os.path.join(ROOT, "configs/quickstart.toml"), "--nproc", "2",
               "--set", f"run.output_dir={out}", "--set", f"training.steps={steps}",
               "--set", "training.micro_batch_size=4", "--set", f"strategy.name={strategy}",
               "--set", f"distributed.backend={fixture}"]
    for override in overrides:
        command += ["--set", override]
    env = dict(os.environ, TRAINER_COMM_DELAY_MS=str(delay_ms))
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        sys.exit(f"{' '.join(command)}\n{result.stderr[-2000:]}")
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    timed = [r["step_seconds"] for r in rows[2:]]
    return 1000 * sum(timed) / len(timed), [r["loss"] for r in rows]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trainer", default=os.path.join(ROOT, "build/bin/trainer"))
    parser.add_argument("--fixture", default=os.path.join(ROOT, "build/test-fixtures/comm/trainer-comm-delayed-gloo.so"))
    parser.add_argument("--delay-ms", type=float, default=50)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--only", default="", help="run only the rows whose strategy is this (e.g. ddp)")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="overlap-cpu-")
    print(f"quickstart recipe, 2 ranks on {os.cpu_count()} cores, gloo, injected latency {args.delay_ms:g} ms "
          f"per collective, {args.steps} steps (first 2 not timed)\n")
    print("| strategy | step ms, no delay | step ms, delay | added ms | added / delay | same losses |")
    print("| --- | ---: | ---: | ---: | ---: | --- |")
    for i, (label, strategy, overrides) in enumerate(ARMS):
        if args.only and strategy != args.only:
            continue
        fast, losses = run(args.trainer, args.fixture, work, f"arm{i}", strategy, overrides, 0, args.steps)
        slow, delayed = run(args.trainer, args.fixture, work, f"arm{i}", strategy, overrides, args.delay_ms, args.steps)
        added = slow - fast
        print(f"| {label} | {fast:.1f} | {slow:.1f} | {added:.1f} | {added / args.delay_ms:.2f} | {losses == delayed} |")


if __name__ == "__main__":
    main()
