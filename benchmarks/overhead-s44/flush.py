"""Forty-fourth session: what the L2 flush before each timed call does to a decode step's time. triton's do_bench
(behind `bench decode`'s eager and graph columns) zeroes a 256 MB buffer before every call, which leaves the 50 MB
L2 full of dirty lines that the timed kernel then writes back while it streams its cache. Here one graph replay of
one call is timed with CUDA events after: "write" (zero a 256 MB buffer, as do_bench), "read" (sum a 256 MB buffer:
the L2 holds clean lines), "none" (the previous replay's lines). Median of N timed replays per mode, modes
alternating.

    OUT=out PYTHONPATH=src python benchmarks/overhead-s44/flush.py
"""
import os
import statistics
import sys

import torch
from torch.nn.attention import SDPBackend

import fp4attn
from fp4attn.bench.common import capture_graph
from fp4attn.bench.decode import decode_inputs, sdpa_fn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "decode-prologue-s42"))
from _log import logger  # noqa: E402

N_REP = int(os.environ.get("N_REP", 200))
CASES = os.environ.get("CASES", "8,32,8,32768,128;1,32,8,131072,128")


def main():
    P = logger("flush.txt")
    P(torch.cuda.get_device_name(), torch.__version__, f"N_REP={N_REP}")
    buf = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    acc = torch.zeros((), dtype=torch.int64, device="cuda")
    flush = {"write": lambda: buf.zero_(), "read": lambda: acc.add_(buf.view(torch.int64).sum()),
             "none": lambda: None}
    P("shape | provider | write us | read us | none us")
    for spec in CASES.split(";"):
        B, Hq, Hkv, N, D = map(int, spec.split(","))
        q, k, v = decode_inputs(B, Hq, Hkv, N, D)
        cache = fp4attn.KVCache.from_dense(k, v)
        provs = {"cuDNN": sdpa_fn(SDPBackend.CUDNN_ATTENTION, q, k, v),
                 "FP4 decode": (lambda q=q, cache=cache: fp4attn.decode(q, cache))}
        for name, f in provs.items():
            g = capture_graph(f)
            t = {m: [] for m in flush}
            for _ in range(N_REP):
                for m, fl in flush.items():
                    fl()
                    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    e0.record()
                    g.replay()
                    e1.record()
                    torch.cuda.synchronize()
                    t[m].append(e0.elapsed_time(e1) * 1e3)
            P(f"({B},{Hq},{Hkv},{N},{D}) | {name} | " + " | ".join(f"{statistics.median(t[m]):.1f}" for m in flush))
        del q, k, v, cache


if __name__ == "__main__":
    main()
