"""Gluon decode split kernel prototype: correctness vs the Triton kernel, then timing vs cuDNN (H200)."""
import os, sys
sys.path.insert(0, os.path.dirname(__file__))
import torch
from fp4attn.kernels.decode import decode_fwd
from fp4attn.bench.common import graph_time_ms
import dgl
from _util import SHAPES, decode_case, logger, print_times, ragged_case

P = logger("probe1.txt")

torch.manual_seed(0)
dev = "cuda"
# ---- correctness
for (B, Hq, Hkv, lens, D, NQ, bn) in [(3, 8, 2, [300, 1000, 77], 128, 1, 32), (3, 8, 2, [300, 1000, 77], 64, 2, 32),
                                      (2, 32, 8, [4100, 2000], 128, 1, 32), (2, 16, 4, [700, 1500], 128, 4, 32),
                                      (2, 4, 4, [513, 64], 128, 1, 32), (2, 32, 8, [4100, 2000], 128, 1, 64)]:
    q, cache = ragged_case(B, Hq, Hkv, lens, D, NQ)
    sc = D ** -0.5
    for ns in (1, 3):
        o_ref, l_ref = decode_fwd(q, cache, scale=sc, num_splits=ns, block_n=bn)
        try:
            o, l = dgl.decode_fwd_gl(q, cache, scale=sc, num_splits=ns, block_n=bn)
            torch.cuda.synchronize()
            rel = ((o.float() - o_ref.float()).norm() / o_ref.float().norm()).item()
            P(f"B{B} Hq{Hq} Hkv{Hkv} lens{lens} D{D} NQ{NQ} bn{bn} ns{ns}: rel {rel:.2e} maxabs "
              f"{(o.float()-o_ref.float()).abs().max().item():.2e} lse {(l-l_ref).abs().max().item():.2e}")
        except Exception as e:
            P("FAIL", B, Hq, NQ, D, repr(e)[:2000])
# ---- timing
for (B, Hq, Hkv, N, D) in SHAPES:
    q, k, v, cache, cud = decode_case(B, Hq, Hkv, N, D)
    res = {}
    for rep in range(2):
        res.setdefault("cudnn", []).append(graph_time_ms(cud, 40))
        res.setdefault("triton", []).append(graph_time_ms(lambda: decode_fwd(q, cache, scale=D ** -0.5), 40))
        for bn in (32, 64):
            for per_sm in (8, 12, 16, 20, 24, 32):
                res.setdefault(f"gl bn{bn} ps{per_sm}", []).append(
                    graph_time_ms(lambda: dgl.decode_fwd_gl(q, cache, scale=D ** -0.5, block_n=bn, per_sm=per_sm), 40))
    print_times(P, (B, Hq, Hkv, N, D), res)
    del k, v, cache
    torch.cuda.empty_cache()
