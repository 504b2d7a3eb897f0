"""Host-side breakdown of the Quartet layer's calls at a tiny shape (the GPU idles): host time of the
training forward (autograd recording), the same forward with grad disabled and masks on (no autograd
node), the inference forward, the backward body; then torch.profiler's CPU-side table (self CPU time
per op, CUDA runtime calls included) over 50 training forwards and 50 f+b steps.

    PYTHONPATH=src python host_ops.py"""
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from fp4attn.kernels import quartet as kq

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/quartet: probe_util
from probe_util import tiny_layer  # noqa: E402


def host_us(fn, n=50, reps=7):
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        torch.cuda._sleep(1_000_000)
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        ts.append((time.perf_counter() - t0) / n * 1e6)
        torch.cuda.synchronize()
    ts.sort()
    return ts[len(ts) // 2]


torch.manual_seed(0)
x, w, dy, rng = tiny_layer(w_scale=256 ** -0.5)
train = lambda: kq.QuartetLinearCUDA.apply(x, w, None, rng, 32)  # noqa: E731
y = train()
res = {"training forward": host_us(train)}
with torch.no_grad():
    res["_forward with masks, no grad"] = host_us(lambda: kq._forward(x, w, None, None, True, True))
    res["_forward without masks, no grad"] = host_us(lambda: kq._forward(x, w, None, None, False, False))
res["backward body direct"] = host_us(lambda: kq.QuartetLinearCUDA.backward(y.grad_fn, dy))
res["autograd.grad (kept graph)"] = host_us(lambda: torch.autograd.grad(y, (x, w), dy, retain_graph=True))
res["f+b step"] = host_us(lambda: torch.autograd.grad(train(), (x, w), dy))
for k, v in res.items():
    print(f"{k:34s} {v:8.1f} us (median of 7 loops of 50, GPU kept busy)", flush=True)

for name, fn in (("training forward", train), ("f+b step", lambda: torch.autograd.grad(train(), (x, w), dy))):
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(50):
            fn()
        torch.cuda.synchronize()
    print(f"\n== {name}: torch.profiler CPU table over 50 calls")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60))
