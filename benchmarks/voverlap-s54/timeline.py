"""Kernel start/end times (torch.profiler) of one nvfp4 op call per ``attention.V_OVERLAP`` mode at (16,16,4096,128)
causal: do the row-max pass and the V pre-pass overlap?

    PYTHONPATH=src python benchmarks/voverlap-s54/timeline.py
"""
import torch
from torch.profiler import ProfilerActivity, profile

import fp4attn
from fp4attn.kernels import attention as A

q, k, v = (torch.randn(16, 16, 4096, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
for mode in ("serial", "high", "side"):
    A.V_OVERLAP = mode
    for _ in range(3):
        fp4attn.attention(q, k, v, causal=True)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fp4attn.attention(q, k, v, causal=True)
        torch.cuda.synchronize()
    ev = sorted((e for e in prof.events() if e.device_type.name == "CUDA"), key=lambda e: e.time_range.start)
    t0 = ev[0].time_range.start
    print(f"\n{mode}:")
    for e in ev:
        print(f"  {e.time_range.start - t0:8.1f} {e.time_range.end - t0:8.1f} us  {e.name[:60]}")
