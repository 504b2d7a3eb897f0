"""Splits for short decode loops (twenty-fifth session): `default_splits` keeps >= 4 tiles per split, so a
windowed or short-context decode runs few splits, each a chain of dependent tile loads. Times the op's split
counts against 1-3 tiles per split (CUDA-graph replays of `decode_fwd`, kernel "auto"), one process.
Usage: OUT=out PYTHONPATH=src python benchmarks/gluon-window-s25/splits_probe.py"""
# ruff: noqa: B023
import os
import sys

import torch
import triton

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "decode-s10"))
from _util import logger  # noqa: E402

import fp4attn  # noqa: E402
from fp4attn.bench.common import graph_time_ms  # noqa: E402
from fp4attn.kernels import decode as Dk  # noqa: E402

P = logger("splits_probe.txt")
P(torch.cuda.get_device_name(), torch.__version__, triton.__version__)
Hq, Hkv, D = 32, 8, 128
CASES = [(8, 32768, 128), (8, 32768, 512), (8, 32768, 1024), (8, 32768, 4096), (1, 131072, 128),
         (1, 131072, 1024), (1, 131072, 4096), (8, 512, None), (8, 1024, None), (8, 2048, None), (8, 4096, None),
         (1, 1024, None), (1, 4096, None), (1, 16384, None), (32, 1024, None), (32, 4096, None)]
for B, N, w in CASES:
    g = torch.Generator(device="cuda").manual_seed(0)
    k = torch.randn(B, Hkv, N, D, device="cuda", dtype=torch.bfloat16, generator=g)
    cache = fp4attn.KVCache.from_dense(k, torch.randn_like(k))
    q = torch.randn(B, Hq, 1, D, device="cuda", dtype=torch.bfloat16, generator=g)
    max_c = N - N % 16 if w is None else min(N - N % 16, w + 1 + 32)
    tiles = -(-max_c // 32)
    default = Dk.default_splits(B, Hkv, max_c, 32, q.device, 16)  # before min_programs
    new = Dk.default_splits(B, Hkv, max_c, 32, q.device, 16, None, 512)
    res = {}
    for tps in (None, 0, 1, 2, 3):
        ns = default if tps is None else new if tps == 0 else -(-tiles // tps)
        if ns in res:
            continue
        res[ns] = graph_time_ms(lambda: Dk.decode_fwd(q, cache, scale=D ** -0.5, window=w, num_splits=ns), 60) * 1e3
    best = min(res, key=res.get)
    P(f"B={B} N={N} w={w} tiles={tiles}: default {default} splits {res[default]:.1f} us, min_programs=512: {new} "
      f"splits {res[new]:.1f} us ({res[default] / res[new]:.2f}x) | "
      + ", ".join(f"{ns}: {t:.1f}" for ns, t in sorted(res.items()))
      + f" | best {best} ({res[default] / res[best]:.2f}x)")
