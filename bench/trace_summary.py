#!/usr/bin/env python3
"""Where the device time of a Chrome trace went (PyTorch profiler / Kineto).

Reads a trace written by the trainer's run.profile_start or by
torch.profiler's export_chrome_trace, and prints, per step (--steps):
the device's busy and idle time over the span from the first to the last
kernel, the time by kind of kernel (GEMM, attention, the loss, the optimizer,
other elementwise and reductions, copies, collectives), the kernels that
took the most time, and the longest idle gaps with the kernel before each.

    python3 bench/trace_summary.py trace.json --steps 2 [--top 25] [--origin REGEX]

--origin REGEX: for the device events whose name matches, the host operators
that launched them (the innermost three, with the innermost's input shapes),
by time: where a kernel nobody asked for comes from. Kernels replayed from a
CUDA graph have no launching operator (they show as "graph replay").
--window A B: every device event that starts between A and B ms after the
trace's first, with its stream, and the host's waits for the device
(synchronize calls, .item()) over 0.2 ms: who waited for whom.
"""
import bisect
import argparse
import json
import re
from collections import defaultdict

KINDS = [  # first match wins; on the kernel's name
    ("collective", re.compile(r"nccl", re.I)),
    ("attention", re.compile(r"flash|fmha|attention|sdpa|cudnn", re.I)),
    ("gemm", re.compile(r"gemm|xmma|cutlass|nvjet|cublas|sm90_|matmul", re.I)),
    ("loss", re.compile(r"cross_entropy|softmax|log_softmax|nll|logsumexp", re.I)),
    ("optimizer", re.compile(r"adam|multi_tensor|foreach|fused_adam", re.I)),
    ("reduction", re.compile(r"reduce|norm", re.I)),
]


def kind_of(event):
    if event.get("cat") in ("gpu_memcpy", "gpu_memset"):
        return "copy/memset"
    for kind, pattern in KINDS:
        if pattern.search(event["name"]):
            return kind
    return "elementwise/other"


def short(name, width=110):
    name = re.sub(r"\s+", " ", name)
    return name if len(name) <= width else name[: width - 3] + "..."


def origins(events, device, pattern, n, top=20):
    """Time and count per launching host-operator stack of the device events matching `pattern`."""
    runtime = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {}):
            runtime[e["args"]["correlation"]] = e
    ops_by_thread = defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "cpu_op":
            ops_by_thread[(e.get("pid"), e.get("tid"))].append(e)
    parents, starts = {}, {}
    for key, ops in ops_by_thread.items():
        ops.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack, parent = [], []
        for i, op in enumerate(ops):
            while stack and ops[stack[-1]]["ts"] + ops[stack[-1]]["dur"] < op["ts"] + op["dur"]:
                stack.pop()
            parent.append(stack[-1] if stack else -1)
            stack.append(i)
        parents[key], starts[key] = parent, [op["ts"] for op in ops]
    table = defaultdict(lambda: [0.0, 0])
    for e in device:
        if not pattern.search(e["name"]):
            continue
        launch = runtime.get(e.get("args", {}).get("correlation"))
        where = "graph replay" if launch is not None and "Graph" in launch["name"] else "no host operator"
        if launch is not None:
            key = (launch.get("pid"), launch.get("tid"))
            ops = ops_by_thread.get(key, [])
            i = bisect.bisect_right(starts.get(key, []), launch["ts"]) - 1
            while i >= 0 and ops[i]["ts"] + ops[i]["dur"] < launch["ts"]:
                i = parents[key][i]
            chain = []
            while i >= 0 and len(chain) < 3:
                chain.append(ops[i])
                i = parents[key][i]
            if chain:
                dims = chain[0].get("args", {}).get("Input Dims", "")
                where = " < ".join(op["name"] for op in chain) + f" {dims}"
        table[(short(e["name"], 50), short(where, 150))][0] += e["dur"]
        table[(short(e["name"], 50), short(where, 150))][1] += 1
    print(f"origins of {pattern.pattern!r} (ms per step, calls per step; kernel | innermost operators < outer):")
    for (name, where), (dur, count) in sorted(table.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"  {dur / n / 1e3:8.2f} {count / n:6.0f}  {name} | {where}")


def window(events, device, origin, first_ms, last_ms):
    """The device events starting in [first_ms, last_ms] after `origin`, and the host's waits there."""
    at = lambda e: (e["ts"] - origin) / 1e3
    print(f"device events from {first_ms} to {last_ms} ms (start ms, duration ms, stream, name):")
    for e in device:
        if first_ms <= at(e) <= last_ms:
            print(f"  {at(e):9.2f} {e['dur'] / 1e3:7.2f}  s{e.get('args', {}).get('stream', '?')}  {short(e['name'], 80)}")
    print("host waits over 0.2 ms (start ms, duration ms, call):")
    for e in events:
        if (e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cpu_op") and e["dur"] > 200
                and re.search(r"Synchronize|aten::item|_local_scalar_dense", e["name"])
                and first_ms <= at(e) + e["dur"] / 1e3 and at(e) <= last_ms):
            print(f"  {at(e):9.2f} {e['dur'] / 1e3:7.2f}  {e['name']}")


