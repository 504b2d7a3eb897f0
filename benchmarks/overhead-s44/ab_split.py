"""Forty-fourth session: programs per SM / splits of the FP4 decode on the H100, back to back. `decode_fwd`'s
`per_sm` (the Gluon kernel's register cap follows it) and explicit split counts; CUDA-graph replays of one call and of
REPS calls, rounds alternating, min per variant.

    OUT=out PYTHONPATH=src python benchmarks/overhead-s44/ab_split.py
"""
import os

from _ab import cases, header, logger, rounds_min, timers

from fp4attn.kernels import decode as kdec

# per_sm=<n> or splits=<n>
VARIANTS = os.environ.get("VARIANTS", "default,per_sm=12,per_sm=14,per_sm=8,splits=128,splits=192,splits=320")


def main():
    P = logger("ab_split.txt")
    header(P)
    for (B, Hq, Hkv, N, D), q, k, v, cache in cases("1,32,8,131072,128;8,32,8,32768,128"):
        del k, v
        fns = {}
        for n in VARIANTS.split(","):
            kw = {}
            if n.startswith("per_sm="):
                kw["per_sm"] = int(n.split("=")[1])
            elif n.startswith("splits="):
                kw["num_splits"] = int(n.split("=")[1])
            fns[n] = timers(lambda kw=kw, q=q, cache=cache, D=D: kdec.decode_fwd(q, cache, scale=D ** -0.5, **kw))
        t = rounds_min(fns)
        P(f"\n== ({B},{Hq},{Hkv},{N},{D})")
        P("variant | 1/replay us | vs default | b2b us | vs default")
        b1, bb = t["default"]
        for n in fns:
            P(f"{n} | {t[n][0]:.1f} | {b1 / t[n][0]:.3f} | {t[n][1]:.1f} | {bb / t[n][1]:.3f}")
        del q, cache, fns


if __name__ == "__main__":
    main()
