"""A/B of the Quartet quantizers and the layer (one process per source tree, PYTHONPATH picks the tree).

    PYTHONPATH=<tree>/src python quant_ab.py <label>

Prints one line per measurement: label, case, ms (triton do_bench, L2 flushed, median)."""
import sys

import torch
from triton.testing import do_bench

from fp4attn.kernels import quartet as kq
from fp4attn.reference.quartet import QuartetRNG

label = sys.argv[1]
torch.manual_seed(0)


def t(fn):
    return do_bench(fn, warmup=25, rep=200, return_mode="median")


for (R, K) in ((16384, 4096), (16384, 14336)):
    x = torch.randn(R, K, device="cuda", dtype=torch.bfloat16)
    print(label, f"quest_e5m2 mask ({R},{K})", round(t(lambda: kq.quest_e5m2(x)), 4), flush=True)
    print(label, f"quest_e5m2 nomask ({R},{K})", round(t(lambda: kq.quest_e5m2(x, with_mask=False)), 4), flush=True)
for (R, K) in ((4096, 4096), (4096, 14336), (8192, 8192)):
    w = torch.randn(R, K, device="cuda", dtype=torch.bfloat16) * 0.02
    print(label, f"quest_fp8 tensor ({R},{K})", round(t(lambda: kq.quest_fp8(w, tensor_offset=True)), 4), flush=True)
for (M, K, N) in ((8192, 8192, 8192), (16384, 4096, 4096), (16384, 4096, 14336), (16384, 14336, 4096)):
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = (torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * 0.02).requires_grad_()
    dy = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
    rng = QuartetRNG(0)
    bf = t(lambda: torch.nn.functional.linear(x, w))
    bfb = t(lambda: torch.nn.functional.linear(x, w).backward(dy))
    q = t(lambda: kq.QuartetLinearCUDA.apply(x, w, None, rng, 32))
    qb = t(lambda: kq.QuartetLinearCUDA.apply(x, w, None, rng, 32).backward(dy))
    print(label, f"layer ({M},{K},{N}) bf16 fwd {bf:.4f} quartet fwd {q:.4f} x{bf / q:.3f} | bf16 f+b {bfb:.4f} "
          f"quartet f+b {qb:.4f} x{bfb / qb:.3f}", flush=True)
