"""PyTorch's own Muon (torch.optim.Muon, adjust_lr_fn="match_rms_adamw") on
one matrix, for tests/gpu/OptimizerGpuTest.cpp: reads w, g0, g1, g2 from
the safetensors file argv[1], takes three steps on CUDA with lr 0.02,
weight decay 0.1, momentum 0.95 (Nesterov), 5 Newton-Schulz steps, and
writes the weights after each step (w1, w2, w3) to argv[2]."""
import sys

import torch
from safetensors.torch import load_file, save_file

tensors = load_file(sys.argv[1])
param = torch.nn.Parameter(tensors["w"].cuda().clone())
optimizer = torch.optim.Muon([param], lr=0.02, weight_decay=0.1, momentum=0.95, nesterov=True, ns_steps=5,
                             adjust_lr_fn="match_rms_adamw")
out = {}
for step in range(3):
    param.grad = tensors[f"g{step}"].cuda().clone()
    optimizer.step()
    out[f"w{step + 1}"] = param.detach().cpu().clone()
save_file(out, sys.argv[2])
print(f"torch {torch.__version__}: three Muon steps written to {sys.argv[2]}")
