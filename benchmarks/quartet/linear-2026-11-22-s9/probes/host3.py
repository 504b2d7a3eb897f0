"""Host time inside the real Quartet forward+backward at a tiny shape: the module's functions wrapped
with timers (mean us per call as the layer calls them), the backward called directly vs through
autograd.

    PYTHONPATH=src FP4ATTN_AUTOTUNE=0 python host3.py"""
import collections
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/quartet: probe_util
import time

import torch

from fp4attn.kernels import quartet as kq
from probe_util import tiny_layer  # noqa: E402

bf = torch.bfloat16
M = K = N = 256
x, w, dy, rng = tiny_layer(M, K, N)
acc = collections.defaultdict(float)
cnt = collections.Counter()
for name in ("sr_fp8", "random_signs", "fp8_gemm_raw", "mask_ihadamard", "quest_e5m2", "quest_fp8",
             "fp8_gemm_e5m2", "_forward", "_sr_mx", "_mx_to_fp8"):
    f = getattr(kq, name)

    def wrap(*a, _f=f, _n=name, **k):
        t0 = time.perf_counter()
        r = _f(*a, **k)
        acc[_n] += time.perf_counter() - t0
        cnt[_n] += 1
        return r
    setattr(kq, name, wrap)
orig_bwd = kq.QuartetLinearCUDA.backward


def timed_bwd(ctx, g):
    t0 = time.perf_counter()
    r = orig_bwd(ctx, g)
    acc["backward (body)"] += time.perf_counter() - t0
    cnt["backward (body)"] += 1
    return r


kq.QuartetLinearCUDA.backward = staticmethod(timed_bwd)


def step(direct):
    t0 = time.perf_counter()
    y = kq.QuartetLinearCUDA.apply(x, w, None, rng, 32)
    t1 = time.perf_counter()
    if direct:
        timed_bwd(y.grad_fn, dy)
    else:
        y.backward(dy)
    t2 = time.perf_counter()
    acc["apply (forward)"] += t1 - t0
    acc["y.backward" if not direct else "direct backward call"] += t2 - t1
    cnt["apply (forward)"] += 1
    cnt["y.backward" if not direct else "direct backward call"] += 1
    x.grad = None
    w.grad = None


for direct in (False, True):
    for _ in range(30):
        step(direct)
    torch.cuda.synchronize()
    acc.clear()
    cnt.clear()
    t0 = time.perf_counter()
    for _ in range(200):
        step(direct)
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    print(f"--- direct backward {direct}: {(t1 - t0) / 200 * 1e6:.1f} us per f+b (host)")
    for k in sorted(acc, key=lambda k: -acc[k]):
        print(f"  {k}: {acc[k] / cnt[k] * 1e6:.1f} us x {cnt[k] / 200:.0f} per step")
