"""Kernel start/end times (torch.profiler) of one nvfp4 op call per ``attention.V_OVERLAP`` mode at (16,16,4096,128)
causal: do the row-max pass and the V pre-pass overlap?

    PYTHONPATH=src python benchmarks/voverlap-s54/timeline.py
"""
import functools

import torch
from steady import one_call

import fp4attn
from fp4attn.kernels import attention as A

q, k, v = (torch.randn(16, 16, 4096, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
for mode in ("serial", "high", "side"):
    A.V_OVERLAP = mode
    ks = one_call(functools.partial(fp4attn.attention, q, k, v, causal=True))
    t0 = ks[0][1]
    print(f"\n{mode}:")
    for name, a, b in ks:
        print(f"  {a - t0:8.1f} {b - t0:8.1f} us  {name[:60]}")
