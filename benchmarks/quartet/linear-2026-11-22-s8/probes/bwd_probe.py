"""The backward's GEMM + epilogue, row-wise scaled GEMM (fp8_gemm) vs unscaled tensor-wise GEMM with the
row scales applied in mask_ihadamard (fp8_gemm_raw), interleaved in one process (min of 3 medians), on
the operands the backward quantizes. PYTHONPATH=src python bwd_probe.py"""
import torch
from triton.testing import do_bench

from fp4attn.kernels import quartet as kq

torch.manual_seed(0)
bf = torch.bfloat16
for (M, K, N) in ((8192, 8192, 8192), (16384, 4096, 4096), (16384, 4096, 14336), (16384, 14336, 4096)):
    dy = torch.randn(M, N, device="cuda", dtype=bf)
    w = torch.randn(N, K, device="cuda", dtype=bf) * 0.02
    x = torch.randn(M, K, device="cuda", dtype=bf)
    w8, mw, rsw = kq.quest_fp8(w)
    x8, mx, rsx = kq.quest_fp8(x)
    g = kq.sr_fp8(dy, sign_seed=1, noise_seed=2)
    wt = kq.sr_fp8(w8.t(), sign_seed=1, noise_seed=3, scale=rsw)
    gt = kq.sr_fp8(dy.t(), sign_seed=4, noise_seed=5)
    xt = kq.sr_fp8(x8.t(), sign_seed=4, noise_seed=6, scale=rsx)

    def old(a, b, m):
        return kq.mask_ihadamard(kq.fp8_gemm(a[0], a[1], b[0], b[1], bf), m, bf)

    def new(a, b, m):
        return kq.mask_ihadamard(kq.fp8_gemm_raw(a[0], b[0], bf), m, bf, row_scale=a[1], col_scale=b[1])

    for name, a, b, m in (("dX", g, wt, mx), ("dW", gt, xt, mw)):
        o, n = old(a, b, m), new(a, b, m)
        rel = ((o.float() - n.float()).norm() / o.float().norm()).item()
        cases = {"row-wise GEMM + epilogue": lambda: old(a, b, m), "raw GEMM + scaled epilogue": lambda: new(a, b, m),
                 "row-wise GEMM only": lambda: kq.fp8_gemm(a[0], a[1], b[0], b[1], bf),
                 "raw GEMM only": lambda: kq.fp8_gemm_raw(a[0], b[0], bf)}
        best = {k: float("inf") for k in cases}
        for _ in range(3):
            for k, fn in cases.items():
                best[k] = min(best[k], do_bench(fn, warmup=25, rep=150, return_mode="median"))
        print(f"({M},{K},{N}) {name}: " + "; ".join(f"{k} {v:.4f}" for k, v in best.items())
              + f"; rel diff {rel:.2e}", flush=True)
