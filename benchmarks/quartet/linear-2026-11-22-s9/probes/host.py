"""Host (CPU) time per Quartet layer call at a tiny shape (the GPU work negligible, so the host is what
is timed), and a cProfile of the inference forward.

    PYTHONPATH=src FP4ATTN_AUTOTUNE=0 python host.py"""
import cProfile
import pstats
import time

import torch
import torch.nn.functional as F

from fp4attn.kernels import quartet as kq

try:
    from fp4attn.kernels import _launch
except ImportError:
    _launch = None
from fp4attn.reference.quartet import QuartetRNG

bf = torch.bfloat16
M = K = N = 256
x = torch.randn(M, K, device="cuda", dtype=bf, requires_grad=True)
w = (torch.randn(N, K, device="cuda", dtype=bf) * 0.05).requires_grad_()
dy = torch.randn(M, N, device="cuda", dtype=bf)
rng = QuartetRNG(0)
one = torch.ones((), device="cuda")
a8 = x.detach().to(torch.float8_e4m3fn)
b8 = w.detach().to(torch.float8_e4m3fn)
sig = torch.empty(4096, device="cuda")


def inf():
    with torch.no_grad():
        return kq.quartet_linear_cuda(x, w, None, rng, 32)


def train():
    return kq.QuartetLinearCUDA.apply(x, w, None, rng, 32)


def fb():
    kq.QuartetLinearCUDA.apply(x, w, None, rng, 32).backward(dy)
    x.grad = None
    w.grad = None


def bf16():
    with torch.no_grad():
        return F.linear(x, w)


cases = {
    "empty": lambda: torch.empty(M, K, dtype=torch.uint8, device="cuda"),
    "full": lambda: torch.full((N + 2048,), -127, dtype=torch.int32, device="cuda"),
    "triton launch (_signs_kernel)": lambda: kq._signs_kernel[(1,)](sig, 1, 4096, BLOCK=4096),
    "fast launch (_signs_kernel)": lambda: _launch.launch(kq._signs_kernel, (1,), sig, 1, 4096, BLOCK=4096),
    "_scaled_mm": lambda: torch._scaled_mm(a8, b8.t(), scale_a=one, scale_b=one, out_dtype=bf),
    "F.linear": bf16,
    "quest_e5m2 no mask": lambda: kq.quest_e5m2(x.detach(), with_mask=False),
    "quest_fp8 tensor offset no mask": lambda: kq.quest_fp8(w.detach(), tensor_offset=True, with_mask=False),
    "quartet fwd (no grad)": inf,
    "quartet fwd (train)": train,
    "quartet f+b": fb,
}
for name, fn in cases.items():
    if _launch is None and "fast" in name:
        continue
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(200):
            fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        best = min(best, (t1 - t0) / 200 * 1e6)
    print(f"host us per call: {name}: {best:.1f}", flush=True)

pr = cProfile.Profile()
pr.enable()
for _ in range(300):
    inf()
pr.disable()
torch.cuda.synchronize()
pstats.Stats(pr).sort_stats("tottime").print_stats(22)
