"""Per-kernel GPU times of one op call (torch.profiler, mean of ``REPS`` calls after warmup: ``_util.kernel_times_us``
of the sixth session's probes): where sage3's time goes next to nvfp4's (forty-seventh session).

    PYTHONPATH=src:benchmarks/session6-2026-11-22/probes python benchmarks/sage3-keyperm-s47/profile_ops.py
"""
import os

import torch
from _util import kernel_times_us

import fp4attn

SHAPES = [tuple(int(x) for x in s.split(",")) for s in os.environ.get(
    "SHAPES", "16,16,4096,128,0;16,16,4096,128,1;16,16,4096,64,1").split(";")]
REPS = int(os.environ.get("REPS", "10"))

for (B, H, N, D, c) in SHAPES:
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    for recipe in ("nvfp4", "sage3"):
        tot = kernel_times_us(lambda: fp4attn.attention(q, k, v, causal=bool(c), recipe=recipe), REPS)  # noqa: B023
        s = sum(tot.values())
        print(f"\n## {recipe} ({B},{H},{N},{D}){' causal' if c else ''}: {s / 1000:.3f} ms of kernels")
        for name, t in tot.items():
            print(f"  {t / 1000:8.3f} ms  {100 * t / s:5.1f}%  {name}")
