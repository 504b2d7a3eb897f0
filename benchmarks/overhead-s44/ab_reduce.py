"""Forty-fourth session: the split reduce's shape. Back to back, the FP4 decode step at (1,32,8,128k,128) takes
~3 us more than its split kernel: the reduce (a programmatic dependent) reads 256 splits' partials after the split
kernel ends. Variants: channels per reduce program (DB), its warps, its chunk of splits (BS), PDL off; module knobs
of fp4attn.kernels.decode (`reduce_knobs.patch`). CUDA-graph replays (one call, and REPS back to back), rounds
alternating, min per variant; outputs compared with the default's.

    OUT=out PYTHONPATH=src python benchmarks/overhead-s44/ab_reduce.py
"""
# ruff: noqa: B023
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
CASES = os.environ.get("CASES", "1,32,8,131072,128;8,32,8,32768,128;1,32,8,131072,64;1,32,8,32768,128")
# DB/warps/BS[/nopdl]
VARIANTS = os.environ.get("VARIANTS", "32/4/256,16/4/256,8/4/256,16/2/256,8/2/256,8/1/256,16/4/128,32/4/256/nopdl")
VARIANTS = VARIANTS.split(",")


def setv(n):
    """DB/warps/BS[/nopdl] (reduce_knobs.patch); "noq": the split kernel's prologue without q's quantization
    (the PROBE_NOQ switch of noq.patch: wrong numerics, timing only)."""
    os.environ["PROBE_NOQ"] = "1" if n == "noq" else "0"
    if n == "noq":
        return
    p = n.split("/")
    kdec._REDUCE_DB, kdec._REDUCE_WARPS, kdec._REDUCE_BS = int(p[0]), int(p[1]), int(p[2])
    kdec._PDL = "nopdl" not in p


def timed(fn, reps):
    g = capture_graph(fn, reps=reps)
    return lambda: time_ms(g.replay, warmup_ms=REP / 4, rep_ms=REP) * 1e3 / reps


def main():
    P = logger("ab_reduce.txt")
    P(torch.cuda.get_device_name(), torch.__version__, f"REPS={REPS} ROUNDS={ROUNDS}")
    for spec in CASES.split(";"):
        B, Hq, Hkv, N, D = map(int, spec.split(","))
        q, k, v = decode_inputs(B, Hq, Hkv, N, D)
        cache = fp4attn.KVCache.from_dense(k, v)
        del k, v
        fns, outs = {}, {}
        for n in VARIANTS:
            setv(n)
            f = (lambda q=q, cache=cache: fp4attn.decode(q, cache))
            outs[n] = f().float()
            fns[n] = (timed(f, 1), timed(f, REPS))
        setv(VARIANTS[0])
        t = {n: [float("inf")] * 2 for n in fns}
        for _ in range(ROUNDS):
            for n, (f1, fb) in fns.items():
                t[n] = [min(t[n][0], f1()), min(t[n][1], fb())]
        P(f"\n== ({B},{Hq},{Hkv},{N},{D})")
        P("DB/warps/BS | 1/replay us | vs first | b2b us | vs first | max |diff| vs first")
        b1, bb = t[VARIANTS[0]]
        for n in VARIANTS:
            d = float((outs[n] - outs[VARIANTS[0]]).abs().max())
            P(f"{n} | {t[n][0]:.1f} | {b1 / t[n][0]:.3f} | {t[n][1]:.1f} | {bb / t[n][1]:.3f} | {d:.2e}")
        del q, cache, fns, outs


if __name__ == "__main__":
    main()
