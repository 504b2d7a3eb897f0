"""Forty-fourth session: how much of an FP4 decode step is fixed cost (launches, prologue, epilogue, the split
reduce, the wave's tail) and how much is per key tile? The grid is held at the default split count of the full
context and the context shortened, so that every program runs t tiles (t = 1 .. the default); CUDA-graph replays of
the public op, plus per-kernel durations (torch.profiler, eager calls) at the two issue shapes.

    OUT=out PYTHONPATH=src python benchmarks/overhead-s44/scan.py
"""
import os
import sys

import torch

import fp4attn
from fp4attn.bench.common import graph_time_ms
from fp4attn.bench.decode import decode_inputs, sdpa_fn
from fp4attn.kernels import decode as kdec

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "decode-prologue-s42"))
from _log import logger  # noqa: E402

REP = float(os.environ.get("REP_MS", 60))


def build(B, Hq, Hkv, N, D):
    q, k, v = decode_inputs(B, Hq, Hkv, N, D)
    cache = fp4attn.KVCache.from_dense(k, v)
    return q, k, v, cache


def main():
    P = logger("scan.txt")
    P(torch.cuda.get_device_name(), torch.__version__)
    for B, full, splits in ((8, 32768, 32), (1, 131072, 256)):
        Hq, Hkv, D = 32, 8, 128
        P(f"\n== B={B}, {splits} splits (grid {splits * B * Hkv}), tiles of 32 keys per split t")
        P("t | ctx | op us | cuDNN us | op/t slope")
        t = 1
        rows = []
        while t * 32 * splits <= full:
            N = t * 32 * splits
            q, k, v, cache = build(B, Hq, Hkv, N, D)
            f = (lambda q=q, cache=cache, s=splits: fp4attn.decode(q, cache, num_splits=s))
            ms = graph_time_ms(f, REP)
            cu = graph_time_ms(sdpa_fn("cudnn", q, k, v), REP) if t in (1, full // (32 * splits)) else None
            rows.append((t, ms * 1e3))
            P(f"{t} | {N} | {ms * 1e3:.1f} | {'' if cu is None else f'{cu * 1e3:.1f}'}")
            del q, k, v, cache
            t *= 2
        # least squares intercept/slope over the points
        n = len(rows)
        sx = sum(r[0] for r in rows)
        sy = sum(r[1] for r in rows)
        sxx = sum(r[0] ** 2 for r in rows)
        sxy = sum(r[0] * r[1] for r in rows)
        b = (n * sxy - sx * sy) / (n * sxx - sx * sx)
        a = (sy - b * sx) / n
        P(f"fit: {a:.1f} us + {b:.2f} us per tile")
    # per-kernel durations at the issue shapes (eager; PDL on, then off)
    for B, N in ((8, 32768), (1, 131072)):
        q, k, v, cache = build(B, 32, 8, N, 128)
        for pdl in (True, False):
            kdec._PDL = pdl
            f = (lambda q=q, cache=cache: fp4attn.decode(q, cache))
            for _ in range(5):
                f()
            torch.cuda.synchronize()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(20):
                    f()
                torch.cuda.synchronize()
            P(f"\n== kernels at B={B}, N={N}, PDL={pdl} (eager, 20 calls)")
            for e in prof.key_averages():
                if e.device_type == torch.autograd.DeviceType.CUDA or getattr(e, "device_time_total", 0):
                    P(f"{e.key[:60]:60s} n={e.count:3d} avg={e.device_time_total / max(1, e.count):8.2f} us")
            P(f"graph op: {graph_time_ms(f, REP) * 1e3:.1f} us")
        kdec._PDL = True
        del q, k, v, cache


if __name__ == "__main__":
    main()
