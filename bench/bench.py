#!/usr/bin/env python3
"""Training speed and memory on one GPU: trainer (ddp, zero3) against Hugging Face Qwen2.

Shapes (random init; 0.5b and 3b with tied embeddings and vocab 151936):
  0.5b  Qwen2-0.5B: hidden 896, 24 layers, 14 heads, 2 key/value heads, intermediate 4864
  3b    hidden 2048, 36 layers, 16 heads, 2 key/value heads, intermediate 11008
  8b    Llama-3-8B: hidden 4096, 32 layers, 32 heads, 8 key/value heads, intermediate 14336,
        vocab 128256, untied, rope theta 500000, no q/k/v biases (the peer: LlamaForCausalLM)
Batch: micro-batch 4 x sequence 2048 random tokens, no accumulation (--accumulation N: N
micro-batches a step for every arm, the trainer's training.grad_accum_steps and the
peer's loop of N forward/backward passes before its update, each loss divided by N).
Precision: bf16 compute, fp32 master weights, fp32 gradients and AdamW state
(trainer's training.precision = "bf16"; Hugging Face: fp32 parameters under
torch.autocast(bfloat16), the usual mixed precision), SDPA attention, AdamW,
clipping at 1.0.

Arms, each its own process, all in one run:
  eager            HF Qwen2ForCausalLM, torch.optim.AdamW (foreach)
  eager-fused      the same with AdamW(fused=True)
  compile-fused    the model and the loss under torch.compile, AdamW(fused=True):
                   what a user would do instead of this trainer; the baseline of every ratio
  ddp, zero3       trainer run with strategy ddp / zero3
  NAME=KEY=V;...   a trainer arm with recipe overrides (the strategy ddp, or NAME's
                   where NAME is ddp, zero1, zero2 or zero3), e.g.
                   ckpt=model.activation_checkpointing=full
  NAME@PATH[=...]  the same arm run by the trainer binary at PATH: two builds side
                   by side in one round-robin run (the row: NAME-<PATH's build folder>)
The first --warmup steps are left out of the timing: the wall time from the
end of the last warm-up step to the end of the last step, every kernel of
those steps finished (HF: torch.cuda.synchronize; trainer: the step_seconds of
metrics.jsonl, whose steps end when the update's kernels have).
--profile DIR records two steps after the warm-up of every arm with the
PyTorch profiler (Chrome traces DIR/ARM.json; the trainer's run.profile_start)
and prints where the device time went (bench/trace_summary.py). MFU = (6 N + 12 L H T)
FLOPs per token x tokens/s / the bf16 matmul rate measured at the start of
the run. Peak memory is nvidia-smi's figure for each process (sampled every
50 ms), the same measurement for every arm; beside it the caching
allocator's own peaks (allocated, reserved: torch.cuda's for Hugging Face,
metrics.jsonl's for the trainer) show what the tensors need and what
fragmentation adds. Run from the project root:

    python3 bench/bench.py --trainer build-gpu/bin/trainer --shape 0.5b

Each run's figure is printed to stderr as it ends (a run cut short by a
time limit keeps them), and --json keeps every run. Three runs per arm that
do not fit one call's time limit: one run per call on the same machine,
each with --json and the same --commit (a copied tree's git metadata may
lag), then `bench.py --merge A.json B.json C.json` prints the table of
all of them (the median and spread per arm; the matmul rate the files'
median). --merge needs neither torch nor numpy.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

try:
    import numpy as np
    import torch
except ImportError:  # --merge needs neither
    np = torch = None

COMMON = dict(vocab_size=151936, rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
              max_position_embeddings=32768)
SHAPES = {
    "0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2, **COMMON),
    "3b": dict(hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16,
               num_key_value_heads=2, **COMMON),
    "8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=8, vocab_size=128256, rope_theta=500000.0, rms_norm_eps=1e-5,
               tie_word_embeddings=False, max_position_embeddings=8192, attention_bias=False),
}
# The Hugging Face class of each shape: Qwen2's q/k/v carry biases, Llama's do not.
FAMILY = {"0.5b": "Qwen2", "3b": "Qwen2", "8b": "Llama"}


def matmul_rate():
    """Dense bf16 matmul FLOP/s on this GPU (8192^3 on random data, median of 20)."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(5):
        a @ b
    times = []
    for _ in range(20):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        a @ b
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1000)
    del a, b
    torch.cuda.empty_cache()
    return 2 * 8192 ** 3 / sorted(times)[len(times) // 2]


def flops_per_token(config, seq):
    """6 N for the weights plus attention's 12 L H T (PaLM, appendix B). N counts the head's vocab x hidden
    once: a tied embedding is that matrix, an untied one is a lookup (no FLOPs). Returns the FLOPs per token
    and the parameter count (an untied embedding's matrix included)."""
    h, kv = config["hidden_size"], config["num_key_value_heads"] * config["hidden_size"] // config["num_attention_heads"]
    per_layer = h * h * 2 + h * kv * 2 + 3 * h * config["intermediate_size"]
    n = config["num_hidden_layers"] * per_layer + config["vocab_size"] * h
    untied = 0 if config["tie_word_embeddings"] else config["vocab_size"] * h
    return 6 * n + 12 * config["num_hidden_layers"] * h * seq, n + untied


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


def run_trainer(args, config, work, name, strategy, overrides, trainer=None):
    out = os.path.join(work, f"run-{name}")
    recipe = os.path.join(work, f"{name}.toml")
    model = "\n".join(f"{k} = {str(v).lower() if isinstance(v, bool) else v}" for k, v in config.items())
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
vocab_size = {config['vocab_size']}
[training]
steps = {args.steps}
micro_batch_size = {args.micro_batch}
grad_accum_steps = {args.accumulation}
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
    overrides = [f"run.peak_tflops={args.peak_tflops}"] + overrides
    if args.profile:
        overrides += [f"run.profile_start={args.warmup + 1}", "run.profile_steps=2"]
    command = [trainer or args.trainer, "run", recipe] + [a for o in overrides for a in ("--set", o)]
    process = subprocess.Popen(command, stdout=sys.stderr, stderr=sys.stderr)
    memory = PeakMemory(process.pid)
    if process.wait() != 0:
        print(f"trainer arm {name} failed", file=sys.stderr)
        memory.stop()
        return None
    peak = memory.stop()
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    allocator = (max(r["memory_allocated_bytes"] for r in rows) / 2**30, max(r["memory_reserved_bytes"] for r in rows) / 2**30)
    if args.profile:
        shutil.copy(os.path.join(out, "profile", "trace.json"), os.path.join(args.profile, f"{name}.json"))
    # The profiled steps are timed too: leave them out with the warm-up.
    skip = args.warmup + (2 if args.profile else 0)
    seconds = sum(r["step_seconds"] for r in rows[skip:])
    timed = len(rows[skip:])
    if timed:  # the host's collation inside each timed step, beside the step itself
        data = sum(r.get("data_seconds", 0.0) for r in rows[skip:])
        print(f"{name}: {seconds / timed * 1e3:.2f} ms a step, of which collating the batch {data / timed * 1e3:.3f} ms",
              file=sys.stderr)
    return sum(r["input_tokens"] for r in rows[skip:]) / seconds, peak, rows[-1]["loss"], allocator


HUGGING_FACE = r"""
import sys, time, torch
from transformers import FAMILYConfig as Config, FAMILYForCausalLM as ForCausalLM
config = Config(**CONFIG, attn_implementation="sdpa")
torch.manual_seed(0)
model = ForCausalLM(config).cuda().train()
if CHECKPOINTING:
    model.gradient_checkpointing_enable()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, fused=FUSED)
tokens = torch.randint(0, config.vocab_size, (STEPS, ACCUMULATION, MICRO, SEQ + 1), device="cuda")

def loss_of(batch):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(batch[:, :-1], use_cache=False).logits  # a training forward builds no KV cache
    return torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())

if COMPILE:
    loss_of = torch.compile(loss_of, mode=MODE)
PROFILE = PROFILE_PATH
profiler = None
for step in range(STEPS):
    if step == WARMUP and PROFILE:
        torch.cuda.synchronize()
        profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                      torch.profiler.ProfilerActivity.CUDA], record_shapes=True)
        profiler.__enter__()
    if step == WARMUP + (2 if PROFILE else 0):
        torch.cuda.synchronize(); start = time.perf_counter()
    for micro in range(ACCUMULATION):  # the mean over the step's micro-batches (of equal token counts)
        loss = loss_of(tokens[step, micro]) / ACCUMULATION
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if profiler is not None and step == WARMUP + 1:
        torch.cuda.synchronize(); profiler.__exit__(None, None, None); profiler.export_chrome_trace(PROFILE)
    if step % 5 == 0: print(f"NAME step {step + 1}: loss {loss.item() * ACCUMULATION:.4f}", file=sys.stderr)
torch.cuda.synchronize()
print(time.perf_counter() - start, loss.item() * ACCUMULATION, torch.cuda.max_memory_allocated() / 2**30, torch.cuda.max_memory_reserved() / 2**30)
"""


def run_hugging_face(args, config, name, fused, compiled, mode=None):
    code = (HUGGING_FACE.replace("CONFIG", repr(config)).replace("STEPS", str(args.steps))
            .replace("MICRO", str(args.micro_batch)).replace("ACCUMULATION", str(args.accumulation))
            .replace("SEQ", str(args.seq)).replace("WARMUP", str(args.warmup))
            .replace("FUSED", str(fused)).replace("COMPILE", str(compiled)).replace("MODE", repr(mode))
            .replace("NAME", name).replace("FAMILY", FAMILY[args.shape])
            .replace("CHECKPOINTING", str(args.hf_checkpointing))
            .replace("PROFILE_PATH", repr(os.path.join(args.profile, f"{name}.json") if args.profile else "")))
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=sys.stderr, text=True)
    memory = PeakMemory(process.pid)
    out, _ = process.communicate()
    peak = memory.stop()
    if process.returncode != 0:
        print(f"{name} failed", file=sys.stderr)
        return None
    seconds, loss, allocated, reserved = (float(x) for x in out.strip().splitlines()[-1].split())
    timed = args.steps - args.warmup - (2 if args.profile else 0)
    return timed * args.accumulation * args.micro_batch * args.seq / seconds, peak, loss, (allocated, reserved)


