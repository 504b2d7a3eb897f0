"""Thrift 5% decode on Hopper (Gluon FP4 stream + 16-bit stream): pages per 16-bit program x FP4 programs
per SM, CUDA-graph medians (H200), selection given (kernel time)."""
import os
import sys
import torch
from fp4attn.kernels import decode as Dk
from fp4attn.bench.common import graph_time_ms

sys.path.insert(0, os.path.dirname(__file__))
from _util import SHAPES, decode_case, logger, print_times  # noqa: E402

P = logger("probe7.txt")

dev = "cuda"
for (B, Hq, Hkv, N, D) in SHAPES:
    q, k, v, c, _ = decode_case(B, Hq, Hkv, N, D, keep_16bit=True,
                                generator=torch.Generator(device=dev).manual_seed(0))
    sel = Dk.select_pages(q, c, 0.05)
    res = {}
    for rep in range(2):
        res.setdefault("triton fused", []).append(graph_time_ms(
            lambda: Dk.decode_fwd(q, c, scale=D ** -0.5, selection=sel, kernel="triton"), 40))
        for pages in (8, 16, 32, 64):
            Dk._PAGES_16BIT = pages
            for ps in (8, 12, 16):
                res.setdefault(f"pages {pages} ps{ps}", []).append(graph_time_ms(
                    lambda: Dk.decode_fwd(q, c, scale=D ** -0.5, selection=sel, kernel="gluon", per_sm=ps), 40))
    Dk._PAGES_16BIT = 32
    print_times(P, (B, Hq, Hkv, N, D), res)
    del k, v, c
    torch.cuda.empty_cache()
