"""Host (CPU) time per call of the Quartet forward's pieces: tiny operands so that the GPU work is
negligible; wall time over 200 calls after warm-up, GPU synchronized at the end only.
PYTHONPATH=src python cpu_probe.py"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/quartet: probe_util

import torch

from fp4attn.kernels import quartet as kq
from fp4attn.reference.quartet import QuartetRNG
from probe_util import host_us  # noqa: E402

bf = torch.bfloat16
x = torch.randn(256, 256, device="cuda", dtype=bf)
w = torch.randn(256, 256, device="cuda", dtype=bf) * 0.02
xr = x.clone().requires_grad_()
wr = w.clone().requires_grad_()
rng = QuartetRNG(0)
xq = kq.quest_e5m2(x)
wq = kq.quest_fp8(w, tensor_offset=True)
h = kq._hmat("cuda:0", 1)


def one_launch():
    R, K, block_r, block_k, hd, grid = kq._quest_tiles(x, None, None)
    kq._tensor_max_kernel[(1,)](wq[2].view(torch.int32), 16, BLOCK=1024, num_warps=4)


cases = {
    "torch.nn.functional.linear": lambda: torch.nn.functional.linear(x, w),
    "torch.empty": lambda: torch.empty(256, 256, device="cuda"),
    "one small Triton launch (_tensor_max_kernel)": one_launch,
    "quest_e5m2 (2 launches)": lambda: kq.quest_e5m2(x),
    "quest_fp8 tensor offset (fill + 3 launches)": lambda: kq.quest_fp8(w, tensor_offset=True),
    "fp8_gemm_e5m2 (_scaled_mm + rescale launch)": lambda: kq.fp8_gemm_e5m2(xq[0], xq[2], wq[0], wq[2], wq[3], bf),
    "QuartetLinearCUDA forward (x needs grad)": lambda: kq.QuartetLinearCUDA.apply(xr, wr, None, rng, 32),
    "QuartetLinearCUDA forward, no grad": lambda: kq.QuartetLinearCUDA.apply(x, w, None, rng, 32),
}
for name, fn in cases.items():
    print(f"{name}: {host_us(fn, 20, 5, 200):.1f} us host time per call", flush=True)
