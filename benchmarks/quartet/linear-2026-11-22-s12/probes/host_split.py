"""Where the host time of an eager Quartet training step goes, at a tiny shape (the GPU idles): the
forward with autograd recording, torch.autograd.grad over a kept graph, the backward body called
directly, the inference forward; bf16 F.linear alongside. Then cProfile of the training forward.

    PYTHONPATH=src python host_split.py"""
import cProfile
import pstats
import time

import torch
import torch.nn.functional as F

from fp4attn.kernels import quartet as kq
from fp4attn.reference.quartet import QuartetRNG


def host_us(fn, n=300, reps=5):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        best = min(best, (t1 - t0) / n * 1e6)
    return best


torch.manual_seed(0)
M = K = N = 256
bf = torch.bfloat16
x = torch.randn(M, K, device="cuda", dtype=bf, requires_grad=True)
w = (torch.randn(N, K, device="cuda", dtype=bf) * K ** -0.5).requires_grad_()
dy = torch.randn(M, N, device="cuda", dtype=bf)
rng = QuartetRNG(0)
for name, f in (("bf16", lambda: F.linear(x, w)), ("quartet", lambda: kq.QuartetLinearCUDA.apply(x, w, None, rng, 32))):
    fwd = host_us(f)
    y = f()
    grad = host_us(lambda: torch.autograd.grad(y, (x, w), dy, retain_graph=True))
    step = host_us(lambda: torch.autograd.grad(f(), (x, w), dy))
    line = f"{name}: training forward {fwd:.1f} us, autograd.grad {grad:.1f}, f+b step {step:.1f}"
    if name == "quartet":
        line += f", backward body direct {host_us(lambda: kq.QuartetLinearCUDA.backward(y.grad_fn, dy)):.1f}"
        with torch.no_grad():
            line += f", inference forward {host_us(lambda: kq.quartet_linear_cuda(x, w, None, rng)):.1f}"
    print(line, flush=True)

pr = cProfile.Profile()
pr.enable()
for _ in range(200):
    kq.QuartetLinearCUDA.apply(x, w, None, rng, 32)
pr.disable()
torch.cuda.synchronize()
pstats.Stats(pr).sort_stats("tottime").print_stats(30)
