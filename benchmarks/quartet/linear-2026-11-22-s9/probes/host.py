"""Host (CPU) time per Quartet layer call at a tiny shape (the GPU work negligible, so the host is what
is timed), and a cProfile of the inference forward.

    PYTHONPATH=src FP4ATTN_AUTOTUNE=0 python host.py"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/quartet: probe_util

import torch
import torch.nn.functional as F

from fp4attn.kernels import quartet as kq

try:
    from fp4attn.kernels import _launch
except ImportError:
    _launch = None
from probe_util import host_us, profile, tiny_layer  # noqa: E402

bf = torch.bfloat16
M = K = N = 256
x, w, dy, rng = tiny_layer(M, K, N)
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
    print(f"host us per call: {name}: {host_us(fn, 50, 5, 200):.1f}", flush=True)

profile(inf, 300, 22)
