#!/usr/bin/env python3
"""The Hugging Face peer of bench/packing.sh's CUDA arms: Qwen2-0.5B's shape
(random init, fp32 parameters under bf16 autocast, AdamW(fused=True), SDPA
attention, the model and the loss under torch.compile) trained on the same
ragged prompt/completion records packed by DataCollatorWithFlattening: the
documents of a step (each truncated to --seq tokens, as the trainer's
dataset.long_documents = "truncate") flattened into one row of at most
--micro-batch x --seq tokens (filled up to exactly that by one more
document of padding without labels: every step has one shape, so the
compiled graph is built once), position ids restarting per document (which
transformers turns into a block-diagonal mask), labels -100 on the prompt
and at each document's first token: completion-only loss, as the trainer's.

Before timing, it checks that the peer masks what it claims: the packed
loss of the first step against the same documents run one at a time
(eager, fp32), relative difference printed.

Prints target (useful) tokens per second over the steps after --warmup,
input tokens per second and documents per step. Run on the GPU machine:

    python3 bench/packing_hf.py --tokenizer .cache/tokenizers/qwen3 \\
        --corpus .cache/corpus/vim-ragged.jsonl
"""
import argparse
import json
import sys
import time

import torch


def documents(args, tokenizer, eos):
    """(ids, labels) per record in file order, labels -100 on the prompt."""
    with open(args.corpus) as f:
        for line in f:
            record = json.loads(line)
            prompt = tokenizer.encode(record["prompt"], add_special_tokens=False).ids
            completion = tokenizer.encode(record["completion"], add_special_tokens=False).ids + [eos]
            ids = (prompt + completion)[: args.seq + 1]
            labels = ([-100] * len(prompt) + completion)[: args.seq + 1]
            if len(ids) >= 2:
                yield ids, labels


def steps_of(args, docs):
    """Each step's documents: in order, as many as fit micro-batch x seq tokens."""
    budget, step = args.micro_batch * args.seq, []
    for ids, labels in docs:
        if step and sum(len(d["input_ids"]) for d in step) + len(ids) > budget:
            yield step
            step = []
        step.append({"input_ids": ids, "labels": labels})


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokenizer", default=".cache/tokenizers/qwen3")
    parser.add_argument("--corpus", default=".cache/corpus/vim-ragged.jsonl")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--no-compile", action="store_true")
    args = parser.parse_args()

    from tokenizers import Tokenizer
    from transformers import DataCollatorWithFlattening, Qwen2Config, Qwen2ForCausalLM

    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    from bench import SHAPES

    tokenizer = Tokenizer.from_file(f"{args.tokenizer}/tokenizer.json")
    eos = tokenizer.token_to_id(json.load(open(f"{args.tokenizer}/tokenizer_config.json"))["eos_token"])
    collate = DataCollatorWithFlattening(return_tensors="pt", return_position_ids=True)
    batches = []
    budget = args.micro_batch * args.seq
    for step in steps_of(args, documents(args, tokenizer, eos)):
        batch = collate(step)
        # One shape for every step (a compiled graph, no recompiles): the row
        # is filled up to the budget by one more "document" of padding, its
        # own positions, no labels.
        short = budget - batch["input_ids"].shape[1]
        if short > 0:
            batch["input_ids"] = torch.cat([batch["input_ids"], torch.full((1, short), eos)], 1)
            batch["labels"] = torch.cat([batch["labels"], torch.full((1, short), -100)], 1)
            batch["position_ids"] = torch.cat([batch["position_ids"], torch.arange(short).unsqueeze(0)], 1)
        batches.append((batch, len(step), budget - short))
        if len(batches) == args.steps:
            break

    torch.manual_seed(0)
    config = Qwen2Config(**SHAPES["0.5b"], attn_implementation="sdpa")
    model = Qwen2ForCausalLM(config).cuda().train()

    # The peer masks documents: the first step's packed loss sum against its documents alone.
    first, count, _ = batches[0]
    with torch.no_grad():
        ids, pos, labels = (first[k].cuda() for k in ("input_ids", "position_ids", "labels"))
        logits = model(input_ids=ids, position_ids=pos, use_cache=False).logits[0, :-1]
        packed = torch.nn.functional.cross_entropy(logits.double(), labels[0, 1:], reduction="sum")
        alone = 0.0
        starts = (pos[0] == 0).nonzero().flatten().tolist() + [ids.shape[1]]
        for begin, end in list(zip(starts[:-1], starts[1:]))[:count]:  # not the padding
            l = model(input_ids=ids[:, begin:end], use_cache=False).logits[0, :-1]
            alone += torch.nn.functional.cross_entropy(l.double(), labels[0, begin + 1:end], reduction="sum").item()
        print(f"check: packed loss sum {packed.item():.6f}, documents alone {alone:.6f}, "
              f"relative difference {abs(packed.item() - alone) / abs(alone):.2e} ({count} documents)")

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1, fused=True)

    def loss_of(ids, pos, labels):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(input_ids=ids, position_ids=pos, use_cache=False).logits
        return torch.nn.functional.cross_entropy(logits.float()[0, :-1], labels[0, 1:])

    if not args.no_compile:
        loss_of = torch.compile(loss_of, dynamic=False)
    targets = inputs = docs = 0
    for step, (batch, count, used) in enumerate(batches):
        if step == args.warmup:
            torch.cuda.synchronize()
            start = time.perf_counter()
        ids, pos, labels = (batch[k].cuda(non_blocking=True) for k in ("input_ids", "position_ids", "labels"))
        loss = loss_of(ids, pos, labels)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step >= args.warmup:
            targets += int((batch["labels"][0, 1:] != -100).sum())
            inputs += used
            docs += count
        if step % 5 == 0:
            print(f"step {step + 1}: loss {loss.item():.4f}", file=sys.stderr)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    timed = len(batches) - args.warmup
    print(f"hf-flatten{'' if args.no_compile else '-compile'}: target tokens/s {targets / seconds:.0f}, "
          f"input tokens/s {inputs / seconds:.0f}, documents per step {docs / timed:.1f}, "
          f"fill {inputs / timed / (args.micro_batch * args.seq):.3f}, step {1000 * seconds / timed:.1f} ms, "
          f"peak allocated {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")


if __name__ == "__main__":
    main()
