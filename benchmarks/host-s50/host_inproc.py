"""Fiftieth session: the Gluon passes' launches through ``_launch.fast`` (``TmaDesc`` descriptors) against Triton's
own launch path with checked ``TensorDescriptor``s (as before), in one process, interleaved: host µs per eager call
with the GPU kept busy (the host never waits), each call timed alone; GC off while timing (its pauses land on random
calls). Prints p10 / p50 per variant and op over ROUNDS x CALLS calls.

    PYTHONPATH=src python benchmarks/host-s50/host_inproc.py
"""
import gc
import os
import time

import torch

import fp4attn
from fp4attn.kernels import _launch
from fp4attn.kernels import attention_gluon as G

ROUNDS = int(os.environ.get("ROUNDS", "20"))
CALLS = int(os.environ.get("CALLS", "40"))
B, H, N, D = (int(x) for x in os.environ.get("SHAPE", "1,16,1024,128").split(","))
g = torch.Generator(device="cuda").manual_seed(0)
q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
ops = {
    "nvfp4": lambda: fp4attn.attention(q, k, v, causal=True),
    "sage3": lambda: fp4attn.attention(q, k, v, causal=True, recipe="sage3"),
    "thrift5": lambda: fp4attn.thrift_attention(q, k, v, causal=True, budget=0.05),
}


class _Triton:  # the launch as before: Triton's run path with checked TensorDescriptors
    def __init__(self, fn):
        self.fn = fn

    def __getitem__(self, grid):
        return lambda *a, **kw: self.fn[grid](*_launch._checked(a), **kw)


variants = {"fast": _launch.fast, "triton": _Triton}


def timed(f):
    ts = []
    torch.cuda.synchronize()
    torch.cuda._sleep(int(3e8))
    for _ in range(CALLS):
        t0 = time.perf_counter_ns()
        f()
        ts.append(time.perf_counter_ns() - t0)
    torch.cuda.synchronize()
    return ts


res = {(o, vn): [] for o in ops for vn in variants}
for name, f in ops.items():
    outs = {}
    for vn, wrap in variants.items():
        G.fast = wrap
        outs[vn] = f().clone()
        f()
    assert torch.equal(outs["fast"], outs["triton"]), name
gc.collect()
gc.disable()
for r in range(ROUNDS):
    for name, f in ops.items():
        for vn, wrap in (variants.items() if r % 2 == 0 else reversed(variants.items())):
            G.fast = wrap
            res[(name, vn)] += timed(f)
gc.enable()
G.fast = _launch.fast
print(f"host us per call, {ROUNDS} x {CALLS} calls each, shape {(B, H, N, D)} causal; outputs bit-equal")
for name in ops:
    line = []
    for vn in variants:
        ts = sorted(res[(name, vn)])
        line.append(f"{vn}: p10 {ts[len(ts) // 10] / 1e3:7.1f} p50 {ts[len(ts) // 2] / 1e3:7.1f}")
    print(f"{name:8s} " + " | ".join(line))
