#!/usr/bin/env python3
"""bench.py --merge: the runs of several --json files pooled per arm, checked against figures worked out here
(the median of three runs is their middle value; MFU is tokens/s x FLOPs per token / the matmul rate), and
files that cannot be pooled refused with exit 2 naming the file or the key. Usage: merge_test.py BENCH_PY TMPDIR"""
import json
import os
import subprocess
import sys

bench, tmp = sys.argv[1], sys.argv[2]
os.makedirs(tmp, exist_ok=True)
failures = []


def check(condition, what):
    if not condition:
        failures.append(what)


def write(name, **changes):
    table = dict(shape="0.5b", commit="abc1234", runs=1, device="NVIDIA H100 80GB HBM3", seq=2048, micro_batch=4,
                 parameters=0, rows=[], matmul_tflops=780.0, every_run={})
    table.update(changes)
    path = os.path.join(tmp, name)
    with open(path, "w") as f:
        json.dump(table, f)
    return path


def run(*args):
    return subprocess.run([sys.executable, bench, *args], capture_output=True, text=True)


# Three calls of one run per arm; the peer is the faster compiled arm (autotune here, by its median).
speeds = {"compile-fused": [90000, 93000, 91000], "compile-autotune": [95000, 94000, 96000],
          "trainer ddp": [113000, 112000, 118000]}
files = [write(f"call{k}.json", matmul_tflops=rate,
               every_run={arm: [[runs[k], 16.0 + k, 11.5, [15.0, 15.5]]] for arm, runs in speeds.items()})
         for k, rate in enumerate((760.0, 790.0, 770.0))]
out = os.path.join(tmp, "merged.json")
result = run("--merge", *files, "--json", out)
check(result.returncode == 0, f"--merge of three files: exit {result.returncode}: {result.stderr}")
if result.returncode == 0:
    with open(out) as f:
        merged = json.load(f)
    rows = {row["run"]: row for row in merged["rows"]}
    check(merged["runs"] == 3, f"runs per arm {merged['runs']}, expected 3")
    check(merged["matmul_tflops"] == 770.0, f"matmul rate {merged['matmul_tflops']}, expected the median 770")
    check(merged["commit"] == "abc1234" and merged["shape"] == "0.5b", "commit or shape not carried over")
    # 0.5B: hidden 896, 24 layers, kv 128, intermediate 4864, vocab 151936 (tied), sequence 2048.
    per_layer = 896 * 896 * 2 + 896 * 128 * 2 + 3 * 896 * 4864
    per_token = 6 * (24 * per_layer + 151936 * 896) + 12 * 24 * 896 * 2048
    for arm, runs in speeds.items():
        row = rows.get(arm)
        check(row is not None, f"{arm}: no row")
        if row is None:
            continue
        middle = sorted(runs)[1]
        check(row["tokens_per_second"] == middle, f"{arm}: {row['tokens_per_second']}, expected {middle}")
        check(sorted(row["runs_tokens_per_second"]) == sorted(runs), f"{arm}: runs {row['runs_tokens_per_second']}")
        check(abs(row["mfu"] - middle * per_token / 770e12) < 1e-9, f"{arm}: mfu {row['mfu']}")
        check(abs(row["mfu_datasheet"] - middle * per_token / 989.4e12) < 1e-9, f"{arm}: datasheet mfu")
        # The median run's memory beside its speed: run k has 16 + k GiB.
        check(row["peak_gib"] == 16.0 + runs.index(middle), f"{arm}: peak {row['peak_gib']} not the median run's")
    check("| trainer ddp | 113000 (112000-118000) | 1.19x |" in result.stdout,
          f"ddp's line (median, spread, 113000 / 95000) missing from:\n{result.stdout}")
    check(len(merged["every_run"]["trainer ddp"]) == 3, "every_run does not keep the pooled runs")

# A failed run fails its arm; the others stand.
failed = write("failed.json", every_run={"trainer ddp": [None], "compile-fused": [[90000, 19.0, 11.5, [17, 18]]]})
result = run("--merge", files[0], failed)
check(result.returncode == 0 and "| trainer ddp | failed |" in result.stdout,
      f"a failed run: exit {result.returncode}, {result.stdout}")

# Refused, exit 2, naming what is wrong.
old = os.path.join(tmp, "old.json")  # written before --merge: no every_run, device, seq, micro_batch
with open(old, "w") as f:
    json.dump(dict(shape="0.5b", commit="abc1234", runs=1, matmul_tflops=780.0, rows=[]), f)
broken = os.path.join(tmp, "broken.json")
with open(broken, "w") as f:
    f.write("{")
for label, args, named in (("another commit", [files[0], write("other.json", commit="def5678")], "commit"),
                           ("another device", [files[0], write("h200.json", device="NVIDIA H200")], "device"),
                           ("another accumulation", [files[0], write("accum.json", accumulation=8)], "accumulation"),
                           ("an older file", [files[0], old], "old.json"),
                           ("no such file", [os.path.join(tmp, "absent.json")], "absent.json"),
                           ("not JSON", [broken], "broken.json")):
    result = run("--merge", *args)
    check(result.returncode == 2 and named in result.stderr,
          f"{label}: exit {result.returncode}, expected 2 naming {named}: {result.stderr}")

for failure in failures:
    print("FAILED:", failure)
print(f"{len(failures)} failure(s)")
sys.exit(1 if failures else 0)
