#!/usr/bin/env python3
"""How fast does each of a bench shape's GEMMs run, through cuBLAS and through cuBLASLt?

A step of the trainer's bf16 fast mode is mostly GEMMs: per linear layer the
forward (X W^T, bf16 out), the input gradient (dY W, bf16 out) and the weight
gradient added into the fp32 gradient buffer (G += dY^T X: bf16 operands, fp32
accumulation and output, beta 1: LibTorch's addmm with out_dtype, as
ops/Linear.cpp calls it), and the tied head's chunks (logits written in fp32,
their input and weight gradients). This probe times each of them alone on
random data, once with LibTorch's default BLAS library and once with cuBLASLt
preferred (`torch.backends.cuda.preferred_blas_library`, the switch the
trainer could set through at::globalContext().setBlasPreferredBackend), and
weighs them by how often a step runs them (layers x micro-batch of B x T
tokens): the GEMM milliseconds a step each library would spend, beside the
rate of a square 8192^3 GEMM (bench.py's matmul rate).

On the GPU machine:  python3 bench/gemm_rate_probe.py --shape 3b

--sequence SECONDS then runs the GEMMs of whole micro-batches in a step's
order (each layer's forward, the head's chunks, each layer's backward in
reverse) for about SECONDS per library, timing each micro-batch: once with
every layer's own operands (as a step runs them: the L2 holds none of the
next layer's), once with layer 0's operands for every layer (the L2 warm, as
in the timings alone). Beside the sum of the timings alone this separates
what a sequence of shapes and a cold L2 cost; the first and last micro-batch
of a sustained run show whether the clocks drop (log `nvidia-smi
--query-gpu=timestamp,clocks.sm,power.draw --format=csv -lms 200` beside it:
the probe prints the wall-clock time of each phase).
"""
import argparse
import time

import torch

from bench import SHAPES  # bench.py's model shapes


def timed(fn, reps):
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]  # ms, median


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="3b")
    parser.add_argument("--tokens", type=int, default=4 * 2048, help="tokens in a micro-batch (B x T)")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--uniform", action="store_true",
                        help="uniform values in [-scale, scale) (gemm_algo_probe.cu's data) instead of normal ones")
    parser.add_argument("--sequence", type=float, default=0.0, metavar="SECONDS",
                        help="then time whole micro-batches of GEMMs in a step's order for about SECONDS per library")
    args = parser.parse_args()
    shape = SHAPES[args.shape]
    hidden, inter = shape["hidden_size"], shape["intermediate_size"]
    heads, kv_heads, vocab = shape["num_attention_heads"], shape["num_key_value_heads"], shape["vocab_size"]
    head_dim = hidden // heads
    layers, t = shape["num_hidden_layers"], args.tokens
    chunk = (1 << 30) // (vocab * 4)  # ops/LinearCrossEntropy.cpp: 1 GiB of fp32 logits a chunk
    chunks = -(-t // chunk)
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, shape {args.shape}, {t} tokens a micro-batch, "
          f"head chunks of {chunk} rows")
    g = torch.Generator(device="cuda").manual_seed(0)

    def values(*size, scale=1.0):
        if args.uniform:
            return ((torch.rand(*size, device="cuda", generator=g) * 2 - 1) * scale).to(torch.bfloat16)
        return (torch.randn(*size, device="cuda", generator=g) * scale).to(torch.bfloat16)

    linears = {  # name: (in, out, times a step)
        "q/k/v": (hidden, hidden + 2 * kv_heads * head_dim, layers),
        "o": (hidden, hidden, layers),
        "gate/up": (hidden, 2 * inter, layers),
        "down": (inter, hidden, layers),
    }
    cases = []  # (name, flops, count, fn)
    for name, (k, n, count) in linears.items():
        w, x, dy = values(n, k, scale=k ** -0.5), values(t, k), values(t, n, scale=1e-3)
        grad = torch.zeros(n, k, device="cuda")
        flops = 2 * t * k * n
        cases.append((f"{name} forward [{t}x{k}]x[{k}x{n}]", flops, count, lambda x=x, w=w: x @ w.t()))
        cases.append((f"{name} dgrad", flops, count, lambda dy=dy, w=w: dy @ w))
        cases.append((f"{name} wgrad +=fp32", flops, count,
                      lambda grad=grad, dy=dy, x=x: torch.addmm(grad, dy.t(), x, out_dtype=torch.float32, out=grad)))
    h, w = values(chunk, hidden), values(vocab, hidden, scale=hidden ** -0.5)
    logits = torch.empty(chunk, vocab, device="cuda")
    dlogits, wgrad = values(chunk, vocab, scale=1e-4), torch.zeros(vocab, hidden, device="cuda")
    flops = 2 * chunk * hidden * vocab
    cases.append((f"head forward fp32 [{chunk}x{hidden}]x[{hidden}x{vocab}]", flops, chunks,
                  lambda: torch.addmm(logits, h, w.t(), out_dtype=torch.float32, beta=0, out=logits)))
    cases.append(("head dgrad", flops, chunks, lambda: dlogits @ w))
    cases.append(("head wgrad +=fp32", flops, chunks,
                  lambda: torch.addmm(wgrad, dlogits.t(), h, out_dtype=torch.float32, out=wgrad)))

    a, b = values(8192, 8192), values(8192, 8192)
    libraries = ["cublas", "cublaslt"]
    totals = {lib: 0.0 for lib in libraries}
    print(f"{'GEMM':52s} " + " ".join(f"{lib + ' ms':>11s} {'TFLOP/s':>8s}" for lib in libraries))
    for lib in libraries:
        torch.backends.cuda.preferred_blas_library(lib)
        square = timed(lambda: a @ b, args.reps)
        print(f"square 8192^3 via {lib}: {square:.3f} ms, {2 * 8192 ** 3 / square / 1e9:.0f} TFLOP/s")
    rows = []
    for name, flops, count, fn in cases:
        row = []
        for lib in libraries:
            torch.backends.cuda.preferred_blas_library(lib)
            ms = timed(fn, args.reps)
            totals[lib] += ms * count
            row.append((ms, flops / ms / 1e9))
        rows.append((name, count, row))
    for name, count, row in rows:
        print(f"{name:46s} x{count:<4d} " + " ".join(f"{ms:11.3f} {rate:8.0f}" for ms, rate in row))
    all_flops = sum(flops * count for _, flops, count, _ in cases)
    for lib in libraries:
        print(f"a step's GEMMs via {lib}: {totals[lib]:.1f} ms, {all_flops / totals[lib] / 1e9:.0f} TFLOP/s")
    if args.sequence > 0:
        del cases, a, b
        sequence_check(args, libraries, totals, all_flops, linears, values, t, hidden, vocab, chunk, chunks, layers)
    torch.backends.cuda.preferred_blas_library("cublas")


