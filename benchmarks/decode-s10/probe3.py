"""Gluon decode kernel: register cap (maxnreg) x programs per SM at 32-key tiles, CUDA-graph medians (H200)."""
import os
import sys
import torch
from fp4attn.kernels import decode as Dk
from fp4attn.bench.common import graph_time_ms

sys.path.insert(0, os.path.dirname(__file__))
from _util import SHAPES, decode_case, logger, print_times  # noqa: E402

P = logger("probe3.txt")

dev = "cuda"
torch.manual_seed(0)
for (B, Hq, Hkv, N, D) in SHAPES:
    q, k, v, cache, cud = decode_case(B, Hq, Hkv, N, D)
    res = {}
    for rep in range(2):
        res.setdefault("cudnn", []).append(graph_time_ms(cud, 40))
        for mr in (None, 112, 104, 96, 88):
            Dk._GLUON_CONFIG["maxnreg"] = mr
            for ps in (16, 18, 20, 24, 28):
                f = lambda: Dk.decode_fwd(q, cache, scale=D ** -0.5, kernel="gluon", per_sm=ps)
                res.setdefault(f"maxnreg {mr} ps{ps}", []).append(graph_time_ms(f, 40))
    Dk._GLUON_CONFIG["maxnreg"] = None
    print_times(P, (B, Hq, Hkv, N, D), res)
    del k, v, cache
    torch.cuda.empty_cache()
