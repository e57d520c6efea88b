#!/usr/bin/env python3
# Which of PyTorch's SDPA backends run a causal bf16 attention backward
# under torch.use_deterministic_algorithms(True), whether their bits repeat,
# and what a forward+backward costs at reproducible mode's atom shapes (one
# sequence of 2048) and at a micro-batch of 4. Times are wall time per call
# from Python, the host's launch cost included: compare backends, not kernels.
# On the GPU machine: python3 bench/sdpa_determinism.py
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
print("torch", torch.__version__, "cudnn", torch.backends.cudnn.version())
torch.use_deterministic_algorithms(True)
def run(backend, b, h, kvh, d, t, gqa_native):
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(b, h, t, d, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
    k = torch.randn(b, kvh, t, d, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
    v = torch.randn(b, kvh, t, d, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
    do = torch.randn(b, h, t, d, device="cuda", dtype=torch.bfloat16, generator=g)
    def attend():
        with sdpa_kernel(backend):
            if gqa_native:
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            r = h // kvh
            return F.scaled_dot_product_attention(q, k.repeat_interleave(r, 1), v.repeat_interleave(r, 1), is_causal=True)
    def step():
        o = attend()
        gq, gk, gv = torch.autograd.grad(o, (q, k, v), do)
        return o, gq, gk, gv
    try:
        ref = step()
    except Exception as e:
        return f"error: {str(e).splitlines()[0][:150]}"
    same = True
    for _ in range(3):
        out = step()
        same = same and all(torch.equal(a, b) for a, b in zip(ref, out))
    torch.cuda.synchronize()
    n = 20
    t0 = time.perf_counter()
    for _ in range(n): step()
    torch.cuda.synchronize()
    ms = (time.perf_counter() - t0) / n * 1e3
    # forward only
    t0 = time.perf_counter()
    with torch.no_grad():
        for _ in range(n): attend()
    torch.cuda.synchronize()
    fms = (time.perf_counter() - t0) / n * 1e3
    return f"fwd+bwd {ms:.3f} ms, fwd {fms:.3f} ms, repeatable bits: {same}"
for name, (b, h, kvh, d) in {"0.5b atom": (1, 14, 2, 64), "0.5b micro4": (4, 14, 2, 64), "3b atom": (1, 16, 2, 128)}.items():
    for backend in [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]:
        for native in [True, False]:
            print(name, backend.name, "gqa" if native else "repeat", run(backend, b, h, kvh, d, 2048, native), flush=True)
torch.use_deterministic_algorithms(False)
for backend in [SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION]:
    print("nondet 0.5b atom", backend.name, run(backend, 1, 14, 2, 64, 2048, False))
    print("nondet 0.5b micro4", backend.name, run(backend, 4, 14, 2, 64, 2048, False))
