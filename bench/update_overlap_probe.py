#!/usr/bin/env python3
"""Can an optimizer update hide behind a forward's GEMMs on one GPU?

The eighth round's profile (bench/README) found ddp's `overlap_update`
alternating with the forward instead of running beside it: cuBLAS's GEMMs
hold every SM, so the bandwidth-bound update only runs between them. This
probe measures, in PyTorch alone, what the device can do:

  gemm      the 3B shape's block GEMMs (micro-batch 4 x 2048 tokens), --blocks blocks
  update    fused AdamW (torch._fused_adamw_) over --params million fp32
            parameters in --pieces pieces, as the update's units would be
  both      the two launched together, the update on a second stream
            (normal, then high priority)

and, where PyTorch has torch._C._set_sm_carveout_experimental, the same
with the GEMMs told to leave k SMs free (cuBLAS's SM count target): the
update's blocks then have SMs of their own. "hidden" is gemm + update -
both: the milliseconds of the update that cost nothing. Each figure is
the median of --reps timed repetitions (CUDA events), after two warm-ups.

    python3 bench/update_overlap_probe.py [--params 1000] [--carveouts 8,16,32]
"""
import argparse
import statistics

import torch


def timed(fn, reps):
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=int, default=1000, help="million fp32 parameters the update reads and writes")
    parser.add_argument("--pieces", type=int, default=37, help="update launches (the 3B model's units)")
    parser.add_argument("--blocks", type=int, default=12, help="decoder blocks of GEMMs")
    parser.add_argument("--carveouts", default="8,16,32", help="SMs the GEMMs leave free, comma-separated")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    device = torch.device("cuda")
    tokens, hidden, inter, qkv = 8192, 2048, 11008, 2560
    bf16 = dict(device=device, dtype=torch.bfloat16)
    x = torch.randn(tokens, hidden, **bf16)
    act = torch.randn(tokens, inter, **bf16)
    weights = [torch.randn(hidden, qkv, **bf16) / 50, torch.randn(hidden, hidden, **bf16) / 50,
               torch.randn(hidden, 2 * inter, **bf16) / 50, torch.randn(inter, hidden, **bf16) / 50]
    outs = [torch.empty(tokens, w.shape[1], **bf16) for w in weights]

    def gemm():
        for _ in range(args.blocks):
            torch.mm(x, weights[0], out=outs[0])
            torch.mm(x, weights[1], out=outs[1])
            torch.mm(x, weights[2], out=outs[2])
            torch.mm(act, weights[3], out=outs[3])

    n = args.params * 1_000_000 // args.pieces
    fp32 = dict(device=device, dtype=torch.float32)
    state = [[torch.randn(n, **fp32) for _ in range(args.pieces)] for _ in range(4)]  # params, grads, m, v
    for v in state[3]:
        v.abs_()
    steps = [torch.tensor(1.0, **fp32) for _ in range(args.pieces)]

    def update():
        for i in range(args.pieces):
            torch._fused_adamw_([state[0][i]], [state[1][i]], [state[2][i]], [state[3][i]], [], [steps[i]],
                                lr=1e-4, beta1=0.9, beta2=0.95, weight_decay=0.1, eps=1e-8, amsgrad=False,
                                maximize=False)

    def both(priority):
        side = torch.cuda.Stream(priority=priority)

        def run():
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                update()
            gemm()
            torch.cuda.current_stream().wait_stream(side)

        return run

    props = torch.cuda.get_device_properties(device)
    print(f"{props.name}, {props.multi_processor_count} SMs; update: {args.params}M parameters in {args.pieces} "
          f"pieces (~{16 * args.params / 1000:.0f} GB of fp32 state); GEMMs: {args.blocks} blocks of the 3B shape")
    update_ms = timed(update, args.reps)
    terabytes_per_second = 28 * args.params * 1e6 / (update_ms * 1e-3) / 1e12
    print(f"update alone: {update_ms:.2f} ms ({terabytes_per_second:.2f} TB/s at 28 bytes a parameter)")
    carve = getattr(torch._C, "_set_sm_carveout_experimental", None)
    rows = [0] + [int(k) for k in args.carveouts.split(",") if k and carve is not None]
    if carve is None:
        print("torch._C._set_sm_carveout_experimental is absent in this PyTorch: no carve-out rows")
    print("| SMs left free | gemm ms | both ms (normal) | hidden ms | both ms (high priority) | hidden ms |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for k in rows:
        if carve is not None:
            try:
                carve(k if k > 0 else None)
            except (RuntimeError, TypeError) as error:
                print(f"carve-out {k}: {error}")
                break
        gemm_ms = timed(gemm, args.reps)
        normal = timed(both(0), args.reps)
        high = timed(both(-1), args.reps)
        print(f"| {k} | {gemm_ms:.2f} | {normal:.2f} | {gemm_ms + update_ms - normal:.2f} | {high:.2f} "
              f"| {gemm_ms + update_ms - high:.2f} |")
    if carve is not None:
        carve(None)


if __name__ == "__main__":
    main()
