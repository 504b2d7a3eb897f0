"""In-process A/B of the decode reduce kernel (one pass, channel blocks) against the tree before it (a copy importable
as ``fp4attn_old``, see benchmarks/grid-s19/README.md): CUDA-graph times of the decode op's kernels, alternating
rounds, min per variant, and the outputs' relative difference (not bit-equal: the merge order changed).

    OLD_SRC=.ab_old/src PYTHONPATH=src FP4ATTN_AUTOTUNE=0 python benchmarks/decode-s21/ab.py
"""
import os
import sys

import torch

import fp4attn
from fp4attn.bench.common import graph_time_ms

sys.path.insert(0, os.environ.get("OLD_SRC", ".ab_old/src"))
import fp4attn_old  # noqa: E402
import fp4attn_old.kernels.decode  # noqa: E402

import fp4attn.kernels.decode  # noqa: E402,F401

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "decode-s10"))
from _util import logger  # noqa: E402

P = logger(os.environ.get("AB_LOG", "ab.txt"))
ROUNDS = int(os.environ.get("ROUNDS", "4"))
BF = torch.bfloat16


def rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


# (B, Hq, Hkv, context, D, new tokens, Thrift budget)
CASES = [(8, 32, 8, 32768, 128, 1, None), (1, 32, 8, 131072, 128, 1, None), (8, 32, 8, 32768, 128, 1, 0.05),
         (1, 32, 8, 131072, 128, 1, 0.05), (32, 32, 8, 2048, 128, 1, None), (4, 32, 8, 8192, 128, 4, None),
         (2, 16, 16, 16384, 64, 1, None)]
for (B, Hq, Hkv, N, D, nq, budget) in CASES:
    torch.manual_seed(0)
    k = torch.randn(B, Hkv, N, D, device="cuda", dtype=BF)
    v = torch.randn_like(k)
    q = torch.randn(B, Hq, nq, D, device="cuda", dtype=BF)
    fns = {}
    for name, pkg in (("old", fp4attn_old), ("new", fp4attn)):
        cache = pkg.KVCache.from_dense(k, v, keep_16bit=budget is not None)
        Dk = pkg.kernels.decode
        sel = Dk.select_pages(q, cache, budget) if budget else None
        fns[name] = lambda Dk=Dk, c=cache, s=sel, q=q, d=D: Dk.decode_fwd(q, c, scale=d ** -0.5, selection=s)
    outs = {n: f() for n, f in fns.items()}
    t = {n: [] for n in fns}
    for _ in range(ROUNDS):
        for n, f in fns.items():
            t[n].append(graph_time_ms(f, 40))
    o, n = min(t["old"]), min(t["new"])
    P(f"{str((B, Hq, Hkv, N, D, nq, budget)):40s} old {o:.4f} ms  new {n:.4f} ms  new/old {n / o:.3f}  "
      f"out rel diff {rel(outs['new'][0], outs['old'][0]):.1e}  lse max diff "
      f"{(outs['new'][1] - outs['old'][1]).abs().max().item():.1e}")
    del k, v, fns, outs
    torch.cuda.empty_cache()
