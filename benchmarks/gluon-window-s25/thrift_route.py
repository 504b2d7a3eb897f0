"""Which split kernel Thrift decode should run (twenty-fifth session): the Gluon FP4 kernel + the 16-bit stream on a
side CUDA stream, or the fused Triton split kernel, as a function of the work B·Hkv·(tokens covered); CUDA-graph
replays, one process. Also the kernels of one windowed Thrift op (its selection's share).
Usage: OUT=out PYTHONPATH=src python benchmarks/gluon-window-s25/thrift_route.py"""
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

P = logger("thrift_route.txt")
P(torch.cuda.get_device_name(), torch.__version__, triton.__version__)
Hq, Hkv, D = 32, 8, 128
for B, N, w in ((1, 4096, None), (1, 16384, None), (1, 32768, None), (8, 2048, None), (8, 4096, None),
                (8, 8192, None), (8, 16384, None), (4, 8192, None), (8, 32768, 2048), (8, 32768, 3072),
                (4, 32768, 4096), (2, 65536, 16384), (1, 131072, 16384), (1, 131072, 32768)):
    g = torch.Generator(device="cuda").manual_seed(0)
    kw = dict(device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(B, Hkv, N, D, **kw)
    cache = fp4attn.KVCache.from_dense(k, torch.randn_like(k), keep_16bit=True)
    q = torch.randn(B, Hq, 1, D, **kw)
    sel = Dk.select_pages(q, cache, 0.05, window=w)
    tt = {kern: graph_time_ms(lambda: Dk.decode_fwd(q, cache, scale=D ** -0.5, selection=sel, window=w, kernel=kern),
                              60) * 1e3 for kern in ("triton", "gluon")}
    op = graph_time_ms(lambda: fp4attn.decode(q, cache, thrift_budget=0.05,
                                              window_size=None if w is None else (w, 0)), 60) * 1e3
    work = B * Hkv * (N if w is None else w + 1)
    P(f"B={B} N={N} w={w} work={work}: triton {tt['triton']:.1f} us, gluon {tt['gluon']:.1f} us "
      f"(triton/gluon {tt['triton'] / tt['gluon']:.2f}), op {op:.1f} us")
    if (B, w) in ((8, 2048), (1, None)) and N in (4096, 32768):
        fn = lambda: fp4attn.decode(q, cache, thrift_budget=0.05, window_size=None if w is None else (w, 0))
        fn()
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        P("  kernels: " + ", ".join(f"{e.key[:36]} {e.device_time_total:.1f}us" for e in prof.key_averages()
                                    if e.device_time_total > 0))
