#!/usr/bin/env python3
"""Does a micro-batch of atoms give each atom the bits it gets alone?

Reproducible mode runs each atom (one sample at atoms of 1) as its own
forward and backward, so that its gradient does not depend on which other
samples share its micro-batch. Running a micro-batch of atoms as one launch
instead keeps those bits only where every kernel computes a row (a sample)
the same whatever the batch. This probe checks that for the pieces LibTorch
runs at a bench shape, in bf16 with deterministic algorithms on (as the mode
sets them), on random data:

  forward    X[B*T, K] W^T against each atom's X_a W^T      (cuBLAS, per linear layer)
  dgrad      dY[B*T, N] W against each atom's dY_a W         (cuBLAS)
  wgrad      bmm over atoms of dY_a^T X_a against each mm    (batched against single GEMMs)
  attention  SDPA causal, B sequences against each alone: output, dq, dk, dv (flash, deterministic)

Each line: equal bits, or the share of elements that differ and the largest
difference. The project's own kernels (RMSNorm, SwiGLU, rotary, cross-entropy)
compute each row on its own by construction and are not probed here.
On the GPU machine:  python3 bench/batch_invariance.py --shape 0.5b
"""
import argparse
import os

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before CUDA starts, as the trainer sets it

import torch
import torch.nn.functional as F

from bench import SHAPES  # bench.py's model shapes


def compare(name, whole, parts):
    """whole: the batched result; parts: each atom's alone, concatenated in the same layout."""
    if torch.equal(whole, parts):
        print(f"{name:44s} equal bits")
        return True
    differ = (whole != parts).float().mean().item()
    largest = (whole.float() - parts.float()).abs().max().item()
    print(f"{name:44s} DIFFER: {differ:.2%} of elements, largest difference {largest:.3g}")
    return False


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="0.5b")
    parser.add_argument("--atoms", type=int, default=4, help="atoms of one sample in a micro-batch")
    parser.add_argument("--seq", type=int, default=2048)
    args = parser.parse_args()
    torch.use_deterministic_algorithms(True)
    shape = SHAPES[args.shape]
    hidden, inter = shape["hidden_size"], shape["intermediate_size"]
    heads, kv_heads = shape["num_attention_heads"], shape["num_key_value_heads"]
    head_dim = hidden // heads
    b, t = args.atoms, args.seq
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, shape {args.shape}, {b} atoms of 1 x {t}")
    g = torch.Generator(device="cuda").manual_seed(0)

    def randn(*size, scale=1.0):
        return (torch.randn(*size, device="cuda", generator=g) * scale).to(torch.bfloat16)

    linears = {  # name: (in, out)
        "q/k/v": (hidden, hidden + 2 * kv_heads * head_dim),
        "o": (hidden, hidden),
        "gate/up": (hidden, 2 * inter),
        "down": (inter, hidden),
        "head (8192-row chunk of the vocabulary)": (hidden, 8192),
    }
    all_equal = True
    for name, (k, n) in linears.items():
        w = randn(n, k, scale=k ** -0.5)
        x = randn(b * t, k)
        dy = randn(b * t, n, scale=1e-3)
        all_equal &= compare(f"forward {name}", F.linear(x, w), torch.cat([F.linear(x[a * t:(a + 1) * t], w) for a in range(b)]))
        all_equal &= compare(f"dgrad {name}", dy @ w, torch.cat([dy[a * t:(a + 1) * t] @ w for a in range(b)]))
        xs, dys = x.view(b, t, k), dy.view(b, t, n)
        all_equal &= compare(f"wgrad {name} (bmm)", torch.bmm(dys.transpose(1, 2), xs),
                             torch.stack([dys[a].t() @ xs[a] for a in range(b)]))
    q = randn(b, heads, t, head_dim).requires_grad_()
    k_ = randn(b, kv_heads, t, head_dim).requires_grad_()
    v = randn(b, kv_heads, t, head_dim).requires_grad_()
    do = randn(b, heads, t, head_dim)

    def attention(q, k, v, do):
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return (o,) + torch.autograd.grad(o, (q, k, v), do)

    whole = attention(q, k_, v, do)
    alone = [attention(q[a:a + 1], k_[a:a + 1], v[a:a + 1], do[a:a + 1]) for a in range(b)]
    for i, part in enumerate(["output", "dq", "dk", "dv"]):
        all_equal &= compare(f"attention {part}", whole[i], torch.cat([r[i] for r in alone]))
    print("every piece gives each atom its own bits" if all_equal else "some pieces depend on the batch")


if __name__ == "__main__":
    main()
