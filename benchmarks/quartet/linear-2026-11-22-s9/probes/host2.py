"""Host time of the Quartet backward's pieces at a tiny shape, and a cProfile of forward+backward
(autograd multithreading off, so the backward runs on the profiled thread).

    PYTHONPATH=src FP4ATTN_AUTOTUNE=0 python host2.py"""
import cProfile
import pstats
import time

import torch

from fp4attn.kernels import quartet as kq
from fp4attn.reference.quartet import QuartetRNG

bf = torch.bfloat16
M = K = N = 256
x = torch.randn(M, K, device="cuda", dtype=bf, requires_grad=True)
w = (torch.randn(N, K, device="cuda", dtype=bf) * 0.05).requires_grad_()
dy = torch.randn(M, N, device="cuda", dtype=bf)
rng = QuartetRNG(0)
x8, mx, rsx = kq.quest_e5m2(x.detach())
w8, mw, rsw, sw = kq.quest_fp8(w.detach(), tensor_offset=True)
signs = kq.random_signs(1, N, "cuda")
g = kq.sr_fp8(dy, sign_seed=0, noise_seed=2, signs=signs)
wt = kq.sr_fp8(w8.t(), sign_seed=0, noise_seed=3, scale=rsw, signs=signs)
d = kq.fp8_gemm_raw(g[0], wt[0], bf)


def fb():
    kq.QuartetLinearCUDA.apply(x, w, None, rng, 32).backward(dy)
    x.grad = None
    w.grad = None


def fwd_only():
    return kq.QuartetLinearCUDA.apply(x, w, None, rng, 32)


y_keep = []


def bwd_only():
    y = kq.QuartetLinearCUDA.apply(x, w, None, rng, 32)
    t0 = time.perf_counter()
    y.backward(dy)
    y_keep.append(time.perf_counter() - t0)
    x.grad = None
    w.grad = None


cases = {
    "random_signs": lambda: kq.random_signs(1, N, "cuda"),
    "sr_fp8 bf16": lambda: kq.sr_fp8(dy, sign_seed=0, noise_seed=2, signs=signs),
    "sr_fp8 saved fp8^T": lambda: kq.sr_fp8(w8.t(), sign_seed=0, noise_seed=3, scale=rsw, signs=signs),
    "fp8_gemm_raw": lambda: kq.fp8_gemm_raw(g[0], wt[0], bf),
    "mask_ihadamard": lambda: kq.mask_ihadamard(d, mx, bf, row_scale=g[1], col_scale=wt[1]),
    "dy.float().sum(0)": lambda: dy.float().sum(0),
    "fwd train": fwd_only,
    "f+b": fb,
}
for mt in (True, False):
    torch.autograd.set_multithreading_enabled(mt)
    for name, fn in cases.items():
        if not mt and name != "f+b":
            continue
        for _ in range(30):
            fn()
        torch.cuda.synchronize()
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(100):
                fn()
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            best = min(best, (t1 - t0) / 100 * 1e6)
        print(f"host us per call (autograd threads {mt}): {name}: {best:.1f}", flush=True)
    y_keep.clear()
    for _ in range(100):
        bwd_only()
    torch.cuda.synchronize()
    print(f"y.backward(dy) alone (autograd threads {mt}): median {sorted(y_keep)[50] * 1e6:.1f} us", flush=True)

torch.autograd.set_multithreading_enabled(False)
pr = cProfile.Profile()
pr.enable()
for _ in range(100):
    fb()
pr.disable()
torch.cuda.synchronize()
pstats.Stats(pr).sort_stats("tottime").print_stats(25)
