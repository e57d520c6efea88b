#!/usr/bin/env python3
"""trainer's qwen2 model against Hugging Face transformers' Qwen2 and Llama.

A model built with transformers (random init, biases and norm scales
perturbed so that they matter), saved with save_pretrained, is loaded by
`trainer forward` through model.hf_dir; both compute fp32 logits on the same
tokens. Passes when the norm-wise relative error is at most 1e-4, for
Qwen2 with tied and untied embeddings and for LlamaForCausalLM (no q/k/v
bias, untied head, rope_scaling of type llama3 with an original context
shorter than the tokens, so that every band of the scaling is used). Run
from the project root after building:

    python3 bench/hf_logits_check.py --trainer build/bin/trainer --device cuda
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM


def check(trainer, device, tied, llama=False):
    work = tempfile.mkdtemp(prefix="hf-check-")
    shape = dict(vocab_size=300, hidden_size=64, intermediate_size=160, num_hidden_layers=3, num_attention_heads=4,
                 num_key_value_heads=2, rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=tied,
                 max_position_embeddings=256)
    if llama:
        config = LlamaConfig(**shape, attention_bias=False, mlp_bias=False,
                             rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                               high_freq_factor=4.0, original_max_position_embeddings=32))
    else:
        config = Qwen2Config(**shape)
    torch.manual_seed(0)
    model = (LlamaForCausalLM if llama else Qwen2ForCausalLM)(config).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(work, safe_serialization=True)
    ids = torch.randint(0, config.vocab_size, (3, 40))
    with torch.no_grad():
        reference = model(ids).logits.float().numpy()
    tokens = os.path.join(work, "tokens.txt")
    np.savetxt(tokens, ids.numpy(), fmt="%d")
    recipe = os.path.join(work, "recipe.toml")
    with open(recipe, "w") as f:
        f.write(f"[run]\ndevice = '{device}'\n[model]\nname = 'qwen2'\nhf_dir = '{work}'\n"
                "[dataset]\nname = 'synthetic'\n")
    out = os.path.join(work, "logits.bin")
    subprocess.run([trainer, "forward", recipe, "--tokens", tokens, "--out", out], check=True)
    ours = np.fromfile(out, dtype=np.float32).reshape(reference.shape)
    error = float(np.linalg.norm(ours - reference) / np.linalg.norm(reference))
    print(f"{'llama' if llama else 'qwen2'} tie_word_embeddings={tied}: logits {list(reference.shape)}, norm-wise relative error {error:.3e}, "
          f"max |difference| {np.abs(ours - reference).max():.3e} (max |logit| {np.abs(reference).max():.3f})")
    return error


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trainer", default="build/bin/trainer")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    worst = max([check(args.trainer, args.device, tied) for tied in (False, True)] +
                [check(args.trainer, args.device, False, llama=True)])
    # fp32 on both sides; kernels differ (SDPA variants, matmul blocking),
    # which moves logits by ~1e-6 relative: 1e-4 is the bound.
    print(f"{'PASS' if worst <= 1e-4 else 'FAIL'}: worst {worst:.3e}, tolerance 1e-4")
    return 0 if worst <= 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
