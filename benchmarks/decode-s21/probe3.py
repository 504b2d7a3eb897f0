"""Programmatic dependent launch of the decode reduce kernel (session 21): ``decode._PDL`` "0" (plain launches),
"1" (the reduce launched as a dependent of the split kernel, waiting on griddepcontrol before it reads the
partials), "2" (and the Gluon split kernel triggers its dependents at its start). Outputs must be equal bit for
bit; CUDA-graph times alternate between the variants, min per variant."""
import os
import sys

import torch

from fp4attn.bench.common import graph_time_ms
from fp4attn.kernels import decode as Dk

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "decode-s10"))
from _util import decode_case, logger  # noqa: E402

P = logger("probe3.txt")
VARIANTS = ("0", "1", "2")
for (B, Hq, Hkv, N, D, budget) in [(8, 32, 8, 32768, 128, None), (1, 32, 8, 131072, 128, None),
                                   (32, 32, 8, 2048, 128, None), (8, 32, 8, 32768, 128, 0.05),
                                   (1, 32, 8, 8192, 128, None)]:
    q, k, v, cache, cud = decode_case(B, Hq, Hkv, N, D, keep_16bit=budget is not None)
    sel = Dk.select_pages(q, cache, budget) if budget else None

    def run(q=q, c=cache, d=D, s=sel):
        return Dk.decode_fwd(q, c, scale=d ** -0.5, selection=s)
    outs = {}
    for var in VARIANTS:
        Dk._PDL = var
        outs[var] = run()
    eq = all(torch.equal(outs[v][0], outs["0"][0]) and torch.equal(outs[v][1], outs["0"][1]) for v in VARIANTS)
    t = {v: [] for v in VARIANTS}
    tc = []
    for _ in range(4):
        tc.append(graph_time_ms(cud, 40))
        for var in VARIANTS:
            Dk._PDL = var
            t[var].append(graph_time_ms(run, 40))
    cu = min(tc)
    P(f"{(B, Hq, Hkv, N, D, budget)}: cudnn {cu:.4f} ms; " + "; ".join(
        f"pdl{v} {min(t[v]):.4f} ms ({cu / min(t[v]):.2f}x)" for v in VARIANTS) + f"; bit-equal {eq}")
    Dk._PDL = "1"
    del k, v, cache
    torch.cuda.empty_cache()
