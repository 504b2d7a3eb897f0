"""Where a Triton launch's host time goes (cProfile over 2000 launches of a small kernel).
PYTHONPATH=src python launch_prof.py"""
import cProfile
import pstats
import time

import torch

from fp4attn.kernels import quartet as kq

e = torch.full((17,), -127, dtype=torch.int32, device="cuda")
x = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)


def launch():
    kq._tensor_max_kernel[(1,)](e, 16, BLOCK=1024, num_warps=4)


def quest():
    kq.quest_e5m2(x)


for fn in (launch, quest):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(2000):
        fn()
    print(fn.__name__, f"{(time.perf_counter() - t0) / 2000 * 1e6:.1f} us per call", flush=True)
    torch.cuda.synchronize()
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(2000):
        fn()
    pr.disable()
    torch.cuda.synchronize()
    pstats.Stats(pr).sort_stats("tottime").print_stats(14)
