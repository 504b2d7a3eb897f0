"""Forty-fourth session: the split reduce's shape. Back to back, the FP4 decode step at (1,32,8,128k,128) takes
~3 us more than its split kernel: the reduce (a programmatic dependent) reads 256 splits' partials after the split
kernel ends. Variants: channels per reduce program (DB), its warps, its chunk of splits (BS), PDL off; module knobs
of fp4attn.kernels.decode (`reduce_knobs.patch`). CUDA-graph replays (one call, and REPS back to back), rounds
alternating, min per variant; outputs compared with the first variant's.

    OUT=out PYTHONPATH=src python benchmarks/overhead-s44/ab_reduce.py
"""
import os

from _ab import cases, header, logger, rounds_min, timers

import fp4attn
from fp4attn.kernels import decode as kdec

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


def main():
    P = logger("ab_reduce.txt")
    header(P)
    for (B, Hq, Hkv, N, D), q, k, v, cache in cases("1,32,8,131072,128;8,32,8,32768,128;1,32,8,131072,64;"
                                            "1,32,8,32768,128"):
        del k, v
        fns, outs = {}, {}
        for n in VARIANTS:
            setv(n)
            f = (lambda q=q, cache=cache: fp4attn.decode(q, cache))
            outs[n] = f().float()
            fns[n] = timers(f)
        setv(VARIANTS[0])
        t = rounds_min(fns)
        P(f"\n== ({B},{Hq},{Hkv},{N},{D})")
        P("DB/warps/BS | 1/replay us | vs first | b2b us | vs first | max |diff| vs first")
        b1, bb = t[VARIANTS[0]]
        for n in VARIANTS:
            d = float((outs[n] - outs[VARIANTS[0]]).abs().max())
            P(f"{n} | {t[n][0]:.1f} | {b1 / t[n][0]:.3f} | {t[n][1]:.1f} | {bb / t[n][1]:.3f} | {d:.2e}")
        del q, cache, fns, outs


if __name__ == "__main__":
    main()
