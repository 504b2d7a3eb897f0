"""Forty-ninth session probe: where the host time of one eager ``fp4attn.attention`` call goes. Functions on the
call path are wrapped with inclusive timers; the op runs CALLS times while the GPU sleeps (the host never waits for
it); per-call µs of each wrapped function and the call counts are printed. Wrappers add ~1 µs per wrapped call.

    PYTHONPATH=src python benchmarks/order-s49/host_parts.py
"""
import functools
import os
import time

import torch

import fp4attn
from fp4attn.kernels import _launch
from fp4attn.kernels import attention as A
from fp4attn.kernels import attention_gluon as G
from fp4attn.ops import attention as OA

CALLS = int(os.environ.get("CALLS", "100"))
acc = {}


def timed(name, fn):
    @functools.wraps(fn)
    def w(*a, **k):
        t0 = time.perf_counter_ns()
        try:
            return fn(*a, **k)
        finally:
            s = acc.setdefault(name, [0, 0])
            s[0] += time.perf_counter_ns() - t0
            s[1] += 1
    return w


A.quantize_qkv = timed("quantize_qkv", A.quantize_qkv)
A.attention_packed = timed("attention_packed", A.attention_packed)
A.attention_fwd = timed("attention_fwd", A.attention_fwd)
A.op_key_perm = timed("op_key_perm", A.op_key_perm)
A.default_path = timed("default_path", A.default_path)
G.launch = timed("gluon launch (attention pass)", G.launch)
G.launch_rowmax = timed("gluon launch_rowmax", G.launch_rowmax)
G.TensorDescriptor = timed("TensorDescriptor()", G.TensorDescriptor)
G._attn_fwd_kernel_gl.run = timed("JITFunction.run attention", G._attn_fwd_kernel_gl.run)
G._rowmax_kernel_gl.run = timed("JITFunction.run rowmax", G._rowmax_kernel_gl.run)
_launch.FastKernel.launch = timed("FastKernel.launch (pre-pass x3)", _launch.FastKernel.launch)
_launch.spec_key = timed("spec_key", _launch.spec_key)
OA._attention_fp4_impl = timed("_attention_fp4_impl", OA._attention_fp4_impl)
torch.empty = timed("torch.empty", torch.empty)
_launch._hooked = timed("_launch._hooked", _launch._hooked)
torch.Tensor.view = timed("Tensor.view", torch.Tensor.view)

shape = tuple(int(x) for x in os.environ.get("SHAPE", "1,16,1024,128").split(","))
g = torch.Generator(device="cuda").manual_seed(0)
q, k, v = (torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
for recipe in os.environ.get("RECIPES", "nvfp4,sage3").split(","):
    def f(recipe=recipe):
        return fp4attn.attention(q, k, v, causal=True, recipe=recipe)
    f()
    torch.cuda.synchronize()
    acc.clear()
    torch.cuda._sleep(int(4e9))
    t0 = time.perf_counter_ns()
    for _ in range(CALLS):
        f()
    total = (time.perf_counter_ns() - t0) / CALLS / 1000
    torch.cuda.synchronize()
    print(f"{recipe} {shape}: {total:.1f} us per call (wrapped)")
    for name, (ns, n) in sorted(acc.items(), key=lambda kv: -kv[1][0]):
        print(f"  {name:36s} {ns / CALLS / 1000:8.1f} us/call  ({n / CALLS:.1f} calls)")
