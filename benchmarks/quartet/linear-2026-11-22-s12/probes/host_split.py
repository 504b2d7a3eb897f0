"""Where the host time of an eager Quartet training step goes, at a tiny shape (the GPU idles): the
forward with autograd recording, torch.autograd.grad over a kept graph, the backward body called
directly, the inference forward; bf16 F.linear alongside. Then cProfile of the training forward.

    PYTHONPATH=src python host_split.py"""
import cProfile
import pstats
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from fp4attn.kernels import quartet as kq

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/quartet: probe_util
import probe_util  # noqa: E402
from probe_util import tiny_layer  # noqa: E402


def host_us(fn):
    return probe_util.host_us(fn, warmup=20, reps=5, n=300)


torch.manual_seed(0)
x, w, dy, rng = tiny_layer(w_scale=256 ** -0.5)
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
