"""Forty-fourth session: programs per SM / splits of the FP4 decode on the H100, back to back. `decode_fwd`'s
`per_sm` (the Gluon kernel's register cap follows it) and explicit split counts; CUDA-graph replays of one call and of
REPS calls, rounds alternating, min per variant.

    OUT=out PYTHONPATH=src python benchmarks/overhead-s44/ab_split.py
"""
import os
import sys

import torch

import fp4attn
from fp4attn.bench.common import capture_graph, time_ms
from fp4attn.bench.decode import decode_inputs
from fp4attn.kernels import decode as kdec

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "decode-prologue-s42"))
from _log import logger  # noqa: E402

REP = float(os.environ.get("REP_MS", 60))
REPS = int(os.environ.get("REPS", 10))
ROUNDS = int(os.environ.get("ROUNDS", 3))
CASES = os.environ.get("CASES", "1,32,8,131072,128;8,32,8,32768,128")
# per_sm=<n> or splits=<n>
VARIANTS = os.environ.get("VARIANTS", "default,per_sm=12,per_sm=14,per_sm=8,splits=128,splits=192,splits=320")


def timed(fn, reps):
    g = capture_graph(fn, reps=reps)
    return lambda: time_ms(g.replay, warmup_ms=REP / 4, rep_ms=REP) * 1e3 / reps


def main():
    P = logger("ab_split.txt")
    P(torch.cuda.get_device_name(), torch.__version__, f"REPS={REPS} ROUNDS={ROUNDS}")
    for spec in CASES.split(";"):
        B, Hq, Hkv, N, D = map(int, spec.split(","))
        q, k, v = decode_inputs(B, Hq, Hkv, N, D)
        cache = fp4attn.KVCache.from_dense(k, v)
        del k, v
        fns = {}
        for n in VARIANTS.split(","):
            kw = {}
            if n.startswith("per_sm="):
                kw["per_sm"] = int(n.split("=")[1])
            elif n.startswith("splits="):
                kw["num_splits"] = int(n.split("=")[1])
            f = (lambda kw=kw, q=q, cache=cache, D=D: kdec.decode_fwd(q, cache, scale=D ** -0.5, **kw))
            fns[n] = (timed(f, 1), timed(f, REPS))
        t = {n: [float("inf")] * 2 for n in fns}
        for _ in range(ROUNDS):
            for n, (f1, fb) in fns.items():
                t[n] = [min(t[n][0], f1()), min(t[n][1], fb())]
        P(f"\n== ({B},{Hq},{Hkv},{N},{D})")
        P("variant | 1/replay us | vs default | b2b us | vs default")
        b1, bb = t["default"]
        for n in fns:
            P(f"{n} | {t[n][0]:.1f} | {b1 / t[n][0]:.3f} | {t[n][1]:.1f} | {bb / t[n][1]:.3f}")
        del q, cache, fns


if __name__ == "__main__":
    main()
