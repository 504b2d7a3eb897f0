"""Forty-fifth session: the FP4 decode's next tile carried in registers (PIPE), on the H200 and the H100. Variants of
`decode_fwd`: default (the op's config), per_sm=<n> (programs per SM, the register cap following), pipe / nopipe (the
`pipe` switch, each at its own config: 12 / 16 programs per SM). pipe12 is the forty-third session's probe on the tree
before PIPE was in src/: PIPE at 12 per SM, with `benchmarks/layout-s43/probe_switches.patch` applied (PROBE_PIPE,
read at launch, i.e. at graph capture); there "default" is 16 per SM without PIPE. CUDA-graph replays of one call and
of REPS calls back to back, rounds alternating, min per variant; cuDNN bf16 decode of the same shape beside them;
outputs compared with the default's (equal only at equal splits).

    git checkout c1fab4c -- src && git apply benchmarks/layout-s43/probe_switches.patch   # the first runs
    VARIANTS=default,per_sm=12,pipe12 OUT=out PYTHONPATH=src:benchmarks/overhead-s44 \
        python benchmarks/pipe-s45/ab_pipe.py
    VARIANTS=default,nopipe OUT=out PYTHONPATH=src:benchmarks/overhead-s44 python benchmarks/pipe-s45/ab_pipe.py
"""
import os

import torch
from _ab import cases, header, logger, rounds_min, timers

from fp4attn.bench.decode import sdpa_fn
from fp4attn.kernels import decode as kdec

VARIANTS = os.environ.get("VARIANTS", "default,nopipe")
SHAPES = ("8,32,8,32768,128;1,32,8,131072,128;8,32,8,16384,128;4,32,32,16384,128;8,16,8,32768,128")  # or $CASES


def call(q, cache, D, n):
    """decode_fwd under variant n (the switches are read at launch: call it outside and inside a graph capture)."""
    kw = {}
    os.environ["PROBE_PIPE"] = "1" if n == "pipe12" else "0"
    if n.startswith("per_sm="):
        kw["per_sm"] = int(n.split("=")[1])
    elif n == "pipe12":
        kw["per_sm"] = 12
    elif n in ("pipe", "nopipe"):
        kw["pipe"] = n == "pipe"
    return kdec.decode_fwd(q, cache, scale=D ** -0.5, **kw)


def main():
    P = logger("ab_pipe.txt")
    header(P)
    for (B, Hq, Hkv, N, D), q, k, v, cache in cases(SHAPES):
        cu = timers(sdpa_fn(torch.nn.attention.SDPBackend.CUDNN_ATTENTION, q, k, v))
        del k, v
        base = call(q, cache, D, "default")
        fns = {"cudnn": cu}
        for n in VARIANTS.split(","):
            o = call(q, cache, D, n)
            same = torch.equal(o[0], base[0]) if isinstance(o, tuple) else torch.equal(o, base)
            P(f"({B},{Hq},{Hkv},{N},{D}) {n}: outputs bit-equal to default: {same}")
            fns[n] = timers(lambda n=n, q=q, cache=cache, D=D: call(q, cache, D, n))
        os.environ["PROBE_PIPE"] = "0"
        t = rounds_min(fns)
        P(f"\n== ({B},{Hq},{Hkv},{N},{D})")
        P("variant | 1/replay us | x cuDNN | vs default | b2b us | x cuDNN b2b | vs default")
        b1, bb = t["default"]
        c1, cb = t["cudnn"]
        for n in fns:
            P(f"{n} | {t[n][0]:.1f} | {c1 / t[n][0]:.3f} | {b1 / t[n][0]:.3f} | {t[n][1]:.1f} | {cb / t[n][1]:.3f} | "
              f"{bb / t[n][1]:.3f}")
        del q, cache, fns


if __name__ == "__main__":
    main()
