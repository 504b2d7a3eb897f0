"""Gluon decode kernel (src/fp4attn/kernels/decode_gluon.py): equality with the Triton kernel, then a
config sweep (tile, register prefetch, programs per SM) against cuDNN, CUDA-graph medians (H200)."""
import os, sys
import torch
from fp4attn.kernels.decode import decode_fwd
from fp4attn.bench.common import graph_time_ms
sys.path.insert(0, os.path.dirname(__file__))
from _util import RAGGED_CASES, SHAPES, decode_case, logger, print_times, ragged_case  # noqa: E402

P = logger("probe2.txt")

torch.manual_seed(0)
dev = "cuda"
worst = 0.0
for (B, Hq, Hkv, lens, D, NQ) in RAGGED_CASES:
    q, cache = ragged_case(B, Hq, Hkv, lens, D, NQ)
    sc = D ** -0.5
    for ns in (1, 3):
        for bn in (32, 64):
            o_ref, l_ref = decode_fwd(q, cache, scale=sc, num_splits=ns, block_n=bn, kernel="triton")
            for pf in (False, True):
                o, l = decode_fwd(q, cache, scale=sc, num_splits=ns, block_n=bn, kernel="gluon", prefetch=pf)
                rel = ((o.float() - o_ref.float()).norm() / o_ref.float().norm()).item()
                dl = (l - l_ref).abs().max().item()
                worst = max(worst, rel)
                if rel > 0 or dl > 1e-6:
                    P(f"B{B} Hq{Hq} Hkv{Hkv} lens{lens} D{D} NQ{NQ} ns{ns} bn{bn} pf{pf}: rel {rel:.2e} lse {dl:.2e}")
P("correctness: worst rel L2 gluon vs triton", worst)
for (B, Hq, Hkv, N, D) in SHAPES:
    q, k, v, cache, cud = decode_case(B, Hq, Hkv, N, D)
    res = {}
    for rep in range(2):
        res.setdefault("cudnn", []).append(graph_time_ms(cud, 40))
        res.setdefault("triton", []).append(graph_time_ms(lambda: decode_fwd(q, cache, scale=D ** -0.5, kernel="triton"), 40))
        for bn, pf, sms in ((32, False, (12, 16)), (64, False, (8, 10, 12)), (32, True, (8, 9, 12)), (64, True, (6, 8))):
            for per_sm in sms:
                res.setdefault(f"gl bn{bn} pf{int(pf)} ps{per_sm}", []).append(graph_time_ms(
                    lambda: decode_fwd(q, cache, scale=D ** -0.5, kernel="gluon", block_n=bn, per_sm=per_sm,
                                       prefetch=pf), 40))
    print_times(P, (B, Hq, Hkv, N, D), res)
    del k, v, cache
    torch.cuda.empty_cache()
