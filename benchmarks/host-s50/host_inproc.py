"""Fiftieth session: the Gluon passes' launches through ``_launch.fast`` (``TmaDesc`` descriptors) against Triton's
own launch path with checked ``TensorDescriptor``s (as before), in one process, interleaved: host µs per eager call
with the GPU kept busy (the host never waits), each call timed alone (``host_ab.per_call``: GC off while timing, its
pauses land on random calls). Prints p10 / p50 per variant and op over ROUNDS x CALLS calls.

    PYTHONPATH=src python benchmarks/host-s50/host_inproc.py
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from host_ab import inputs, per_call  # noqa: E402

import fp4attn  # noqa: E402
from fp4attn.kernels import _launch  # noqa: E402
from fp4attn.kernels import attention_gluon as G  # noqa: E402

ROUNDS = int(os.environ.get("ROUNDS", "20"))
CALLS = int(os.environ.get("CALLS", "40"))
q, k, v = inputs()
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


res = {(o, vn): [] for o in ops for vn in variants}
for name, f in ops.items():
    outs = {}
    for vn, wrap in variants.items():
        G.fast = wrap
        outs[vn] = f().clone()
        f()
    assert torch.equal(outs["fast"], outs["triton"]), name
for r in range(ROUNDS):
    for name, f in ops.items():
        for vn, wrap in (variants.items() if r % 2 == 0 else reversed(variants.items())):
            G.fast = wrap
            res[(name, vn)] += per_call(f, CALLS)
G.fast = _launch.fast
print(f"host us per call, {ROUNDS} x {CALLS} calls each, shape {tuple(q.shape)} causal; outputs bit-equal")
for name in ops:
    line = []
    for vn in variants:
        ts = sorted(res[(name, vn)])
        line.append(f"{vn}: p10 {ts[len(ts) // 10]:7.1f} p50 {ts[len(ts) // 2]:7.1f}")
    print(f"{name:8s} " + " | ".join(line))
