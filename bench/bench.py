#!/usr/bin/env python3
"""Training speed on one GPU: trainer (ddp, zero3) against PyTorch eager.

Model: Qwen2-0.5B's shape (hidden 896, 24 layers, 14 heads, 2 key/value
heads, intermediate 4864, vocab 151936, tied embeddings), random init.
Batch: micro-batch 4 x sequence 2048 random tokens, no accumulation.
Precision: bf16 compute, fp32 master weights and AdamW state (trainer's
training.precision = "bf16"; PyTorch: fp32 parameters under
torch.autocast(bfloat16), the usual eager mixed precision), SDPA attention,
AdamW, clipping at 1.0. Each run is its own process; the first
--warmup steps are left out of the timing.

Prints tokens/s, MFU against the bf16 matmul rate measured in the same run,
and each process's peak GPU memory (nvidia-smi, sampled every 50 ms), with
each figure's ratio to PyTorch eager. Run from the project root:

    python3 bench/bench.py --trainer build-gpu/bin/trainer
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import torch

CONFIG = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
              num_attention_heads=14, num_key_value_heads=2, rope_theta=1000000.0, rms_norm_eps=1e-6,
              tie_word_embeddings=True, max_position_embeddings=32768)


def matmul_rate():
    """Dense bf16 matmul FLOP/s on this GPU (8192^3, best of 20)."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    best = float("inf")
    for _ in range(20):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        a @ b
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) / 1000)
    return 2 * 8192 ** 3 / best


def flops_per_token(seq):
    """6 N for the weights (embedding counted once: tied) plus attention's 12 L H T (PaLM, appendix B)."""
    c = CONFIG
    h, kv = c["hidden_size"], c["num_key_value_heads"] * c["hidden_size"] // c["num_attention_heads"]
    per_layer = h * h * 2 + h * kv * 2 + 3 * h * c["intermediate_size"]
    n = c["num_hidden_layers"] * per_layer + c["vocab_size"] * h
    return 6 * n + 12 * c["num_hidden_layers"] * h * seq, n


class PeakMemory:
    """Peak of the GPU memory nvidia-smi reports for one process."""

    def __init__(self, pid):
        self.pid, self.peak, self.done = pid, 0, False
        self.thread = threading.Thread(target=self.poll, daemon=True)
        self.thread.start()

    def poll(self):
        while not self.done:
            out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True).stdout
            for line in out.splitlines():
                fields = [f.strip() for f in line.split(",")]
                if len(fields) == 2 and fields[0] == str(self.pid):
                    self.peak = max(self.peak, int(fields[1]))
            time.sleep(0.05)

    def stop(self):
        self.done = True
        self.thread.join()
        return self.peak / 1024  # GiB


def run_trainer(trainer, strategy, work, args):
    out = os.path.join(work, f"run-{strategy}")
    recipe = os.path.join(work, f"{strategy}.toml")
    model = "\n".join(f"{k} = {str(v).lower() if isinstance(v, bool) else v}" for k, v in CONFIG.items())
    with open(recipe, "w") as f:
        f.write(f"""[run]
device = "cuda"
output_dir = "{out}"
[model]
name = "qwen2"
{model}
[dataset]
name = "tokens"
path = "{work}/tokens.bin"
dtype = "uint32"
seq_len = {args.seq}
vocab_size = {CONFIG['vocab_size']}
[training]
steps = {args.steps}
micro_batch_size = {args.micro_batch}
precision = "bf16"
max_grad_norm = 1.0
[optimizer]
lr = 1e-4
weight_decay = 0.1
[strategy]
name = "{strategy}"
[[logger]]
name = "console"
interval = 5
""")
    process = subprocess.Popen([trainer, "run", recipe], stdout=sys.stderr, stderr=sys.stderr)
    memory = PeakMemory(process.pid)
    if process.wait() != 0:
        raise SystemExit(f"trainer ({strategy}) failed")
    peak = memory.stop()
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))][args.warmup:]
    seconds = sum(r["step_seconds"] for r in rows)
    return sum(r["input_tokens"] for r in rows) / seconds, peak


EAGER = r"""
import sys, time, torch
from transformers import Qwen2Config, Qwen2ForCausalLM
config = Qwen2Config(**CONFIG, attn_implementation="sdpa")
torch.manual_seed(0)
model = Qwen2ForCausalLM(config).cuda().train()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)
tokens = torch.randint(0, config.vocab_size, (STEPS, MICRO, SEQ + 1), device="cuda")
times = []
for step in range(STEPS):
    torch.cuda.synchronize(); start = time.perf_counter()
    batch = tokens[step]
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(batch[:, :-1]).logits
    loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize(); times.append(time.perf_counter() - start)
    if step % 5 == 0: print(f"eager step {step + 1}: loss {loss.item():.4f}", file=sys.stderr)
print(sum(times[WARMUP:]))
"""


def run_eager(args):
    code = (EAGER.replace("CONFIG", repr(CONFIG)).replace("STEPS", str(args.steps)).replace("MICRO", str(args.micro_batch))
            .replace("SEQ", str(args.seq)).replace("WARMUP", str(args.warmup)))
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=sys.stderr, text=True)
    memory = PeakMemory(process.pid)
    out, _ = process.communicate()
    if process.returncode != 0:
        raise SystemExit("PyTorch eager failed")
    peak = memory.stop()
    seconds = float(out.strip().splitlines()[-1])
    return (args.steps - args.warmup) * args.micro_batch * args.seq / seconds, peak


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trainer", default="build-gpu/bin/trainer")
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=2048)
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="bench-")
    windows = args.steps * args.micro_batch + 1
    np.random.default_rng(0).integers(0, CONFIG["vocab_size"], windows * args.seq + 1, dtype=np.uint32).tofile(
        os.path.join(work, "tokens.bin"))
    peak = matmul_rate()
    per_token, params = flops_per_token(args.seq)
    results = {"PyTorch eager": run_eager(args)}
    for strategy in ("ddp", "zero3"):
        results[f"trainer {strategy}"] = run_trainer(args.trainer, strategy, work, args)
    print(f"\nQwen2 {params / 1e9:.3f}B parameters, bf16, micro-batch {args.micro_batch} x {args.seq} tokens, "
          f"{torch.cuda.get_device_name()}, measured bf16 matmul {peak / 1e12:.0f} TFLOP/s")
    print(f"{'run':<16} {'tokens/s':>10} {'vs eager':>9} {'MFU':>7} {'peak GiB':>9} {'vs eager':>9}")
    base_speed, base_memory = results["PyTorch eager"]
    for name, (speed, memory) in results.items():
        print(f"{name:<16} {speed:>10.0f} {speed / base_speed:>8.2f}x {speed * per_token / peak:>6.1%} "
              f"{memory:>9.1f} {memory / base_memory:>8.2f}x")


if __name__ == "__main__":
    main()
