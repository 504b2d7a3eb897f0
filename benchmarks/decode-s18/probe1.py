"""cp.async tile ring in the Gluon decode kernel (session 18): bit-equality of ring depths 0 / 2 / 3, then
a sweep (ring, register cap, programs per SM) against cuDNN at `bench decode`'s shapes, CUDA-graph medians."""
import os
import sys

import torch

from fp4attn.bench.common import graph_time_ms
from fp4attn.kernels import decode as Dk

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "decode-s10"))
from _util import RAGGED_CASES, SHAPES, decode_case, logger, print_times, ragged_case  # noqa: E402

P = logger("probe1.txt")
torch.manual_seed(0)
bad = 0
for (B, Hq, Hkv, lens, D, NQ) in RAGGED_CASES:
    q, cache = ragged_case(B, Hq, Hkv, lens, D, NQ)
    sc = D ** -0.5
    for ns in (1, 3, 7):
        for bn in (32, 64):
            o0, l0 = Dk.decode_fwd(q, cache, scale=sc, num_splits=ns, block_n=bn, kernel="gluon", ring=0)
            for ring, mr in ((2, 128), (3, 128), (2, 0)):
                o, l = Dk.decode_fwd(q, cache, scale=sc, num_splits=ns, block_n=bn, kernel="gluon", ring=ring,
                                     maxnreg=mr)
                if not (torch.equal(o, o0) and torch.equal(l, l0)):
                    bad += 1
                    P(f"DIFF B{B} lens{lens} D{D} NQ{NQ} ns{ns} bn{bn} ring{ring}: "
                      f"{(o.float() - o0.float()).abs().max().item():.3e}")
    # Thrift (64-key tiles)
    if D == 128:
        c16 = __import__("fp4attn").KVCache.from_dense(*[torch.randn(B, Hkv, max(lens), D, device="cuda",
                                                         dtype=torch.bfloat16) for _ in range(2)],
                                                       lengths=lens, keep_16bit=True)
        sel = Dk.select_pages(q, c16, 0.1)
        o0, l0 = Dk.decode_fwd(q, c16, scale=sc, selection=sel, num_splits=3, kernel="gluon", ring=0)
        o, l = Dk.decode_fwd(q, c16, scale=sc, selection=sel, num_splits=3, kernel="gluon", ring=2)
        if not (torch.equal(o, o0) and torch.equal(l, l0)):
            bad += 1
            P(f"DIFF thrift B{B} lens{lens}")
P("bit-equality ring 2/3 vs direct loads: mismatching cases", bad)

for (B, Hq, Hkv, N, D) in SHAPES:
    q, k, v, cache, cud = decode_case(B, Hq, Hkv, N, D, keep_16bit=True)
    sel = Dk.select_pages(q, cache, 0.05)
    res = {}
    for _rep in range(2):
        res.setdefault("cudnn", []).append(graph_time_ms(cud, 40))
        for ring, mr, ps in ((0, 0, 16), (2, 128, 16), (2, 0, 12), (2, 112, 18), (2, 104, 19), (2, 96, 21),
                             (3, 128, 14), (3, 112, 16), (2, 128, 12), (2, 128, 14)):
            res.setdefault(f"ring{ring} reg{mr} ps{ps}", []).append(graph_time_ms(
                lambda q=q, c=cache, d=D, r=ring, m=mr, p=ps: Dk.decode_fwd(q, c, scale=d ** -0.5, ring=r, maxnreg=m,
                                                                          per_sm=p), 40))
        for ring, ps in ((0, 12), (2, 10), (2, 11), (2, 8)):
            res.setdefault(f"thrift ring{ring} ps{ps}", []).append(graph_time_ms(
                lambda q=q, c=cache, d=D, s=sel, r=ring, p=ps: Dk.decode_fwd(q, c, scale=d ** -0.5, selection=s, ring=r,
                                                                          per_sm=p), 40))
    print_times(P, (B, Hq, Hkv, N, D), res, width=24)
    del k, v, cache
    torch.cuda.empty_cache()
