"""sage3's error against exact attention in two trees (forty-eighth session): each tree in its own process on the
same seeded bf16 inputs; prints the relative L2 of each tree's output against float32 SDPA math, and between them.

    BASE=out/base_src/src PYTHONPATH=src python benchmarks/corr-s48/acc_ab.py
"""
import os
import subprocess
import sys

import torch

from fp4attn.metrics import rel_l2

CHILD = r'''
import sys, torch, fp4attn
res = {}
for (B, H, N, D, c) in [(4, 8, 4096, 128, 0), (4, 8, 4096, 128, 1), (4, 8, 4096, 64, 0)]:
    g = torch.Generator(device="cuda").manual_seed(N + D + c)
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    res[(B, H, N, D, c)] = fp4attn.attention(q, k, v, causal=bool(c), recipe="sage3").float().cpu()
torch.save(res, sys.argv[1])
'''
outs = {}
for name, path in (("new", "src"), ("base", os.environ.get("BASE", "out/base_src/src"))):
    f = f"out/acc_{name}.pt"
    subprocess.run([sys.executable, "-c", CHILD, f], env={**os.environ, "PYTHONPATH": path}, check=True)
    outs[name] = torch.load(f)
print("| shape | new vs exact | base vs exact | new / base | new vs base |")
print("|---|---:|---:|---:|---:|")
for key in outs["new"]:
    B, H, N, D, c = key
    g = torch.Generator(device="cuda").manual_seed(N + D + c)
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, generator=g).float() for _ in range(3))
    ex = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=bool(c)).cpu()
    en, eb = rel_l2(outs["new"][key], ex), rel_l2(outs["base"][key], ex)
    print(f"| {key} | {en:.6f} | {eb:.6f} | {en / eb:.5f} | {rel_l2(outs['new'][key], outs['base'][key]):.2e} |")
