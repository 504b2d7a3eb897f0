"""Where a Triton launch's host time goes (cProfile over 2000 launches of a small kernel).
PYTHONPATH=src python launch_prof.py"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/quartet: probe_util

import torch

from fp4attn.kernels import quartet as kq
from probe_util import host_us, profile  # noqa: E402

e = torch.full((17,), -127, dtype=torch.int32, device="cuda")
x = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)


def launch():
    kq._tensor_max_kernel[(1,)](e, 16, BLOCK=1024, num_warps=4)


def quest():
    kq.quest_e5m2(x)


for fn in (launch, quest):
    print(fn.__name__, f"{host_us(fn, 50, 1, 2000):.1f} us per call", flush=True)
    profile(fn, 2000, 14)
