"""Twenty-ninth session, second probe: loads one tile ahead in the Gluon decode kernel's unmasked run
(``FP4ATTN_GL_PREFETCH``: 0 none, 1 the page-table entry, 2 the tile's bytes), against the tree before
(``fp4attn_old``), ``decode_fwd`` in CUDA graphs, rounds alternating, min per variant; outputs compared bit for bit.

    OLD_SRC=.ab_old/src OUT=out PYTHONPATH=src python benchmarks/f2fp-s29/ab2.py      # $OUT/ab2.txt
"""
# ruff: noqa: B023
import os

import torch
from _ab import fp4attn_old, logger, rounds, shapes

from fp4attn.kernels import decode as Dk

Dk_old = fp4attn_old.kernels.decode
P = logger("ab2.txt")
CASES = os.environ.get("CASES", "8,32,8,32768,128,1;1,32,8,131072,128,1;8,32,8,32768,64,1;8,16,8,32768,256,1;"
                                "4,32,32,16384,96,1;8,32,8,32768,128,4")
VARIANTS = [v for v in os.environ.get("VARIANTS", "pf0,pf1,pf2@12,pf1@12").split(",") if v]


def new_fn(q, cache, sc, var):
    """``var``: "pf<N>[f][@<per_sm>]": prefetch mode N, "f": the F2FP decode (FP4ATTN_GL_F2FP=1), programs per SM."""
    pf, _, per_sm = var[2:].partition("@")
    f2fp = pf.endswith("f")
    pf = pf.rstrip("f")
    kw = {"per_sm": int(per_sm)} if per_sm else {}

    def f():
        os.environ["FP4ATTN_GL_PREFETCH"] = pf
        os.environ["FP4ATTN_GL_F2FP"] = "1" if f2fp else "0"
        try:
            return Dk.decode_fwd(q, cache, scale=sc, **kw)
        finally:
            os.environ["FP4ATTN_GL_PREFETCH"] = "0"
            os.environ["FP4ATTN_GL_F2FP"] = "0"
    return f


last = None
for D, _nq, k, v, cache, q, cud in shapes(CASES, P):
    sc = D ** -0.5
    if cache is not last:
        cache_old, last = fp4attn_old.KVCache.from_dense(k, v), cache
    ref = Dk_old.decode_fwd(q, cache_old, scale=sc)
    fns = {"old": lambda: Dk_old.decode_fwd(q, cache_old, scale=sc)}
    for var in VARIANTS:
        fns[var] = new_fn(q, cache, sc, var)
        o = fns[var]()
        same_splits = "@" not in var
        eq = torch.equal(o[0], ref[0]) and torch.equal(o[1], ref[1])
        P(f"  {var}: bits equal to old: {eq}" + ("" if same_splits else " (other splits: not expected)")
          + f"; max |diff| {(o[0].float() - ref[0].float()).abs().max().item():.3g}")
    best, res = rounds(fns)
    for n in fns:
        P(f"  {n:8s} {best[n]:8.1f} us  {cud / best[n]:5.2f}x cuDNN  old/this {best['old'] / best[n]:5.3f}  "
          f"rounds {['%.1f' % x for x in res[n]]}")
