"""Host time of one Quartet forward+backward step on a tiny layer (256^3: GPU work negligible): us per
step through autograd and with the backward called directly (best of 5 x 200 steps), and a cProfile of
200 direct steps (top entries by own time).

    PYTHONPATH=src FP4ATTN_AUTOTUNE=0 python host_profile.py"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/quartet: probe_util
from probe_util import host_us, profile, tiny_layer  # noqa: E402

from fp4attn.kernels import quartet as kq  # noqa: E402

x, w, dy, rng = tiny_layer()


def step():
    torch.autograd.grad(kq.QuartetLinearCUDA.apply(x, w, None, rng, 32), (x, w), dy)


def fwd():
    with torch.no_grad():
        kq.quartet_linear_cuda(x, w, None, rng, 32)


def step_direct():  # the backward body on this thread (autograd runs it on its device thread: cProfile
    # sees only the calling thread)
    y = kq.QuartetLinearCUDA.apply(x, w, None, rng, 32)
    kq.QuartetLinearCUDA.backward(y.grad_fn, dy)


print(f"f+b step: {host_us(step):.1f} us host; direct backward: {host_us(step_direct):.1f} us; "
      f"inference forward: {host_us(fwd):.1f} us", flush=True)
profile(step_direct, 200, 45)
