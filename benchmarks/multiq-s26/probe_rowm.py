"""The split kernel with the query rows along the MMA's M (``rowm``) for many rows per kv head: configs (key tile,
warps, programs per SM, row padding) against the transposed kernel (what ran before) and bf16 SDPA with the GQA
group folded into the query length, CUDA-graph replays; and rowm vs transposed at equal tiles and splits.
Usage: OUT=out PYTHONPATH=src python benchmarks/multiq-s26/probe_rowm.py"""
# ruff: noqa: B023
import os
import sys

import torch
import triton
from torch.nn.attention import SDPBackend

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "decode-s10"))
from _util import logger  # noqa: E402

import fp4attn  # noqa: E402
from fp4attn.bench.common import graph_time_ms  # noqa: E402
from fp4attn.bench.decode import sdpa_fn  # noqa: E402
from fp4attn.kernels import decode as Dk  # noqa: E402

P = logger(os.environ.get("BENCH_LOG", "probe_rowm.txt"))
P(torch.cuda.get_device_name(), torch.__version__, triton.__version__)
REP = float(os.environ.get("REP_MS", 40))
CASES = os.environ.get("CASES", "8,32,8,32768,128,4;8,32,8,32768,128,8;8,32,8,32768,128,16;"
                                "8,64,8,32768,128,16;8,64,8,32768,64,4;8,64,8,32768,64,8;1,32,8,131072,128,8")


def t(fn):
    ms = graph_time_ms(fn, REP)
    return float("nan") if ms is None else ms * 1e3


prev = None
for spec in CASES.split(";"):
    B, Hq, Hkv, N, D, nq = (int(x) for x in spec.split(","))
    if prev != (B, Hkv, N, D):
        cache = None
        torch.cuda.empty_cache()
        g = torch.Generator(device="cuda").manual_seed(0)
        kw = dict(device="cuda", dtype=torch.bfloat16, generator=g)
        k = torch.randn(B, Hkv, N, D, **kw)
        v = torch.randn(B, Hkv, N, D, **kw)
        cache = fp4attn.KVCache.from_dense(k, v)
        prev = (B, Hkv, N, D)
    G = Hq // Hkv
    rows = G * nq
    q = torch.randn(B, Hq, nq, D, **kw)
    qf = q.view(B, Hkv, rows, D)
    cud = t(sdpa_fn(SDPBackend.CUDNN_ATTENTION, qf, k, v))
    fla = t(sdpa_fn(SDPBackend.FLASH_ATTENTION, qf, k, v))
    sc = D ** -0.5
    P(f"\n(B,Hq,Hkv,N,D,nq)=({B},{Hq},{Hkv},{N},{D},{nq}) rows={rows}: bf16 folded cuDNN {cud:.1f} flash {fla:.1f}")
    o_m = Dk.decode_fwd(q, cache, scale=sc, kernel="triton", rowm=True, block_n=64, num_splits=16)
    o_t = Dk.decode_fwd(q, cache, scale=sc, kernel="triton", rowm=False, block_n=64, num_splits=16)
    rel = ((o_m[0].float() - o_t[0].float()).norm() / o_t[0].float().norm()).item()
    P(f"  rowm vs transposed (64-key tiles, 16 splits): rel {rel:.2e} lse {(o_m[1] - o_t[1]).abs().max().item():.1e}")
    old = t(lambda: Dk.decode_fwd(q, cache, scale=sc, rowm=False))
    op = t(lambda: fp4attn.decode(q, cache))
    P(f"  before (transposed / Gluon, default): {old:8.1f} us x cuDNN-folded {cud / old:.2f} | op now {op:8.1f} "
      f"x cuDNN-folded {cud / op:.2f} x flash-folded {fla / op:.2f}")
    res = {}
    for bn, nw in ((64, 4), (32, 4), (64, 8)):
        for per_sm in (1, 2, 4):
            kwc = dict(block_n=bn, num_warps=nw, per_sm=per_sm)
            us = t(lambda: Dk.decode_fwd(q, cache, scale=sc, rowm=True, **kwc))
            res[(bn, nw, per_sm)] = us
            P(f"  rowm bn {bn} warps {nw} per_sm {per_sm}: {us:8.1f} us x cuDNN-folded {cud / us:.2f}")
    best = min(res, key=res.get)
    bn, nw, per_sm = best
    for st in (3,):
        us = t(lambda: Dk.decode_fwd(q, cache, scale=sc, rowm=True, block_n=bn, num_warps=nw, per_sm=per_sm,
                                     num_stages=st))
        P(f"  best {best} stages {st}: {us:8.1f} us")
    if rows < 64:
        us = t(lambda: Dk.decode_fwd(q, cache, scale=sc, rowm=True, block_n=bn, num_warps=nw, per_sm=per_sm,
                                     block_m=64))
        P(f"  best {best} rows padded to 64: {us:8.1f} us")
