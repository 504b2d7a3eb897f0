"""The forward's weight quantizer (quest_fp8, tensor offset) at 16 vs 32 rows per program and with /
without the register cap, interleaved (min of 3 medians). PYTHONPATH=src python w_probe.py"""
import torch
from triton.testing import do_bench

from fp4attn.kernels import quartet as kq

torch.manual_seed(0)
for (R, K) in ((4096, 4096), (4096, 14336), (8192, 8192)):
    w = torch.randn(R, K, device="cuda", dtype=torch.bfloat16) * 0.02
    ref = kq.quest_fp8(w, tensor_offset=True)
    cases = {}
    for br in (16, 32):
        for cap in (None, 80):
            def fn(br=br, cap=cap):
                kq._QUEST_MAXNREG = cap
                return kq.quest_fp8(w, block_r=br, tensor_offset=True)
            got = fn()
            assert all(torch.equal(a, b) for a, b in zip(got, ref)), (br, cap)
            cases[f"block_r {br} maxnreg {cap}"] = fn
    best = {k: float("inf") for k in cases}
    for _ in range(3):
        for k, fn in cases.items():
            best[k] = min(best[k], do_bench(fn, warmup=25, rep=150, return_mode="median"))
    for k, v in best.items():
        print(f"quest_fp8 tensor ({R},{K}) {k}: {v:.4f} ms", flush=True)
kq._QUEST_MAXNREG = 80