def report(args, runs, peak, device, runs_per_arm):
    """Prints the table of `runs` (arm -> one result per run) and writes it to --json; returns arm -> median run."""
    per_token, params = flops_per_token(SHAPES[args.shape], args.seq)
    # Per arm: the run of median speed (its memory and loss beside it), and
    # the spread of the speeds; an arm with a failed run is reported failed.
    results, spreads = {}, {}
    for name, results_of_arm in runs.items():
        if any(r is None for r in results_of_arm):
            results[name] = None
            continue
        ordered = sorted(results_of_arm, key=lambda r: r[0])
        results[name] = ordered[len(ordered) // 2]
        spreads[name] = [r[0] for r in results_of_arm]
    accumulation = f", {args.accumulation} micro-batches a step" if args.accumulation > 1 else ""
    print(f"\n{FAMILY[args.shape]} {args.shape} shape: {params / 1e9:.3f}B parameters, bf16, micro-batch {args.micro_batch} x "
          f"{args.seq} tokens{accumulation}, {device}, measured bf16 matmul {peak / 1e12:.0f} TFLOP/s, "
          f"commit {args.commit}, {runs_per_arm} run(s) per arm (tokens/s: the median, then min-max)")
    # The peer: the faster of the compiled Hugging Face arms.
    peers = [r for n, r in results.items() if n in ("compile-fused", "compile-autotune") and r is not None]
    base = max(peers, key=lambda r: r[0]) if peers else None
    # The datasheet's dense bf16 peak (the field's MFU convention), for the devices this table knows.
    datasheet = next((v for k, v in (("H200", 989.4e12), ("H100 PCIe", 756e12), ("H100", 989.4e12), ("A100", 312e12))
                      if k in device), 0.0)
    print(f"| run | tokens/s | vs peer | MFU (measured) | MFU (datasheet) | peak GiB | vs peer | allocated / reserved GiB "
          f"| last loss |")
    print(f"| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    table = []
    for name, result in results.items():
        if result is None:
            print(f"| {name} | failed | | | | | | | |")
            continue
        speed, memory, loss, (allocated, reserved) = result
        ratio = f"{speed / base[0]:.2f}x" if base else "-"
        memory_ratio = f"{memory / base[1]:.2f}x" if base else "-"
        sheet = f"{speed * per_token / datasheet:.1%}" if datasheet else "-"
        spread = spreads[name]
        shown = f"{speed:.0f}" + (f" ({min(spread):.0f}-{max(spread):.0f})" if len(spread) > 1 else "")
        print(f"| {name} | {shown} | {ratio} | {speed * per_token / peak:.1%} | {sheet} | {memory:.1f} "
              f"| {memory_ratio} | {allocated:.1f} / {reserved:.1f} | {loss:.4f} |")
        table.append(dict(run=name, tokens_per_second=speed, runs_tokens_per_second=spread,
                          mfu=speed * per_token / peak,
                          mfu_datasheet=speed * per_token / datasheet if datasheet else None, peak_gib=memory,
                          loss=loss, allocated_gib=allocated, reserved_gib=reserved))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(shape=args.shape, commit=args.commit, runs=runs_per_arm, matmul_tflops=peak / 1e12,
                           device=device, seq=args.seq, micro_batch=args.micro_batch,
                           accumulation=args.accumulation, parameters=params, rows=table,
                           every_run={name: [list(r[:3]) + [list(r[3])] if r else None for r in results_of_arm]
                                      for name, results_of_arm in runs.items()}), f, indent=1)
    return results


def merge(args):
    """--merge: one table from the every_run lists of several --json files of one shape and commit (runs of
    one machine made by several calls, each under a time limit); the matmul rate is the files' median."""
    tables = []
    for path in args.merge:
        try:
            with open(path) as f:
                tables.append(json.load(f))
        except (OSError, ValueError) as error:
            print(f"{path}: {error}", file=sys.stderr)
            sys.exit(2)
        missing = [key for key in ("every_run", "device", "seq", "micro_batch") if key not in tables[-1]]
        if missing:
            print(f"{path}: no {', '.join(missing)}: written by a bench.py older than --merge", file=sys.stderr)
            sys.exit(2)
    for t in tables:
        t.setdefault("accumulation", 1)  # files from before --accumulation: none
    for key in ("shape", "commit", "device", "seq", "micro_batch", "accumulation"):
        values = sorted({str(t[key]) for t in tables})
        if len(values) > 1:
            print(f"--merge: the files differ in {key} ({', '.join(values)}): one table holds one of each",
                  file=sys.stderr)
            sys.exit(2)
    first = tables[0]
    args.shape, args.commit, args.seq, args.micro_batch = first["shape"], first["commit"], first["seq"], \
        first["micro_batch"]
    args.accumulation = first["accumulation"]
    runs = {}
    for t in tables:
        for name, results_of_arm in t["every_run"].items():
            runs.setdefault(name, []).extend(tuple(r[:3]) + (tuple(r[3]),) if r else None for r in results_of_arm)
    rates = sorted(t["matmul_tflops"] for t in tables)
    counts = sorted({len(r) for r in runs.values()})
    print(f"merged {len(tables)} files: " + ", ".join(f"{n} {len(r)} run(s)" for n, r in runs.items()),
          file=sys.stderr)
    report(args, runs, rates[len(rates) // 2] * 1e12, first["device"],
           counts[0] if len(counts) == 1 else f"{counts[0]}-{counts[-1]}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trainer", default="build-gpu/bin/trainer")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="0.5b")
    parser.add_argument("--arms", default="eager,eager-fused,compile-fused,compile-autotune,ddp,zero3",
                        help="comma-separated arms; NAME=KEY=VALUE;KEY=VALUE adds a ddp arm with overrides; "
                             "NAME@PATH runs the trainer binary at PATH (e.g. ddp@build-b/bin/trainer)")
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--accumulation", type=int, default=1,
                        help="micro-batches a step, for every arm (the optimizer's cost spread over more tokens)")
    parser.add_argument("--json", help="also write the table here")
    parser.add_argument("--hf-checkpointing", action="store_true",
                        help="Hugging Face arms with gradient checkpointing (the trainer's: an arm's override)")
    parser.add_argument("--profile", help="write a Chrome trace of two steps of every arm into this directory")
    parser.add_argument("--runs", type=int, default=1,
                        help="runs per arm, round-robin over the arms; the table gives the median and the spread")
    parser.add_argument("--commit", default=None,
                        help="the commit measured (default: git's HEAD if this is a clone, with -dirty where the "
                             "working tree differs from it, as a copied tree whose git metadata lags does)")
    parser.add_argument("--merge", nargs="+", metavar="JSON",
                        help="measure nothing: one table (and --json) from these --json files of one shape, commit "
                             "and device, their runs pooled per arm (three calls of one run each: three runs per arm)")
    args = parser.parse_args()
    if args.merge:
        merge(args)
        return
    if torch is None:
        sys.exit("bench.py measures with numpy and torch (the GPU machine's Python); only --merge needs neither")
    if args.commit is None:
        git = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=7"], capture_output=True, text=True)
        args.commit = git.stdout.strip() if git.returncode == 0 else "unknown"
    if args.profile:
        os.makedirs(args.profile, exist_ok=True)
    config = SHAPES[args.shape]
    work = tempfile.mkdtemp(prefix="bench-")
    if args.accumulation < 1:
        sys.exit(f"--accumulation {args.accumulation}: expected at least 1")
    windows = args.steps * args.accumulation * args.micro_batch + 1
    np.random.default_rng(0).integers(0, config["vocab_size"], windows * args.seq + 1, dtype=np.uint32).tofile(
        os.path.join(work, "tokens.bin"))
    peak = matmul_rate()
    args.peak_tflops = peak / 1e12
    runs = {}  # arm -> one result per run
    # Round-robin over the arms, so that drift of the machine over the run
    # falls on every arm alike.
    for run in range(args.runs):
        for arm in args.arms.split(","):
            print(f"--- {arm} (run {run + 1} of {args.runs})", file=sys.stderr, flush=True)
            if arm in ("eager", "eager-fused", "compile-fused"):
                name, result = arm, run_hugging_face(args, config, arm, fused=arm != "eager",
                                                     compiled=arm == "compile-fused")
            elif arm == "compile-autotune":
                name, result = arm, run_hugging_face(args, config, arm, fused=True, compiled=True,
                                                     mode="max-autotune-no-cudagraphs")
            else:
                # LABEL[@TRAINER][=overrides]: a trainer arm; @TRAINER runs another build (two builds in one
                # round-robin run); the label ddp, zero1, zero2 or zero3 names the strategy, any other runs ddp.
                spec, _, overrides = arm.partition("=")
                label, _, binary = spec.partition("@")
                strategy = label if label in ("ddp", "zero3", "zero1", "zero2") else "ddp"
                tag = label + (f"-{os.path.basename(os.path.dirname(os.path.dirname(binary)))}" if binary else "")
                name, result = f"trainer {tag}", run_trainer(args, config, work, tag, strategy,
                                                             overrides.split(";") if overrides else [], binary or None)
            runs.setdefault(name, []).append(result)
            # Each run's figure as it comes, so that a run cut short by a time limit keeps what it measured.
            print(f"=== {name} (run {run + 1}): " + (f"{result[0]:.0f} tokens/s, {result[1]:.1f} GiB peak"
                                                      if result else "failed"), file=sys.stderr, flush=True)
            shutil.rmtree(os.path.join(work, f"run-{name.removeprefix('trainer ')}"), ignore_errors=True)
    results = report(args, runs, peak, torch.cuda.get_device_name(), args.runs)
    if args.profile:
        for name in results:
            trace = os.path.join(args.profile, f"{name.removeprefix('trainer ')}.json")
            if os.path.exists(trace):
                subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), "trace_summary.py"), trace,
                                "--steps", "2"])


if __name__ == "__main__":
    main()
