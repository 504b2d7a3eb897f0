"""Thrift decode with its 16-bit stream on a side CUDA stream ("side", concurrent with the Gluon FP4 kernel)
vs one after the other ("serial"), at `bench decode`'s shapes. CUDA-graph medians, three interleaved rounds:
cuDNN BF16, the plain nvfp4 kernel, the Thrift kernel (selection precomputed, 5% budget) in both modes, each of
its two streams alone, the Thrift op (selection included) in both modes; then programs per SM of the FP4
kernel and pages per 16-bit program with "side". Checks that both modes give the same bits. (Runs 2-3 in
../out swept 16-bit kernel variants not kept: ../README.md.)

    PYTHONPATH=src python benchmarks/decode-s13/probes/thrift_streams.py"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "decode-s10"))  # _util: the s10 probes' helpers
from _util import SHAPES, decode_case, logger, print_times  # noqa: E402

import fp4attn  # noqa: E402
from fp4attn.bench.common import graph_time_ms  # noqa: E402
from fp4attn.kernels import decode as dk  # noqa: E402
from fp4attn.kernels import decode_gluon  # noqa: E402
from fp4attn.ops.decode import thrift_select  # noqa: E402

P = logger("thrift_streams.txt")
REP = 30
real_16, real_fp4 = dk._launch_16bit, decode_gluon.launch


def mode(streams, only=None):
    """Set the stream mode; only="fp4" / "16bit" skips the other stream's launch (timing only: wrong results)."""
    dk._THRIFT_STREAMS = streams
    dk._launch_16bit = (lambda *a, **k: None) if only == "fp4" else real_16
    decode_gluon.launch = (lambda *a, **k: None) if only == "16bit" else real_fp4


def probe(shape):
    B, Hq, Hkv, N, D = shape
    torch.manual_seed(0)
    q, k, v, cache, cudnn = decode_case(B, Hq, Hkv, N, D, keep_16bit=True)
    sel = thrift_select(q, cache, 0.05)
    sc = D ** -0.5
    kern = lambda: dk.decode_fwd(q, cache, scale=sc, selection=sel)[0]  # noqa: E731
    cases = {
        "cudnn": (None, None, cudnn),
        "nvfp4 kernel": (None, None, lambda: dk.decode_fwd(q, cache, scale=sc)[0]),
        "thrift serial": ("serial", None, kern),
        "thrift side": ("side", None, kern),
        "  FP4 stream only": ("serial", "fp4", kern),
        "  16-bit only": ("serial", "16bit", kern),
        "op serial": ("serial", None, lambda: fp4attn.decode(q, cache, thrift_budget=0.05)),
        "op side": ("side", None, lambda: fp4attn.decode(q, cache, thrift_budget=0.05)),
    }
    res = {n: [] for n in cases}
    for _ in range(3):
        for n, (m, only, f) in cases.items():
            mode(m or "side", only)
            res[n].append(graph_time_ms(f, REP))
    mode("side")
    print_times(P, shape, res)
    mode("serial")
    a = kern()
    mode("side")
    b = kern()
    torch.cuda.synchronize()
    P(f"  side == serial bitwise: {torch.equal(a, b)}; eager side == serial: {torch.equal(kern(), a)}")
    for per_sm in (8, 10, 12, 14):
        t = graph_time_ms(lambda ps=per_sm: dk.decode_fwd(q, cache, scale=sc, selection=sel, per_sm=ps)[0], REP)
        P(f"  side, FP4 programs per SM {per_sm}: {t:.4f} ms")
    for pages in (16, 32, 64):
        dk._PAGES_16BIT = pages
        t = graph_time_ms(kern, REP)
        P(f"  side, pages per 16-bit program {pages}: {t:.4f} ms")
    dk._PAGES_16BIT = 32


for shape in SHAPES:
    probe(shape)
    torch.cuda.empty_cache()
