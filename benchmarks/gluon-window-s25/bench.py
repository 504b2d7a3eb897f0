"""Sliding windows and sinks in the Gluon decode split kernel (twenty-fifth session): the Gluon kernel against the
Triton split kernel (what windowed / sink decode ran before) and bf16 SDPA, CUDA-graph replays, one process.

Baselines: cuDNN SDPA over the whole bf16 context (sinks: the same, SDPA has none) and, for a window of w keys,
cuDNN SDPA over the last w + 1 keys of the dense bf16 cache (what a bf16 decode of a window reads).
Usage: OUT=out PYTHONPATH=src python benchmarks/gluon-window-s25/bench.py"""
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

P = logger("bench.txt")
P(torch.cuda.get_device_name(), torch.__version__, triton.__version__)
REP = 60


def t(fn):
    return graph_time_ms(fn, REP) * 1e3  # µs per replay


for B, Hq, Hkv, N, D in ((8, 32, 8, 32768, 128), (1, 32, 8, 131072, 128)):
    g = torch.Generator(device="cuda").manual_seed(0)
    kw = dict(device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(B, Hkv, N, D, **kw)
    v = torch.randn(B, Hkv, N, D, **kw)
    q = torch.randn(B, Hq, 1, D, **kw)
    cache = fp4attn.KVCache.from_dense(k, v, keep_16bit=True)
    sinks = torch.randn(Hq, device="cuda")
    sc = D ** -0.5
    cud = t(sdpa_fn(SDPBackend.CUDNN_ATTENTION, q, k, v))
    P(f"\n(B,Hq,Hkv,N,D)=({B},{Hq},{Hkv},{N},{D}) cuDNN full context {cud:.1f} us")
    for w in (None, 128, 1024, 4096):
        base = cud if w is None else t(sdpa_fn(SDPBackend.CUDNN_ATTENTION, q, k[:, :, N - w - 1:],
                                               v[:, :, N - w - 1:]))
        for s in (None, sinks):
            if w is None and s is None:
                continue
            row = {}
            for kern in ("triton", "gluon"):
                row[kern] = t(lambda: Dk.decode_fwd(q, cache, scale=sc, window=w, sinks=s, kernel=kern))
            op = t(lambda: fp4attn.decode(q, cache, window_size=None if w is None else (w, 0), sinks=s))
            sel = Dk.select_pages(q, cache, 0.05, window=w)
            th = {kern: t(lambda: Dk.decode_fwd(q, cache, scale=sc, selection=sel, window=w, sinks=s, kernel=kern))
                  for kern in ("triton", "gluon")}
            thop = t(lambda: fp4attn.decode(q, cache, thrift_budget=0.05,
                                            window_size=None if w is None else (w, 0), sinks=s))
            o_t = Dk.decode_fwd(q, cache, scale=sc, window=w, sinks=s, kernel="triton")[0].float()
            o_g = Dk.decode_fwd(q, cache, scale=sc, window=w, sinks=s, kernel="gluon")[0].float()
            rel = ((o_g - o_t).norm() / o_t.norm()).item()
            P(f"w={w} sinks={s is not None}: bf16 cuDNN {base:.1f} | FP4 triton {row['triton']:.1f} "
              f"gluon {row['gluon']:.1f} ({row['triton'] / row['gluon']:.2f}x) op {op:.1f} ({base / op:.2f}x bf16) | "
              f"Thrift5% triton {th['triton']:.1f} gluon {th['gluon']:.1f} "
              f"({th['triton'] / th['gluon']:.2f}x) op {thop:.1f} ({base / thop:.2f}x bf16) | "
              f"gluon vs triton rel {rel:.1e}")
    torch.cuda.empty_cache()

# host time of eager decode calls (B=1, short context): where it goes
import cProfile  # noqa: E402
import io  # noqa: E402
import pstats  # noqa: E402
import time  # noqa: E402

k = torch.randn(1, 8, 4096, 128, device="cuda", dtype=torch.bfloat16)
c = fp4attn.KVCache.from_dense(k, k.clone(), keep_16bit=True)
q = torch.randn(1, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
s = torch.zeros(32, device="cuda")
for name, kw in (("plain", {}), ("window", dict(window_size=(1024, 0))), ("sinks", dict(sinks=s)),
                 ("thrift", dict(thrift_budget=0.05))):
    for _ in range(20):
        fp4attn.decode(q, c, **kw)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(200):
        fp4attn.decode(q, c, **kw)
    host = (time.perf_counter() - t0) / 200 * 1e6
    torch.cuda.synchronize()
    P(f"\nhost {name}: {host:.1f} us per eager call (launch loop, no sync)")
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(200):
        fp4attn.decode(q, c, **kw)
    pr.disable()
    torch.cuda.synchronize()
    buf = io.StringIO()
    pstats.Stats(pr, stream=buf).sort_stats("tottime").print_stats(18)
    P(buf.getvalue())
