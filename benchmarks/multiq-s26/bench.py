"""Decode with several new query tokens per sequence (speculative decoding: 1..16 draft tokens), wider GQA groups
and D = 64 (twenty-sixth session): FP4 decode's split kernels (Triton, Gluon where it supports the rows) and the op
against bf16 SDPA (cuDNN, flash) on the same context, CUDA-graph replays, one process.

The bf16 baselines run the n_q new queries over the whole bf16 context without a mask (a causal bottom-right mask
changes only the last n_q keys' work): SDPA as a transformers model calls it, q (B, Hq, n_q, D) with enable_gqa
(for n_q > 1 neither backend reads a kv page once per GQA group), and "folded": q viewed as (B, Hkv, G·n_q, D)
against the kv heads, each bf16 page read once per group (the bound for a bf16 decode kernel).
Usage: OUT=out PYTHONPATH=src python benchmarks/multiq-s26/bench.py"""
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
from fp4attn.kernels import decode_gluon  # noqa: E402

P = logger(os.environ.get("BENCH_LOG", "bench.txt"))
P(torch.cuda.get_device_name(), torch.__version__, triton.__version__)
REP = float(os.environ.get("REP_MS", 50))
NQS = [int(x) for x in os.environ.get("NQS", "1,2,4,8,16").split(",")]
SHAPES = os.environ.get("SHAPES", "8,32,8,32768,128;8,64,8,32768,128;8,64,8,32768,64;1,32,8,131072,128")


def t(fn):
    ms = graph_time_ms(fn, REP)
    return float("nan") if ms is None else ms * 1e3  # µs per replay


for spec in SHAPES.split(";"):
    B, Hq, Hkv, N, D = (int(x) for x in spec.split(","))
    g = torch.Generator(device="cuda").manual_seed(0)
    kw = dict(device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(B, Hkv, N, D, **kw)
    v = torch.randn(B, Hkv, N, D, **kw)
    cache = fp4attn.KVCache.from_dense(k, v)
    sc = D ** -0.5
    G = Hq // Hkv
    P(f"\n(B,Hq,Hkv,N,D)=({B},{Hq},{Hkv},{N},{D}) G={G}")
    for nq in NQS:
        q = torch.randn(B, Hq, nq, D, **kw)
        cud = t(sdpa_fn(SDPBackend.CUDNN_ATTENTION, q, k, v))
        fla = t(sdpa_fn(SDPBackend.FLASH_ATTENTION, q, k, v))
        qf = q.view(B, Hkv, G * nq, D)  # the group folded into the query length: each bf16 page read once per group
        cudf = t(sdpa_fn(SDPBackend.CUDNN_ATTENTION, qf, k, v))
        flaf = t(sdpa_fn(SDPBackend.FLASH_ATTENTION, qf, k, v))
        tri = t(lambda: Dk.decode_fwd(q, cache, scale=sc, kernel="triton"))  # rows along M above 16 rows
        # what ran before the twenty-sixth session above 16 rows: the transposed tiles
        old = t(lambda: Dk.decode_fwd(q, cache, scale=sc, kernel="triton", rowm=False)) if G * nq > 16 else tri
        gl_ok = decode_gluon.supported(D, G * nq, 32, cache.page_size)
        glu = t(lambda: Dk.decode_fwd(q, cache, scale=sc, kernel="gluon")) if gl_ok else float("nan")
        op = t(lambda: fp4attn.decode(q, cache))
        o = fp4attn.decode(q, cache).float()
        ref = Dk.decode_fwd(q, cache, scale=sc, kernel="triton")[0].float()
        rel = ((o - ref).norm() / ref.norm()).item()
        best_f = min(x for x in (cudf, flaf) if x == x)
        P(f"n_q={nq:2d} rows={G * nq:3d}: SDPA cuDNN {cud:7.1f} flash {fla:7.1f} folded cuDNN {cudf:7.1f} flash "
          f"{flaf:7.1f} | FP4 triton {tri:7.1f} (transposed {old:7.1f}) gluon {glu:7.1f} op {op:7.1f} | "
          f"op x SDPA cuDNN {cud / op:.2f} "
          f"x best folded {best_f / op:.2f} | op vs triton rel {rel:.1e}")
    torch.cuda.empty_cache()
