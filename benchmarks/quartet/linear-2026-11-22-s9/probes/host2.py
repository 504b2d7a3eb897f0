"""Host time of the Quartet backward's pieces at a tiny shape, and a cProfile of forward+backward
(autograd multithreading off, so the backward runs on the profiled thread).

    PYTHONPATH=src FP4ATTN_AUTOTUNE=0 python host2.py"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/quartet: probe_util
import time

import torch

from fp4attn.kernels import quartet as kq
from probe_util import host_us, profile, tiny_layer  # noqa: E402

bf = torch.bfloat16
M = K = N = 256
x, w, dy, rng = tiny_layer(M, K, N)
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
        print(f"host us per call (autograd threads {mt}): {name}: {host_us(fn, 30, 5, 100):.1f}", flush=True)
    y_keep.clear()
    for _ in range(100):
        bwd_only()
    torch.cuda.synchronize()
    print(f"y.backward(dy) alone (autograd threads {mt}): median {sorted(y_keep)[50] * 1e6:.1f} us", flush=True)

torch.autograd.set_multithreading_enabled(False)
profile(fb, 100, 25)
