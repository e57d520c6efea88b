#!/usr/bin/env python3
"""A scaling model: predicted step time and scaling efficiency of ddp, zero1/2/3 and hybrid sharding.

Weak scaling: every GPU keeps the one-GPU micro-batch (4 x 2048 tokens, one
micro-step per step), so the global batch grows with the GPU count and the
compute time per step stays the one measured on one H200 (bench/README.md,
trainer ddp at one rank). What changes is communication, predicted from

- the bytes each strategy moves per step, as the code moves them:
    ddp     all-reduce of the fp32 gradient (4 N), in 25 MB buckets
    zero1   reduce-scatter of the fp32 gradient at the boundary (4 N) and
            all-gather of the updated fp32 parameters (4 N)
    zero2   reduce of each 25 MB bucket to its shards' owners during
            backward (4 N) and the same all-gather (4 N)
    zero3   all-gather of each unit in bf16 before its forward and again
            before its backward (2 N + 2 N) and reduce-scatter of its fp32
            gradient (4 N); units: the embedding, each block, the head
    hybrid  zero3 within each node of 8 GPUs (the above over NVLink) and,
            in the last backward, an all-reduce of each unit's 1/8 piece
            of the fp32 gradient shard across nodes (shard_group_size = 8;
            FSDP2's HSDP, ZeRO++'s hpZ)
- ring collective formulas: an all-reduce of S bytes over P ranks moves
  2 (P-1)/P S per GPU, a reduce-scatter or all-gather (P-1)/P S, each at the
  slowest link's bandwidth, plus a latency per collective of 2 (P-1) hops for
  rings within a node and 2 log2(P) for NCCL's trees across nodes;
- stated links: NVLink within a node of 8 at 360 GB/s of bus bandwidth per
  GPU (what NCCL reaches on H200 of 450 GB/s per direction), 400 Gb/s per
  GPU across nodes at 90% (45 GB/s); 5 us per hop within a node, 15 us
  across;
- the overlap the code has now: ddp's bucket all-reduces and zero2's bucket
  reduces run behind backward (two thirds of the step's compute) except the
  last bucket's; zero1's collectives are exposed; zero3 prefetches one unit
  (forward: the next unit's gather behind this one's compute, a third of the
  step; backward: the previous unit's gather and this unit's reduce-scatter
  behind backward), so it exposes the first unit's gather, the last unit's
  reduce-scatter and whatever exceeds the compute it hides behind; hybrid
  adds the cross-node all-reduce of each unit's piece behind backward (on
  the network, beside NVLink's traffic), exposing the last unit's. The
  core's own per-step collectives (token count, loss, stop flag: three of
  16 bytes) are exposed latency.

    python3 bench/scaling.py [--gpus 8,64,512,4096]
"""
import argparse
import math

SHAPES = {  # parameters, units (blocks + embedding + head), one-GPU step time of trainer ddp (8192 tokens, bench/README.md)
    "0.5b": (0.494e9, 24 + 2, 8192 / 115410),
    "3b": (3.086e9, 36 + 2, 8192 / 25103),
}
NODE = 8
NVLINK = 360e9  # bytes/s of bus bandwidth per GPU within a node
NETWORK = 0.9 * 400e9 / 8  # bytes/s per GPU across nodes
HOP_NODE, HOP_NETWORK = 5e-6, 15e-6
BUCKET = 25 * 2**20
BACKWARD_SHARE = 2 / 3


def collective(kind, size, ranks, across_nodes):
    """Seconds of one collective of `size` bytes over `ranks` GPUs (ring bandwidth term, ring or tree latency)."""
    if ranks <= 1:
        return 0.0
    factor = 2 * (ranks - 1) / ranks if kind == "all-reduce" else (ranks - 1) / ranks
    bandwidth = NETWORK if across_nodes else NVLINK
    hops = 2 * math.log2(ranks) if across_nodes else 2 * (ranks - 1)
    return factor * size / bandwidth + hops * (HOP_NETWORK if across_nodes else HOP_NODE)


def in_buckets(kind, total, ranks, across):
    """(all buckets' time, the last bucket's time): a collective per 25 MB bucket."""
    count = max(1, math.ceil(total / BUCKET))
    one = collective(kind, total / count, ranks, across)
    return count * one, one


def zero3_exposed(n, units, compute, ranks, across):
    """Seconds of zero3's communication not hidden by compute, prefetching one unit."""
    gather = collective("all-gather", 2 * n / units, ranks, across)  # one unit's, bf16
    reduce = collective("reduce-scatter", 4 * n / units, ranks, across)  # one unit's, fp32
    forward, backward = (1 - BACKWARD_SHARE) * compute, BACKWARD_SHARE * compute
    exposed_forward = gather + max(0.0, (units - 1) * gather - forward)
    exposed_backward = max(0.0, units * gather + (units - 1) * reduce - backward) + reduce
    return exposed_forward + exposed_backward


def step_time(strategy, n, units, compute, gpus):
    across = gpus > NODE
    backward = BACKWARD_SHARE * compute
    core = 3 * collective("all-reduce", 16, gpus, across)
    if strategy == "ddp":
        total, last = in_buckets("all-reduce", 4 * n, gpus, across)
        exposed = max(0.0, total - last - backward) + last
    elif strategy == "zero1":
        exposed = collective("reduce-scatter", 4 * n, gpus, across) + collective("all-gather", 4 * n, gpus, across)
    elif strategy == "zero2":
        total, last = in_buckets("reduce-scatter", 4 * n, gpus, across)  # a reduce per owner moves what a reduce-scatter does
        exposed = max(0.0, total - last - backward) + last + collective("all-gather", 4 * n, gpus, across)
    elif strategy == "zero3":
        exposed = zero3_exposed(n, units, compute, gpus, across)
    elif strategy == "hybrid":
        exposed = zero3_exposed(n, units, compute, min(gpus, NODE), False)
        if gpus > NODE:
            piece = collective("all-reduce", 4 * n / NODE / units, gpus // NODE, True)  # one unit's piece of the shard
            exposed += max(0.0, (units - 1) * piece - backward) + piece
    else:
        raise ValueError(strategy)
    return compute + exposed + core


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", default="8,64,512,4096")
    args = parser.parse_args()
    gpus = [int(g) for g in args.gpus.split(",")]
    strategies = ["ddp", "zero1", "zero2", "zero3", "hybrid"]
    for shape, (n, units, compute) in SHAPES.items():
        print(f"\n{shape} shape ({n / 1e9:.3f}B parameters), measured one-GPU step {compute * 1000:.0f} ms; "
              f"predicted step ms (scaling efficiency)")
        print("| strategy | " + " | ".join(f"{g} GPUs" for g in gpus) + " |")
        print("| --- | " + " | ".join("---:" for _ in gpus) + " |")
        for strategy in strategies:
            cells = []
            for g in gpus:
                t = step_time(strategy, n, units, compute, g)
                cells.append(f"{t * 1000:.0f} ({compute / t:.0%})")
            print(f"| {strategy} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
