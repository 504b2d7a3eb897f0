"""Where the time of ``fp4attn.attention`` goes: per-kernel CUDA time (torch.profiler) of the op for
every recipe at the issue's shapes, the pre-pass kernels' bytes against a measured copy bandwidth.

    PYTHONPATH=src python benchmarks/prepass-s34/kernel_times.py
"""
import os
import sys

import torch
from triton.testing import do_bench

import fp4attn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "session6-2026-11-22", "probes"))
from _util import kernel_times_us  # noqa: E402  (the session-6 probes' profiler helper)

SHAPES = [tuple(int(x) for x in s.split(",")) for s in
          os.environ.get("SHAPES", "16,16,4096,128,0;16,16,4096,128,1;4,16,16384,128,0;16,16,4096,64,0").split(";")]
RECIPES = os.environ.get("RECIPES", "nvfp4,mxfp4,sage3").split(",")
torch.manual_seed(0)


def copy_bandwidth():
    """Device-to-device copy, bytes read + written per second."""
    x = torch.empty(1 << 28, device="cuda", dtype=torch.uint8)
    y = torch.empty_like(x)
    t = do_bench(lambda: y.copy_(x), warmup=10, rep=100)
    return 2 * x.numel() / (t * 1e-3)


copy_bw = copy_bandwidth()
print(f"copy bandwidth (read + write): {copy_bw / 1e12:.2f} TB/s")

for (B, H, N, D, causal) in SHAPES:
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    for r in RECIPES:
        def f(q=q, k=k, v=v, causal=bool(causal), r=r):
            return fp4attn.attention(q, k, v, causal=causal, recipe=r)
        per = kernel_times_us(f, n=10)
        tot = sum(per.values())
        print(f"\n## ({B},{H},{N},{D}) causal={causal} {r}: sum of kernels {tot / 1e3:.3f} ms")
        for name, us in sorted(per.items(), key=lambda kv: -kv[1]):
            print(f"  {us / 1e3:8.3f} ms  {name}")
    in_bytes = 3 * q.numel() * 2
    print(f"  (inputs q, k, v: {in_bytes / 1e6:.0f} MB; at the copy bandwidth a read of them takes "
          f"{in_bytes / copy_bw * 1e3:.3f} ms)")
