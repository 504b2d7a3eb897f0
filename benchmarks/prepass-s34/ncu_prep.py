"""One quantize_qkv call (nvfp4, (16,16,4096,128)) for ncu to profile the pre-pass kernels:

    PYTHONPATH=src ncu --clock-control none -k regex:_prep --launch-skip 3 --launch-count 3 \
        --section SpeedOfLight --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis \
        --section LaunchStats python benchmarks/prepass-s34/ncu_prep.py
"""
import os

import torch

from fp4attn.kernels import attention as ka

B, H, N, D = (int(x) for x in os.environ.get("SHAPE", "16,16,4096,128").split(","))
q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
for _ in range(2):
    ka.quantize_qkv(q, k, v, fmt=os.environ.get("FMT", "nvfp4"))
torch.cuda.synchronize()
