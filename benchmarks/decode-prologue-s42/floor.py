"""Forty-second session: (1) the floor of a CUDA-graph replay for empty kernels of the decode grid's size and of
fewer, larger blocks; (2) the Gluon FP4 decode kernel with 64-key tiles (twice the bytes in flight per program) at
fewer programs per SM, against the default 32-key tiles, 16 per SM.

    OUT=out PYTHONPATH=src python benchmarks/decode-prologue-s42/floor.py
"""
# ruff: noqa: B023
import os
import sys

import torch
import triton
import triton.language as tl

import fp4attn
import fp4attn.kernels.decode as Dn
from fp4attn.bench.common import graph_time_ms
from fp4attn.bench.decode import decode_inputs

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _log import logger  # noqa: E402

REP = float(os.environ.get("REP_MS", 60))
P = logger("floor.txt")


@triton.jit
def _empty(X):
    if tl.program_id(0) == 100000:
        tl.store(X, 1.0)


x = torch.zeros(1, device="cuda")
P(torch.cuda.get_device_name())
for grid, w in (((32, 64), 1), ((8, 64), 4), ((132, 1), 1), ((1, 1), 1), ((256, 8), 1)):
    ts = [1e3 * graph_time_ms(lambda: _empty[grid](x, num_warps=w), REP) for _ in range(3)]
    P(f"empty kernel grid {grid} x {w} warps: {min(ts):.2f} us")
for spec in ("8,32,8,32768,128", "1,32,8,131072,128"):
    B, Hq, Hkv, N, D = map(int, spec.split(","))
    q, k, v = decode_inputs(B, Hq, Hkv, N, D)
    cache = fp4attn.KVCache.from_dense(k, v)
    o0 = Dn.decode_fwd(q, cache, scale=D ** -0.5)[0]
    variants = {"default (32 keys, 16/SM)": {}, "64 keys 12/SM": dict(block_n=64, per_sm=12, maxnreg=168),
                "64 keys 10/SM": dict(block_n=64, per_sm=10, maxnreg=200), "64 keys 8/SM": dict(block_n=64, per_sm=8)}
    for n, kw in variants.items():
        o = Dn.decode_fwd(q, cache, scale=D ** -0.5, **kw)[0]
        P(f"  {spec} {n}: rel diff {((o.float() - o0.float()).norm() / o0.float().norm()).item():.2e}")
    res = {n: [] for n in variants}
    for _ in range(3):
        for n, kw in variants.items():
            res[n].append(1e3 * graph_time_ms(lambda: Dn.decode_fwd(q, cache, scale=D ** -0.5, **kw), REP))
    for n, xs in res.items():
        P(f"  {spec} {n:26s} {min(xs):8.2f} us  rounds {['%.1f' % t for t in xs]}")
