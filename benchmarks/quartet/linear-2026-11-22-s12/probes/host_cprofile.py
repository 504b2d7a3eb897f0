"""cProfile of the Quartet layer's host work at a tiny shape: 200 training forwards and 200 calls of the
backward body (called directly: autograd runs a CUDA backward on its own thread, which cProfile does not
see), top functions by own time.

    PYTHONPATH=src python host_cprofile.py"""
import cProfile
import pstats

import torch

from fp4attn.kernels import quartet as kq
from fp4attn.reference.quartet import QuartetRNG

torch.manual_seed(0)
bf = torch.bfloat16
x = torch.randn(256, 256, device="cuda", dtype=bf, requires_grad=True)
w = (torch.randn(256, 256, device="cuda", dtype=bf) / 16).requires_grad_()
dy = torch.randn(256, 256, device="cuda", dtype=bf)
rng = QuartetRNG(0)
y = kq.QuartetLinearCUDA.apply(x, w, None, rng, 32)
for name, fn in (("training forward", lambda: kq.QuartetLinearCUDA.apply(x, w, None, rng, 32)),
                 ("backward body", lambda: kq.QuartetLinearCUDA.backward(y.grad_fn, dy))):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(200):
        fn()
    pr.disable()
    torch.cuda.synchronize()
    print(f"== {name}")
    pstats.Stats(pr).sort_stats("tottime").print_stats(28)