def merged(spans):
    """The union of [begin, end) spans, as sorted disjoint spans."""
    out = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def overlap(left, right):
    """The length of the intersection of two lists of sorted disjoint spans."""
    total, i, j = 0.0, 0, 0
    while i < len(left) and j < len(right):
        total += max(0.0, min(left[i][1], right[j][1]) - max(left[i][0], right[j][0]))
        if left[i][1] < right[j][1]:
            i += 1
        else:
            j += 1
    return total


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace")
    parser.add_argument("--steps", type=int, default=1, help="steps the trace holds (figures are per step)")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--origin", help="a regular expression: the host operators that launched matching kernels")
    parser.add_argument("--window", nargs=2, type=float, metavar=("A", "B"),
                        help="list the device events and host waits between A and B ms after the first event")
    args = parser.parse_args()
    with open(args.trace) as f:
        events = json.load(f)["traceEvents"]
    device = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    n = args.steps
    print(f"== {args.trace}")
    if not device:
        print("no device events (a CPU trace?)")
        return
    device.sort(key=lambda e: e["ts"])
    begin, end = device[0]["ts"], max(e["ts"] + e["dur"] for e in device)
    busy, gaps, cursor, before = 0.0, [], begin, None
    for e in device:
        if e["ts"] > cursor:
            gaps.append((e["ts"] - cursor, before, e["name"]))
        start = max(cursor, e["ts"])
        stop = e["ts"] + e["dur"]
        if stop > start:
            busy += stop - start
            cursor = stop
        before = e["name"]
    span = end - begin
    print(f"per step: span {span / n / 1e3:.2f} ms, device busy {busy / n / 1e3:.2f} ms, idle {(span - busy) / n / 1e3:.2f} ms "
          f"({(span - busy) / span:.1%}); {len(device) / n:.0f} device events")
    by_kind = defaultdict(lambda: [0.0, 0])
    by_name = defaultdict(lambda: [0.0, 0])
    for e in device:
        by_kind[kind_of(e)][0] += e["dur"]
        by_kind[kind_of(e)][1] += 1
        by_name[e["name"]][0] += e["dur"]
        by_name[e["name"]][1] += 1
    total = sum(v[0] for v in by_kind.values())
    print("by kind (ms per step, share of kernel time, events per step):")
    for kind, (dur, count) in sorted(by_kind.items(), key=lambda kv: -kv[1][0]):
        print(f"  {kind:18s} {dur / n / 1e3:8.2f} {dur / total:6.1%} {count / n:7.0f}")
    print(f"top {args.top} kernels (ms per step, calls per step, mean us):")
    for name, (dur, count) in sorted(by_name.items(), key=lambda kv: -kv[1][0])[: args.top]:
        print(f"  {dur / n / 1e3:8.2f} {count / n:6.0f} {dur / count:9.1f}  {short(name)}")
    bins = [(0, 5), (5, 20), (20, 100), (100, 1000), (1000, float("inf"))]
    print("idle by gap length (us: ms per step, gaps per step):")
    for low, high in bins:
        inside = [g[0] for g in gaps if low <= g[0] < high]
        print(f"  [{low}, {high}) {sum(inside) / n / 1e3:8.3f} {len(inside) / n:7.0f}")
    streams = defaultdict(list)
    for e in device:
        streams[e.get("args", {}).get("stream", "?")].append((e["ts"], e["ts"] + e["dur"]))
    if len(streams) > 1:
        print("by stream (ms per step of its own events; of that, ms while another stream ran):")
        for stream, spans in sorted(streams.items(), key=lambda kv: -sum(b - a for a, b in kv[1])):
            others = merged([s for k, v in streams.items() if k != stream for s in v])
            own = sum(b - a for a, b in spans)
            print(f"  stream {stream}: {own / n / 1e3:8.2f} ms, {overlap(merged(spans), others) / n / 1e3:8.2f} "
                  f"ms overlapped, {len(spans) / n:.0f} events")
    gaps.sort(key=lambda g: -g[0])
    print(f"idle gaps: {len(gaps) / n:.0f} per step; the longest (us, kernel before -> after):")
    for gap, before, after in gaps[:10]:
        print(f"  {gap:9.1f}  {short(before or '-', 60)} -> {short(after, 60)}")
    if args.origin:
        origins(events, device, re.compile(args.origin), n)
    if args.window:
        window(events, device, begin, *args.window)


if __name__ == "__main__":
    main()
