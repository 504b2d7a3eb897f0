"""Configs of the Triton split kernel for many query rows per kv head (G·n_q 16..128): 32/64/128-key tiles on 4/8
warps (64-key tiles on 4 warps let Triton use wgmma: keys along M, the rows along N), against the default config
and bf16 SDPA with the GQA group folded into the query length (B, Hkv, G·n_q, D): what a decode kernel that reads
each bf16 page once per group (FlashAttention's kvcache path, FlashInfer) costs. CUDA-graph replays.
Usage: OUT=out PYTHONPATH=src python benchmarks/multiq-s26/probe_cfg.py"""
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

P = logger(os.environ.get("BENCH_LOG", "probe_cfg.txt"))
P(torch.cuda.get_device_name(), torch.__version__, triton.__version__)
REP = float(os.environ.get("REP_MS", 40))
CASES = os.environ.get("CASES", "8,32,8,32768,128,4;8,32,8,32768,128,8;8,32,8,32768,128,16;"
                                "8,64,8,32768,128,16;8,64,8,32768,64,4;8,64,8,32768,64,8")
CFGS = [(bn, nw, st) for bn in (32, 64, 128) for nw in (4, 8) for st in (2,)]


def t(fn):
    ms = graph_time_ms(fn, REP)
    return float("nan") if ms is None else ms * 1e3


prev = None
for spec in CASES.split(";"):
    B, Hq, Hkv, N, D, nq = (int(x) for x in spec.split(","))
    if prev != (B, Hkv, N, D):
        g = torch.Generator(device="cuda").manual_seed(0)
        kw = dict(device="cuda", dtype=torch.bfloat16, generator=g)
        k = torch.randn(B, Hkv, N, D, **kw)
        v = torch.randn(B, Hkv, N, D, **kw)
        cache = fp4attn.KVCache.from_dense(k, v)
        prev = (B, Hkv, N, D)
    G = Hq // Hkv
    q = torch.randn(B, Hq, nq, D, **kw)
    qf = q.view(B, Hkv, G * nq, D)  # the group folded into the query length (no mask: the probe's bf16 bound)
    cud = t(sdpa_fn(SDPBackend.CUDNN_ATTENTION, qf, k, v))
    fla = t(sdpa_fn(SDPBackend.FLASH_ATTENTION, qf, k, v))
    exact = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), enable_gqa=True)
    # (the exact reference has no causal mask among the new tokens; the last n_q keys' mask moves it little)
    sc = D ** -0.5
    P(f"\n(B,Hq,Hkv,N,D,nq)=({B},{Hq},{Hkv},{N},{D},{nq}) rows={G * nq}: bf16 folded cuDNN {cud:.1f} flash {fla:.1f}")
    res = {}
    for cfg in [None] + CFGS:
        kwc = {} if cfg is None else dict(block_n=cfg[0], num_warps=cfg[1], num_stages=cfg[2])
        try:
            us = t(lambda: Dk.decode_fwd(q, cache, scale=sc, kernel="triton", **kwc))
            o = Dk.decode_fwd(q, cache, scale=sc, kernel="triton", **kwc)[0].float()
            err = ((o - exact).norm() / exact.norm()).item()
        except Exception as e:  # noqa: BLE001
            P(f"  cfg {cfg}: failed {type(e).__name__}: {str(e)[:150]}")
            continue
        res[cfg] = us
        P(f"  cfg {cfg or 'default'}: {us:8.1f} us  x cuDNN-folded {cud / us:.2f}  err vs exact {err:.4f}")
    best = min((c for c in res if c is not None), key=res.get)
    for per_sm in (1, 2, 4, 6):
        kwc = dict(block_n=best[0], num_warps=best[1], num_stages=best[2], per_sm=per_sm)
        us = t(lambda: Dk.decode_fwd(q, cache, scale=sc, kernel="triton", **kwc))
        P(f"  best {best} per_sm {per_sm}: {us:8.1f} us  x cuDNN-folded {cud / us:.2f}")
    for st in (3, 4):
        kwc = dict(block_n=best[0], num_warps=best[1], num_stages=st)
        us = t(lambda: Dk.decode_fwd(q, cache, scale=sc, kernel="triton", **kwc))
        P(f"  best {best[:2]} stages {st}: {us:8.1f} us")
