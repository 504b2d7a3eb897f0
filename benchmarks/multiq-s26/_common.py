"""Shared setup of this folder's scripts (the shared lines moved here after their runs; behaviour unchanged): the
log, CUDA-graph timing in µs, and the cases' bf16 K/V and FP4 cache, built once per shape."""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "decode-s10"))
from _util import logger  # noqa: E402

import fp4attn  # noqa: E402
from fp4attn.bench.common import graph_time_ms  # noqa: E402


def log(default: str):
    return logger(os.environ.get("BENCH_LOG", default))


def t(fn, rep_ms: float) -> float:
    """µs per CUDA-graph replay of ``fn`` (nan where capture fails)."""
    ms = graph_time_ms(fn, rep_ms)
    return float("nan") if ms is None else ms * 1e3


def cases(spec: str):
    """``spec`` "B,Hq,Hkv,N,D,nq;..." -> (B, Hq, Hkv, N, D, nq, k, v, cache, q) per case, the bf16 K/V (seed 0) and the
    FP4 cache shared by consecutive cases of one (B, Hkv, N, D)."""
    prev = None
    for item in spec.split(";"):
        B, Hq, Hkv, N, D, nq = (int(x) for x in item.split(","))
        if prev != (B, Hkv, N, D):
            cache = None
            torch.cuda.empty_cache()
            g = torch.Generator(device="cuda").manual_seed(0)
            kw = dict(device="cuda", dtype=torch.bfloat16, generator=g)
            k = torch.randn(B, Hkv, N, D, **kw)
            v = torch.randn(B, Hkv, N, D, **kw)
            cache = fp4attn.KVCache.from_dense(k, v)
            prev = (B, Hkv, N, D)
        yield B, Hq, Hkv, N, D, nq, k, v, cache, torch.randn(B, Hq, nq, D, **kw)
