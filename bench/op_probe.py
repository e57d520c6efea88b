#!/usr/bin/env python3
"""Times the candidate building blocks of a decoder block at the bench shapes on one GPU
(composite against fused forms), to decide which fused operations pay. Prints one line per variant."""
import torch, torch.nn.functional as F, sys

def bench(fn, reps=20):
    for _ in range(3): fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(reps): fn()
    e.record(); torch.cuda.synchronize()
    return s.elapsed_time(e) / reps

def rms_composite(x, w, eps=1e-6):
    xf = x.float()
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)

for name, H, I, nh, nkv in (("0.5b", 896, 4864, 14, 2), ("3b", 2048, 11008, 16, 2)):
    T, b, t, d = 8192, 4, 2048, H // nh
    x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.ones(H, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn(T, H, device="cuda", dtype=torch.bfloat16)
    print(name, "rms composite fwd+bwd ms", bench(lambda: rms_composite(x, w).backward(g)))
    print(name, "rms F.rms_norm fwd+bwd ms", bench(lambda: F.rms_norm(x, (H,), w, 1e-6).backward(g)))
    q = torch.randn(b, nh, t, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(b, nkv, t, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(b, nkv, t, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    go = torch.randn(b, nh, t, d, device="cuda", dtype=torch.bfloat16)
    rep = lambda: F.scaled_dot_product_attention(q, k.repeat_interleave(nh // nkv, 1), v.repeat_interleave(nh // nkv, 1), is_causal=True).backward(go)
    gqa = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).backward(go)
    print(name, "sdpa repeat_interleave fwd+bwd ms", bench(rep))
    try:
        print(name, "sdpa enable_gqa fwd+bwd ms", bench(gqa))
    except Exception as err: print(name, "sdpa enable_gqa failed", err)
    from torch.nn.attention import sdpa_kernel, SDPBackend
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):
        try:
            with sdpa_kernel([backend]):
                print(name, backend, "repeat ms", bench(rep))
        except Exception as err: print(name, backend, "repeat failed", str(err)[:80])
        try:
            with sdpa_kernel([backend]):
                print(name, backend, "gqa ms", bench(gqa))
        except Exception as err: print(name, backend, "gqa failed", str(err)[:80])
    a = torch.randn(T, 2 * I, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    gd = torch.randn(T, I, device="cuda", dtype=torch.bfloat16)
    print(name, "swiglu composite fwd+bwd ms", bench(lambda: (F.silu(a[:, :I]) * a[:, I:]).backward(gd)))
    W = torch.randn(I, H, device="cuda", dtype=torch.bfloat16); X = torch.randn(T, H, device="cuda", dtype=torch.bfloat16)
    Gy = torch.randn(T, I, device="cuda", dtype=torch.bfloat16); acc = torch.zeros(I, H, device="cuda")
    print(name, "wgrad bf16 mm + fp32 add ms", bench(lambda: acc.add_(Gy.t() @ X)))
    try:
        print(name, "wgrad addmm out_dtype fp32 ms", bench(lambda: torch.addmm(acc, Gy.t(), X, out_dtype=torch.float32, out=acc)))
    except Exception as err: print(name, "addmm out_dtype failed", str(err)[:120])
    n = 494_000_000 if name == "0.5b" else 3_090_000_000
    p = torch.randn(n, device="cuda"); gr = torch.randn(n, device="cuda"); m = torch.zeros(n, device="cuda"); vv = torch.zeros(n, device="cuda")
    st = torch.tensor(1.0, device="cuda")
    print(name, "fused adamw ms", bench(lambda: torch._fused_adamw_([p], [gr], [m], [vv], [], [st], lr=1e-4, beta1=0.9, beta2=0.999, weight_decay=0.1, eps=1e-8, amsgrad=False, maximize=False), 5))
    print(name, "norm fp64 copy ms", bench(lambda: gr.double().square().sum().item(), 5))
    print(name, "norm chunked fp32 ms", bench(lambda: torch.linalg.vector_norm(gr[: n // 65536 * 65536].view(-1, 65536), dim=1).double().square().sum().item(), 5))
    del p, gr, m, vv
    torch.cuda.empty_cache()
