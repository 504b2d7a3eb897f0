"""The public op, every recipe, next to SDPA cuDNN / flash in the same run (min of interleaved rounds).
nvfp4 runs the Gluon attention pass at D = 128 (kernel "auto"); "nvfp4-triton" forces the Triton pass.

    PYTHONPATH=src python benchmarks/gluon-attn-s17/final.py
"""
import os

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

import fp4attn
from fp4attn.kernels import attention as ka

SHAPES = ((16, 16, 4096, 128, False), (16, 16, 4096, 128, True), (4, 16, 16384, 128, False), (16, 16, 4096, 64, False))
RECIPES = {"nvfp4": ("nvfp4", False, "auto"), "nvfp4-triton": ("nvfp4", False, "triton"),
           "mxfp4": ("mxfp4", False, "auto"), "sage3": ("nvfp4", True, "auto")}
torch.manual_seed(0)


def op(q, k, v, causal, recipe, kern):
    os.environ["FP4ATTN_ATTN_KERNEL"] = kern
    return fp4attn.attention(q, k, v, causal=causal, recipe=recipe)


def timed(q, k, v, causal):
    """{name: callable} of one shape (SDPA backends, each recipe's op and pre-pass)."""
    fns = {}
    for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
        def f(backend=backend):
            with sdpa_kernel([backend]):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        fns[name] = f
    for r, (fmt, sm, kern) in RECIPES.items():
        base = r.split("-")[0]
        fns[r] = (lambda base=base, kern=kern: op(q, k, v, causal, base, kern))
        fns["prep-" + r] = (lambda fmt=fmt, sm=sm: ka.quantize_qkv(q, k, v, fmt=fmt, smooth_q=sm, smooth_k=sm))
    return fns


print("| shape | cuDNN ms | flash ms | recipe | pre-pass ms | op ms | TF/s | × cuDNN | × flash |")
print("|---|---:|---:|---|---:|---:|---:|---:|---:|")
for (B, H, N, D, causal) in SHAPES:
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    fl = 4 * B * H * N * N * D / (2 if causal else 1)
    fns = timed(q, k, v, causal)
    t = {n: float("inf") for n in fns}
    for _ in range(3):
        for n, f in fns.items():
            t[n] = min(t[n], do_bench(f, warmup=25, rep=150))
    sh = f"({B},{H},{N},{D}){' causal' if causal else ''}"
    for r in RECIPES:
        print(f"| {sh} | {t['cudnn']:.3f} | {t['flash']:.3f} | {r} | {t['prep-' + r]:.3f} | {t[r]:.3f} | "
              f"{fl / t[r] / 1e9:.0f} | {t['cudnn'] / t[r]:.3f} | {t['flash'] / t[r]:.3f} |", flush=True)
    print(f"<!-- {sh}: sage3/nvfp4 {t['sage3'] / t['nvfp4']:.3f}, sage3/nvfp4-triton "
          f"{t['sage3'] / t['nvfp4-triton']:.3f} -->", flush=True)
    del q, k, v
