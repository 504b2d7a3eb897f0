"""Forty-fourth session: the fixed cost of the timing method. `bench decode` times one decode call replayed from a
CUDA graph after do_bench's L2 flush; a model's decode step runs its layers' kernels back to back. Here: a graph of
one trivial kernel (the method's own floor), then the op and cuDNN timed as one call per replay and as REPS calls per
replay (time / REPS: back to back, the launch and the wave ramp amortized), at the issue's shapes.

    OUT=out PYTHONPATH=src python benchmarks/overhead-s44/steady.py
"""
import os
import sys

import torch

import fp4attn
from fp4attn.bench.common import graph_time_ms
from fp4attn.bench.decode import decode_inputs, sdpa_fn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "decode-prologue-s42"))
from _log import logger  # noqa: E402

REP = float(os.environ.get("REP_MS", 100))
REPS = int(os.environ.get("REPS", 10))
CASES = os.environ.get("CASES", "8,32,8,32768,128;1,32,8,131072,128;8,32,8,32768,64;1,32,8,131072,64")


def back_to_back_us(fn):
    return graph_time_ms(fn, REP, reps=REPS) * 1e3


def main():
    P = logger("steady.txt")
    P(torch.cuda.get_device_name(), torch.__version__, f"REPS={REPS}")
    x = torch.zeros(1024, device="cuda")
    P(f"graph of one tiny kernel: {graph_time_ms(lambda: x.add_(1.0), REP) * 1e3:.2f} us; "
      f"{REPS} per replay: {back_to_back_us(lambda: x.add_(1.0)):.2f} us each")
    from torch.nn.attention import SDPBackend
    P("shape | cuDNN 1/replay | FP4 1/replay | ratio | cuDNN b2b | FP4 b2b | ratio b2b")
    for spec in CASES.split(";"):
        B, Hq, Hkv, N, D = map(int, spec.split(","))
        q, k, v = decode_inputs(B, Hq, Hkv, N, D)
        cache = fp4attn.KVCache.from_dense(k, v)
        fc = sdpa_fn(SDPBackend.CUDNN_ATTENTION, q, k, v)
        ff = (lambda q=q, cache=cache: fp4attn.decode(q, cache))
        c1, f1 = graph_time_ms(fc, REP) * 1e3, graph_time_ms(ff, REP) * 1e3
        cb, fb = back_to_back_us(fc), back_to_back_us(ff)
        P(f"({B},{Hq},{Hkv},{N},{D}) | {c1:.1f} | {f1:.1f} | {c1 / f1:.3f} | {cb:.1f} | {fb:.1f} | {cb / fb:.3f}")
        del q, k, v, cache


if __name__ == "__main__":
    main()
