"""Gluon decode kernel: L2 prefetch distance (tiles ahead) x programs per SM, CUDA-graph medians (H200),
and equality with the Triton kernel at equal splits."""
import os
import sys
import torch
from fp4attn.kernels import decode as Dk
from fp4attn.bench.common import graph_time_ms

sys.path.insert(0, os.path.dirname(__file__))
from _util import SHAPES, decode_case, logger, print_times  # noqa: E402

P = logger("probe4.txt")

dev = "cuda"
torch.manual_seed(0)
for (B, Hq, Hkv, N, D) in SHAPES:
    q, k, v, cache, cud = decode_case(B, Hq, Hkv, N, D)
    ref = Dk.decode_fwd(q, cache, scale=D ** -0.5, kernel="triton", num_splits=16)[0]
    res = {}
    for rep in range(2):
        res.setdefault("cudnn", []).append(graph_time_ms(cud, 40))
        for ahead in (0, 1, 2, 4):
            Dk._GLUON_CONFIG["l2_ahead"] = ahead
            if rep == 0:
                o = Dk.decode_fwd(q, cache, scale=D ** -0.5, kernel="gluon", num_splits=16)[0]
                P(f"ahead {ahead}: rel vs triton (16 splits) {((o.float() - ref.float()).norm() / ref.float().norm()).item():.2e}")
            for ps in (12, 16):
                f = lambda: Dk.decode_fwd(q, cache, scale=D ** -0.5, kernel="gluon", per_sm=ps)
                res.setdefault(f"ahead {ahead} ps{ps}", []).append(graph_time_ms(f, 40))
    Dk._GLUON_CONFIG["l2_ahead"] = 0
    print_times(P, (B, Hq, Hkv, N, D), res)
    del k, v, cache
    torch.cuda.empty_cache()
