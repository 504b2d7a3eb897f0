"""Per-kernel CUDA times (torch.profiler) of ``fp4attn.attention`` nvfp4 with the operands in the Gluon passes' key
order (perm) and in key order (nat), forty-sixth session.

    PYTHONPATH=src:benchmarks/session6-2026-11-22/probes python benchmarks/keyperm-s46/kernel_ab.py
"""
import os

import torch
from _util import kernel_times_us

import fp4attn
from fp4attn.kernels import attention as A

SHAPES = [tuple(int(x) for x in s.split(",")) for s in os.environ.get(
    "SHAPES", "16,16,4096,128,0;16,16,4096,128,1;16,16,4096,64,0").split(";")]
RECIPE = os.environ.get("RECIPE", "nvfp4")
_q = A.quantize_qkv
for (B, H, N, D, c) in SHAPES:
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    for _round in range(2):
        for var in ("nat", "perm"):
            A.quantize_qkv = _q if var == "perm" else (lambda *a, **kw: _q(*a, **{**kw, "key_perm": False}))
            per = kernel_times_us(lambda q=q, k=k, v=v, c=c: fp4attn.attention(q, k, v, causal=bool(c), recipe=RECIPE),
                                  n=20)
            row = ", ".join(f"{n.split('(')[0][:22]} {us / 1e3:.3f}" for n, us in per.items() if us > 5)
            print(f"{RECIPE} ({B},{H},{N},{D}) causal={c} {var}: sum {sum(per.values()) / 1e3:.3f} ms | {row}",
                  flush=True)
