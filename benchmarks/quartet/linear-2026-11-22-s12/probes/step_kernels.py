"""At (M, K, N) (default 16384x4096x4096): the host's enqueue time of a few eager forward+backward steps
started on an idle GPU (too few launches to fill the launch queue, so the host never waits on it), the
steps' wall time, and the GPU time per kernel over 5 steps (torch.profiler), bf16 F.linear alongside.

    PYTHONPATH=src python step_kernels.py [MxKxN]"""
import sys
import time

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from fp4attn.kernels import quartet as kq
from fp4attn.reference.quartet import QuartetRNG

M, K, N = (int(v) for v in (sys.argv[1] if len(sys.argv) > 1 else "16384x4096x4096").split("x"))
bf = torch.bfloat16
torch.manual_seed(0)
x = torch.randn(M, K, device="cuda", dtype=bf, requires_grad=True)
w = (torch.randn(N, K, device="cuda", dtype=bf) * K ** -0.5).requires_grad_()
dy = torch.randn(M, N, device="cuda", dtype=bf)
rng = QuartetRNG(0)
steps = {"bf16": lambda: torch.autograd.grad(F.linear(x, w), (x, w), dy),
         "quartet": lambda: torch.autograd.grad(kq.QuartetLinearCUDA.apply(x, w, None, rng, 32), (x, w), dy)}
for name, step in steps.items():
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    hosts = []
    for _ in range(20):
        torch.cuda._sleep(2_000_000)  # keep the GPU busy so that the launches only queue
        t0 = time.perf_counter()
        for _ in range(3):
            step()
        hosts.append((time.perf_counter() - t0) / 3 * 1e3)
        torch.cuda.synchronize()
    hosts.sort()
    print(f"({M},{K},{N}) {name}: host enqueue per step (3 steps, GPU busy) median {hosts[10]:.3f} ms, "
          f"min {hosts[0]:.3f}, max {hosts[-1]:.3f}", flush=True)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            step()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if t > 0 and e.count > 0:
            rows.append((t / 5, e.count / 5, e.key))
    rows.sort(reverse=True)
    tot = sum(r[0] for r in rows)
    print(f"  GPU time per step {tot / 1e3:.3f} ms:")
    for t, c, k in rows:
        print(f"  {t / 1e3:8.4f} ms  x{c:.0f}  {k[:110]}")
