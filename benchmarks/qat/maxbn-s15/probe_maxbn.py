"""Attn-QAT forward with the exact-max pass on wider key tiles (FP4ATTN_QAT_MAX_BN, read per call):
forward and forward+backward times (triton.testing.do_bench, variants interleaved in one process) and
bitwise equality of O, LSE and the gradients with the default tiles."""
import os
import sys

import torch
from triton.testing import do_bench

import fp4attn

torch.manual_seed(0)
VARIANTS = ([""] + sys.argv[1].split(",")) if len(sys.argv) > 1 else ["", "128"]  # "" = the default tiles
if VARIANTS == ["", "env"]:  # one variant, FP4ATTN_QAT_MAX_BN as the caller set it (autotuning: one per process)
    VARIANTS = ["env"]
SHAPES = [(16, 16, 4096, 128, False), (16, 16, 4096, 128, True), (16, 16, 4096, 64, False)]
if len(sys.argv) > 2:  # e.g. "4,16,4096,256,0;1,8,1000,128,1"
    SHAPES = [tuple(int(x) for x in s.split(",")) for s in sys.argv[2].split(";")]
for (B, H, N, D, causal) in SHAPES:
    causal = bool(causal)
    for fmt in ("nvfp4", "mxfp4"):
        q, k, v, do = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        qr, kr, vr = (t.clone().requires_grad_() for t in (q, k, v))
        fl = 4 * B * H * N * N * D / (2 if causal else 1)
        res, times = {}, {v_: [] for v_ in VARIANTS}
        for rnd in range(2):
            for var in VARIANTS:
                if var != "env":
                    os.environ["FP4ATTN_QAT_MAX_BN"] = var
                with torch.no_grad():
                    tf = do_bench(lambda: fp4attn.attn_qat(q, k, v, causal=causal, fmt=fmt), warmup=25, rep=100)

                def fb():
                    for t in (qr, kr, vr):
                        t.grad = None
                    fp4attn.attn_qat(qr, kr, vr, causal=causal, fmt=fmt).backward(do)
                tb = do_bench(fb, warmup=25, rep=100)
                times[var].append((tf, tb))
                if rnd == 0:
                    o, lse = fp4attn.attn_qat(qr, kr, vr, causal=causal, fmt=fmt, return_lse=True)
                    for t in (qr, kr, vr):
                        t.grad = None
                    o.backward(do)
                    res[var] = [o.detach().clone(), lse.clone(), qr.grad.clone(), kr.grad.clone(), vr.grad.clone()]
        same = {w: all(torch.equal(a, b) for a, b in zip(res[VARIANTS[0]], res[w])) for w in VARIANTS}
        for var in VARIANTS:
            tf = min(t[0] for t in times[var])
            tb = min(t[1] for t in times[var])
            print(f"({B},{H},{N},{D}) causal={causal} {fmt} MAX_BN={var or 'default'}({os.environ.get('FP4ATTN_QAT_MAX_BN', '')}): fwd {tf:.3f} ms "
                  f"{fl / tf / 1e9:.0f} TF/s, f+b {tb:.3f} ms {3.5 * fl / tb / 1e9:.0f} TF/s"
                  + ("" if var == VARIANTS[0] else f", bit-identical: {same[var]}"), flush=True)
        del q, k, v, do, qr, kr, vr
