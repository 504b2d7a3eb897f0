"""A/B of the Quartet layer (run once per source tree, alternating): forward without grad (inference),
training forward, forward+backward, against bf16 F.linear in the same process (min of 3 do_bench medians,
interleaved).

    PYTHONPATH=<tree>/src FP4ATTN_AUTOTUNE=0 python ab_fwd.py TAG"""
import sys

import torch
import torch.nn.functional as F
from triton.testing import do_bench

from fp4attn.kernels import quartet as kq
from fp4attn.reference.quartet import QuartetRNG

tag = sys.argv[1]
bf = torch.bfloat16
lin = getattr(kq, "quartet_linear_cuda", None)
for (M, K, N) in ((8192, 8192, 8192), (16384, 4096, 4096), (16384, 4096, 14336), (16384, 14336, 4096)):
    torch.manual_seed(0)
    x = torch.randn(M, K, device="cuda", dtype=bf, requires_grad=True)
    w = (torch.randn(N, K, device="cuda", dtype=bf) * K ** -0.5).requires_grad_()
    dy = torch.randn(M, N, device="cuda", dtype=bf)
    rng = QuartetRNG(0)

    def q_inf():
        with torch.no_grad():
            if lin is not None:
                return lin(x, w, None, rng, 32)
            return kq.QuartetLinearCUDA.apply(x, w, None, rng, 32)

    def q_train():
        return kq.QuartetLinearCUDA.apply(x, w, None, rng, 32)

    def q_fb():
        kq.QuartetLinearCUDA.apply(x, w, None, rng, 32).backward(dy)

    def b_fb():
        F.linear(x, w).backward(dy)

    cases = {"bf16 fwd": lambda: F.linear(x, w), "q fwd": q_inf, "q fwd train": q_train,
             "bf16 f+b": b_fb, "q f+b": q_fb}
    best = {k: float("inf") for k in cases}
    for _ in range(3):
        for k, fn in cases.items():
            gtn = [x, w] if "f+b" in k else None
            best[k] = min(best[k], do_bench(fn, warmup=25, rep=150, grad_to_none=gtn, return_mode="median"))
    print(f"{tag} ({M},{K},{N}) " + " ".join(f"{k} {v:.4f}" for k, v in best.items())
          + f" | fwd x{best['bf16 fwd'] / best['q fwd']:.3f} train x{best['bf16 fwd'] / best['q fwd train']:.3f}"
          f" f+b x{best['bf16 f+b'] / best['q f+b']:.3f}", flush=True)
    del x, w, dy
    torch.cuda.empty_cache()
