"""Gluon MXFP4 attention pass (FP8 wgmma) vs the Triton pass: agreement and speed (H200).

PYTHONPATH=src python benchmarks/gluon-mx-s20/probe.py   (env PROBE=check,time; ROUNDS)
"""
import os
import sys

import torch
from triton.testing import do_bench

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "session6-2026-11-22", "probes"))
from _common import rel, run  # noqa: E402
from _util import kernel_times_us, sdpa_ms  # noqa: E402

from fp4attn.kernels import attention as A  # noqa: E402
from fp4attn.kernels import attention_gluon as G  # noqa: E402

torch.manual_seed(0)
PROBE = os.environ.get("PROBE", "check,time").split(",")
ROUNDS = int(os.environ.get("ROUNDS", "3"))
VARIANTS = {
    "gl_exact": dict(G.DEFAULT, S_ACC=32),
    "gl_fastacc": dict(G.DEFAULT, S_ACC=128),
    "gl_fastacc_n128": dict(G.DEFAULT, S_ACC=128, BLOCK_N=128),
    "gl_exact_n32": dict(G.DEFAULT, S_ACC=32, BLOCK_N=32),
    "gl_exact_n32_r168": dict(G.DEFAULT, S_ACC=32, BLOCK_N=32, maxnreg=168),
}


if "check" in PROBE:
    cases = [(1, 4, 2, 700, 900, 128, True), (2, 4, 4, 1000, 1000, 128, False), (1, 2, 1, 333, 129, 64, False),
             (1, 2, 2, 256, 100, 128, True), (2, 8, 2, 2048, 2048, 128, True), (1, 4, 4, 512, 512, 64, True)]
    for (B, hq, hkv, nq, nk, D, causal) in cases:
        q = torch.randn(B, hq, nq, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(B, hkv, nk, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(B, hkv, nk, D, device="cuda", dtype=torch.bfloat16)
        pk = A.quantize_qkv(q, k, v, fmt="mxfp4", staged=True)
        o_t, l_t = run(pk, q, causal, B, hq, hkv, "triton")
        for name, cfg in VARIANTS.items():
            try:
                o_g, l_g = run(pk, q, causal, B, hq, hkv, "gluon", cfg)
            except Exception as e:  # noqa: BLE001
                print(f"check {(B, hq, hkv, nq, nk, D, causal)} {name}: FAILED {type(e).__name__}: {str(e)[:200]}")
                continue
            fin = torch.isfinite(l_t[:, :, :nq])
            same_fin = torch.equal(fin, torch.isfinite(l_g[:, :, :nq]))
            dl = (l_g[:, :, :nq][fin] - l_t[:, :, :nq][fin]).abs().max().item() if fin.any() else 0.0
            print(f"check {(B, hq, hkv, nq, nk, D, causal)} {name}: rel_l2(O) {rel(o_g, o_t):.3e} "
                  f"equal {(o_g == o_t).float().mean().item():.4f} max|dLSE| {dl:.2e} finite-equal {same_fin}",
                  flush=True)

if "time" in PROBE:
    shapes = [(16, 16, 4096, 128, False), (16, 16, 4096, 128, True), (4, 16, 16384, 128, False),
              (16, 16, 4096, 64, False)]
    for (B, H, N, D, causal) in shapes:
        q = torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn_like(q)
        v = torch.randn_like(q)
        cud, fla = sdpa_ms(q, k, v, causal)
        pk = A.quantize_qkv(q, k, v, fmt="mxfp4", staged=True)
        fl = 4 * B * H * N * N * D / (2 if causal else 1)
        res = {}
        for r in range(ROUNDS):
            for name, cfg in [("triton", None)] + list(VARIANTS.items()):
                kern = "triton" if cfg is None else "gluon"
                if D == 64 and cfg is not None and cfg["BLOCK_N"] == 128:
                    continue
                try:
                    t = do_bench(lambda: run(pk, q, causal, B, H, H, kern, cfg), warmup=10, rep=60)  # noqa: B023
                except Exception as e:  # noqa: BLE001
                    t = float("nan")
                    if r == 0:
                        print(f"time {name}: FAILED {type(e).__name__}: {str(e)[:200]}")
                res[name] = min(res.get(name, 1e9), t)
        kt = kernel_times_us(lambda: run(pk, q, causal, B, H, H, "triton"), n=5)  # noqa: B023
        print(f"time {(B, H, N, D, causal)}: cuDNN {cud:.3f} flash {fla:.3f} ms | triton kernels (us): "
              + ", ".join(f"{k[:30]} {v:.0f}" for k, v in list(kt.items())[:3]))
        for name, t in res.items():
            print(f"   {name:18s} passes {t:.3f} ms  ({fl / t / 1e9:.0f} TF/s of the two passes)  "
                  f"vs triton {t / res['triton']:.3f}", flush=True)
