"""Shared by the Quartet host-time probes (linear-2026-11-22-s8, -s9, -s11, -s12 probes):
host microseconds per call, a cProfile summary and the tiny layer they time."""
import cProfile
import pstats
import time

import torch


def host_us(fn, warmup=50, reps=5, n=200):
    """Best of ``reps`` host-time means over ``n`` calls of ``fn`` (the GPU synchronized after each timing)."""
    for _ in range(warmup):
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


def profile(fn, n, top, stream=None, sort="tottime"):
    """cProfile of ``n`` calls of ``fn``, the ``top`` entries by ``sort`` (own time) printed (to ``stream``)."""
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(n):
        fn()
    pr.disable()
    torch.cuda.synchronize()
    pstats.Stats(pr, stream=stream).sort_stats(sort).print_stats(top)


def tiny_layer(M=256, K=256, N=256, w_scale=0.05):
    """x (M, K) and w (N, K) bf16 (w times ``w_scale``) requiring grad, dy (M, N), a QuartetRNG: a layer whose
    GPU work is negligible."""
    from fp4attn.reference.quartet import QuartetRNG

    bf = torch.bfloat16
    x = torch.randn(M, K, device="cuda", dtype=bf, requires_grad=True)
    w = (torch.randn(N, K, device="cuda", dtype=bf) * w_scale).requires_grad_()
    dy = torch.randn(M, N, device="cuda", dtype=bf)
    return x, w, dy, QuartetRNG(0)
