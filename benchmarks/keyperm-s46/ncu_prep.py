"""One ``fp4attn.attention`` call (nvfp4, or RECIPE) at SHAPE for ncu: the pre-pass kernels (forty-sixth session).

    ncu --clock-control none -k regex:_prep -c 3 --section SpeedOfLight --section WarpStateStats \
        --metrics smsp__inst_executed.sum,dram__bytes.sum python benchmarks/keyperm-s46/ncu_prep.py
"""
import os

import torch

import fp4attn

B, H, N, D = (int(x) for x in os.environ.get("SHAPE", "16,16,4096,128").split(","))
g = torch.Generator(device="cuda").manual_seed(0)
q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
fp4attn.attention(q, k, v, recipe=os.environ.get("RECIPE", "nvfp4"))
torch.cuda.synchronize()
