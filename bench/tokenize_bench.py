#!/usr/bin/env python3
"""Tokenizer throughput: `trainer tokenize` against Hugging Face tokenizers, same corpus, same machine.

Builds a deterministic corpus (a jsonl of {"text": ...} lines mixing English
prose, code, digits, CJK and emoji from a fixed seed; --mb megabytes), then
tokenizes it
  - with `trainer tokenize` (every core, and --threads 1), and
  - with Hugging Face `tokenizers` (Tokenizer.encode_batch, which runs on
    every core, and a single-threaded loop of encode),
checks that both produce the same ids (EOS after each document, as
`trainer tokenize` writes them), and prints tokens per second of each.
Where `tokenizers` is installed (the GPU machine):

    python3 bench/tokenize_bench.py --trainer build-gpu/bin/trainer \\
        --tokenizer .cache/tokenizers/qwen3 [--mb 50]

With --long-pieces it times single documents that are one pre-tokenizer
piece each ('a' repeated, and a random DNA string, of 1 kB, 80 kB and 1 MB:
the case where BPE merging must not be quadratic), three runs each, and
checks the ids against Hugging Face's encode of the same text. Without
`tokenizers` (this machine), --long-pieces --no-reference times only.
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time

import numpy as np

try:
    import tokenizers
except ImportError:  # --long-pieces --no-reference needs only the trainer
    tokenizers = None

PIECES = ["The quick brown fox jumps over the lazy dog.", "def f(x):\n    return x * 2  # double\n",
          "3.14159 2718 1e-9 0x7f", "数据并行训练", "機械学習のテキスト", "😀 👍🏽 🇯🇵", "  indented\n\tline",
          "It's what they'd said; we'll see.", "https://example.org/a?b=c", "Ελληνικά и русский"]


def corpus(path, megabytes, seed=0):
    rng = random.Random(seed)
    size = 0
    with open(path, "w", encoding="utf-8") as f:
        while size < megabytes * 1e6:
            text = " ".join(rng.choice(PIECES) for _ in range(rng.randint(20, 200)))
            line = json.dumps({"text": text}, ensure_ascii=False) + "\n"
            f.write(line)
            size += len(line.encode("utf-8"))


def long_pieces(args):
    """Seconds per document for one-piece documents, and whether the ids equal HF's."""
    work = tempfile.mkdtemp(prefix="tokenize-long-")
    rng = random.Random(0)
    hf = None if args.no_reference else tokenizers.Tokenizer.from_file(os.path.join(args.tokenizer, "tokenizer.json"))
    print("| piece | bytes | trainer tokenize s (median of 3) | tokens | ids equal HF |\n| --- | ---: | ---: | ---: | --- |")
    for size in (1_000, 80_000, 1_000_000):
        for kind in ("a", "dna"):
            text = "a" * size if kind == "a" else "".join(rng.choice("ACGT") for _ in range(size))
            data = os.path.join(work, f"{kind}-{size}.jsonl")
            with open(data, "w") as f:
                f.write(json.dumps({"text": text}) + "\n")
            out = os.path.join(work, f"{kind}-{size}.bin")
            times = []
            for _ in range(3):
                command = [args.trainer, "tokenize", data, "--tokenizer", args.tokenizer, "--out", out,
                           "--dtype", "uint32", "--threads", "1"]
                start = time.perf_counter()
                run = subprocess.run(command, capture_output=True, text=True)
                times.append(time.perf_counter() - start)
                if run.returncode != 0:
                    print(run.stderr, file=sys.stderr)
                    sys.exit(1)
            got = np.fromfile(out, dtype=np.uint32)[:-1]  # without the EOS
            same = "not checked"
            if hf is not None:
                want = np.array(hf.encode(text, add_special_tokens=False).ids, dtype=np.uint32)
                same = str(got.size == want.size and bool((got == want).all()))
            label = "'a' x n" if kind == "a" else "random ACGT"
            print(f"| {label} | {size:,} | {sorted(times)[1]:.3f} | {got.size:,} | {same} |")
    print("(wall time of the whole command, loading the tokenizer included)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trainer", default="build-gpu/bin/trainer")
    parser.add_argument("--tokenizer", required=True, help="directory with tokenizer.json")
    parser.add_argument("--mb", type=float, default=50)
    parser.add_argument("--long-pieces", action="store_true", help="time one-piece documents of 1 kB to 1 MB")
    parser.add_argument("--no-reference", action="store_true", help="with --long-pieces: skip the HF comparison")
    args = parser.parse_args()
    if args.long_pieces:
        long_pieces(args)
        return
    work = tempfile.mkdtemp(prefix="tokenize-bench-")
    data = os.path.join(work, "corpus.jsonl")
    corpus(data, args.mb)
    texts = [json.loads(line)["text"] for line in open(data, encoding="utf-8")]
    hf = tokenizers.Tokenizer.from_file(os.path.join(args.tokenizer, "tokenizer.json"))
    eos = hf.token_to_id(json.load(open(os.path.join(args.tokenizer, "tokenizer_config.json")))["eos_token"])
    rows = []

    start = time.perf_counter()
    batch = hf.encode_batch(texts, add_special_tokens=False)
    seconds = time.perf_counter() - start
    expected = np.concatenate([np.array(e.ids + [eos], dtype=np.uint32) for e in batch])
    rows.append(("HF tokenizers encode_batch (all cores)", expected.size / seconds))
    start = time.perf_counter()
    for t in texts[: max(1, len(texts) // 10)]:
        hf.encode(t, add_special_tokens=False)
    seconds = (time.perf_counter() - start) * len(texts) / max(1, len(texts) // 10)
    rows.append(("HF tokenizers encode, one thread (10% sample)", expected.size / seconds))

    for threads in (None, 1):
        out = os.path.join(work, f"trainer-{threads or 'all'}.bin")
        command = [args.trainer, "tokenize", data, "--tokenizer", args.tokenizer, "--out", out, "--dtype", "uint32"]
        if threads:
            command += ["--threads", str(threads)]
        run = subprocess.run(command, capture_output=True, text=True)
        if run.returncode != 0:
            print(run.stderr, file=sys.stderr)
            sys.exit(1)
        line = [l for l in (run.stdout + run.stderr).splitlines() if "tokens/s" in l and "tokenized" in l][-1]
        rate = float(line.split(" tokens/s")[0].split()[-1])
        got = np.fromfile(out, dtype=np.uint32)
        same = got.size == expected.size and bool((got == expected).all())
        rows.append((f"trainer tokenize ({'all cores' if threads is None else '1 thread'}), ids equal HF: {same}", rate))
        if not same:
            print(f"MISMATCH: {got.size} ids against {expected.size}", file=sys.stderr)

    print(f"\ncorpus: {len(texts)} documents, {os.path.getsize(data) / 1e6:.1f} MB, {expected.size} tokens; "
          f"{os.cpu_count()} cores; tokenizers {tokenizers.__version__}")
    print("| tokenizer | tokens/s |\n| --- | ---: |")
    for name, rate in rows:
        print(f"| {name} | {rate:,.0f} |")


if __name__ == "__main__":
    main()
