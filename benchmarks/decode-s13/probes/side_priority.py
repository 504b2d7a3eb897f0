"""Thrift decode with the side stream at normal vs high priority (torch.cuda.Stream(priority=-1)), and the FP4
kernel's programs per SM 10-13 with each, at `bench decode`'s shapes. CUDA-graph medians, three interleaved
rounds. Checks that the outputs are the same bits.

    PYTHONPATH=src python benchmarks/decode-s13/probes/side_priority.py"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "decode-s10"))  # _util: the s10 probes' helpers
from _util import SHAPES, decode_case, logger, print_times  # noqa: E402

from fp4attn.bench.common import graph_time_ms  # noqa: E402
from fp4attn.kernels import decode as dk  # noqa: E402
from fp4attn.ops.decode import thrift_select  # noqa: E402

P = logger("side_priority.txt")
dev = torch.device("cuda", torch.cuda.current_device())
streams = {"normal": torch.cuda.Stream(device=dev), "high": torch.cuda.Stream(device=dev, priority=-1)}


def probe(shape):
    B, Hq, Hkv, N, D = shape
    torch.manual_seed(0)
    q, k, v, cache, cudnn = decode_case(B, Hq, Hkv, N, D, keep_16bit=True)
    sel = thrift_select(q, cache, 0.05)
    res = {"cudnn": []}
    outs = {}
    for _ in range(3):
        res["cudnn"].append(graph_time_ms(cudnn, 30))
        for name, s in streams.items():
            dk._SIDE[dev] = s
            for per_sm in (10, 12, 13):
                f = lambda ps=per_sm: dk.decode_fwd(q, cache, scale=D ** -0.5, selection=sel, per_sm=ps)[0]  # noqa: E731
                res.setdefault(f"{name} per_sm {per_sm}", []).append(graph_time_ms(f, 30))
                outs[(name, per_sm)] = f()
    print_times(P, shape, res, width=20)
    for ps in (10, 12, 13):
        P(f"  per_sm {ps}: high == normal bitwise: {torch.equal(outs[('high', ps)], outs[('normal', ps)])}")


for shape in SHAPES:
    probe(shape)
    torch.cuda.empty_cache()