def sequence_check(args, libraries, totals, all_flops, linears, values, t, hidden, vocab, chunk, chunks, layers):
    """Micro-batches of GEMMs in a step's order, each layer with its own operands or all with layer 0's."""
    own = []  # per layer: {linear: (w, x, dy, grad)}
    for _ in range(layers):
        own.append({name: (values(n, k, scale=k ** -0.5), values(t, k), values(t, n, scale=1e-3),
                           torch.zeros(n, k, device="cuda")) for name, (k, n, _) in linears.items()})
    h, w = values(chunk, hidden), values(vocab, hidden, scale=hidden ** -0.5)
    logits = torch.empty(chunk, vocab, device="cuda")
    dlogits, wgrad = values(chunk, vocab, scale=1e-4), torch.zeros(vocab, hidden, device="cuda")
    order = list(linears)

    def micro_batch(operands):
        for layer in operands:
            for name in order:
                lw, lx, _, _ = layer[name]
                lx @ lw.t()
        for _ in range(chunks):
            torch.addmm(logits, h, w.t(), out_dtype=torch.float32, beta=0, out=logits)
            dlogits @ w
            torch.addmm(wgrad, dlogits.t(), h, out_dtype=torch.float32, out=wgrad)
        for layer in reversed(operands):
            for name in reversed(order):
                lw, lx, ldy, lgrad = layer[name]
                ldy @ lw
                torch.addmm(lgrad, ldy.t(), lx, out_dtype=torch.float32, out=lgrad)

    print(f"\nmicro-batches of GEMMs in a step's order, ~{args.sequence:g} s per library and operands "
          f"(ms a micro-batch; alone: the sum of the timings above)")
    print(f"{'library':9s} {'operands':9s} {'alone':>7s} {'median':>7s} {'first':>7s} {'last':>7s} "
          f"{'vs alone':>8s} {'TFLOP/s':>8s} {'n':>4s}  wall clock")
    for lib in libraries:
        torch.backends.cuda.preferred_blas_library(lib)
        for label, operands in (("own", own), ("layer 0", [own[0]] * layers)):
            micro_batch(operands)
            torch.cuda.synchronize()
            began, times = time.time(), []
            while time.time() - began < args.sequence:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                micro_batch(operands)
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end))
            median = sorted(times)[len(times) // 2]
            print(f"{lib:9s} {label:9s} {totals[lib]:7.1f} {median:7.1f} {times[0]:7.1f} {times[-1]:7.1f} "
                  f"{median / totals[lib]:8.3f} {all_flops / median / 1e9:8.0f} {len(times):4d}  "
                  f"{time.strftime('%H:%M:%S', time.gmtime(began))}-{time.strftime('%H:%M:%S', time.gmtime())} UTC")


if __name__ == "__main__":
    main()
