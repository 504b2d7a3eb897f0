"""One ``fp4attn.attention`` call (RECIPE, default nvfp4) at SHAPE (default 16,16,4096,128), causal unless CAUSAL=0,
for ncu (forty-ninth session):

    ncu --clock-control none -k regex:_gl -c 2 --section SpeedOfLight --section ComputeWorkloadAnalysis \
        --section MemoryWorkloadAnalysis python benchmarks/order-s49/ncu_one.py
"""
import os

import torch

import fp4attn

B, H, N, D = (int(x) for x in os.environ.get("SHAPE", "16,16,4096,128").split(","))
g = torch.Generator(device="cuda").manual_seed(0)
q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
fp4attn.attention(q, k, v, causal=os.environ.get("CAUSAL", "1") == "1", recipe=os.environ.get("RECIPE", "nvfp4"))
torch.cuda.synchronize()
