"""Why windowed decode at w=1024 timed slower than at w=4096 and sinks added ~0.1 ms (window-s23 probe, H100):
eager do_bench vs CUDA-graph replay (launch overhead removed), and the kernels one call launches (profiler).
Usage: OUT=out python benchmarks/window-s24/decode_window_profile.py
(The recorded run timed the graph with a local copy of ``fp4attn.bench.common.graph_time_ms``; same warmup.)"""
# ruff: noqa: B023
import os
import sys

import torch
import triton

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "decode-s10"))
from _util import logger  # noqa: E402

import fp4attn  # noqa: E402
from fp4attn.bench.common import graph_time_ms  # noqa: E402

P = logger("decode_window_profile.txt")
P(torch.cuda.get_device_name(), torch.__version__, triton.__version__)

g = torch.Generator(device="cuda").manual_seed(0)
B, Hq, Hkv, N, D = 8, 32, 8, 32768, 128
kw = dict(device="cuda", dtype=torch.bfloat16, generator=g)
k = torch.randn(B, Hkv, N, D, **kw)
v = torch.randn(B, Hkv, N, D, **kw)
q = torch.randn(B, Hq, 1, D, **kw)
cache = fp4attn.KVCache.from_dense(k, v)
sinks = torch.zeros(Hq, device="cuda")
for w in (256, 1024, 4096, None):
    for s in (None, sinks):
        wk = None if w is None else (w - 1, 0)
        fn = lambda: fp4attn.decode(q, cache, window_size=wk, sinks=s)
        eager = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
        gr = graph_time_ms(fn, 100)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        kern = ", ".join(f"{e.key[:40]} {e.device_time_total:.1f}us" for e in prof.key_averages()
                         if e.device_time_total > 0)
        P(f"w={w} sinks={s is not None}: eager {eager * 1e3:.1f} us, graph {gr * 1e3:.1f} us | {kern}")
