"""Twenty-ninth session: the Gluon decode kernel's E2M1 decode through fp16 high bytes and byte permutes (no
F2FP.F16.E4M3.UNPACK_B) against the tree before (a copy importable as ``fp4attn_old``, see
benchmarks/grid-s19/ab.py), CUDA-graph replays of the public op, rounds alternating old/new, min per variant;
outputs compared bit for bit (the new decode yields value·2^-14 instead of value·2^-6, folded into the same FP32
factors: the same bits are expected).

    OLD_SRC=.ab_old/src OUT=out PYTHONPATH=src python benchmarks/f2fp-s29/ab.py      # $OUT/ab.txt
"""
# ruff: noqa: B023
import os

import torch
from _ab import fp4attn_old, logger, rounds, shapes

import fp4attn

P = logger("ab.txt")
CASES = os.environ.get("CASES", "8,32,8,32768,128,1;1,32,8,131072,128,1;8,64,8,32768,128,1;8,32,8,32768,64,1;"
                                "8,16,8,32768,256,1;4,32,32,16384,96,1;8,32,8,32768,128,4")
THRIFT = float(os.environ.get("THRIFT", 0.05))

last = None
for D, nq, k, v, cache, q, cud in shapes(CASES, P):
    if cache is not last:
        cache_old, last = fp4attn_old.KVCache.from_dense(k, v), cache
        c16 = fp4attn.KVCache.from_dense(k, v, keep_16bit=True) if D == 128 and nq == 1 else None
        c16_old = fp4attn_old.KVCache.from_dense(k, v, keep_16bit=True) if c16 is not None else None
    eq = torch.equal(fp4attn.decode(q, cache), fp4attn_old.decode(q, cache_old))
    fns = {"op old": lambda: fp4attn_old.decode(q, cache_old), "op new": lambda: fp4attn.decode(q, cache)}
    if c16 is not None:
        eq16 = torch.equal(fp4attn.decode(q, c16, thrift_budget=THRIFT),
                           fp4attn_old.decode(q, c16_old, thrift_budget=THRIFT))
        fns["thrift old"] = lambda: fp4attn_old.decode(q, c16_old, thrift_budget=THRIFT)
        fns["thrift new"] = lambda: fp4attn.decode(q, c16, thrift_budget=THRIFT)
    best, res = rounds(fns)
    P(f"  bits equal: nvfp4 {eq}" + (f", thrift {eq16}" if c16 is not None else ""))
    for pre in ("op", "thrift"):
        if f"{pre} old" in best:
            o, n_ = best[f"{pre} old"], best[f"{pre} new"]
            P(f"  {pre:6s} old {o:8.1f} us ({cud / o:4.2f}x cuDNN)  new {n_:8.1f} us ({cud / n_:4.2f}x cuDNN)  "
              f"old/new {o / n_:5.3f}   rounds old {['%.1f' % x for x in res[pre + ' old']]} "
              f"new {['%.1f' % x for x in res[pre + ' new']]}")
