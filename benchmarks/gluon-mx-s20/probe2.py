"""Round 2: the fast-accumulation Gluon MXFP4 pass (BLOCK_N 128) — configs, and how far its S moves from the
exact one on wide-span inputs (the exactness-test rows), measured through the outputs.

PYTHONPATH=src python benchmarks/gluon-mx-s20/probe2.py   (env PROBE=span,time; ROUNDS)
"""
import os
import sys

import torch
from triton.testing import do_bench

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "session6-2026-11-22", "probes"))
from _common import rel, run  # noqa: E402
from _util import sdpa_ms  # noqa: E402

from fp4attn.kernels import attention as A  # noqa: E402
from fp4attn.kernels import attention_gluon as G  # noqa: E402

PROBE = os.environ.get("PROBE", "span,time").split(",")
ROUNDS = int(os.environ.get("ROUNDS", "3"))


def mx_rows(n, D, span, g):
    """MXFP4-representable rows, odd blocks ``span`` binades below the even ones (as tests' _mx_rows, any codes)."""
    tab = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])
    x = tab[torch.randint(0, len(tab), (n, D), generator=g)]
    x[:, ::32] = 6.0
    erow = torch.randint(-3, 4, (n, 1), generator=g).float()
    sh = torch.zeros(D)
    for b in range(1, D // 32, 2):
        sh[b * 32:(b + 1) * 32] = span
    return x * torch.exp2(erow - sh)


if "span" in PROBE:
    g = torch.Generator().manual_seed(0)
    for span in (0, 2, 4, 7, 10, 14):
        for D in (128, 64):
            n = 1024
            q = mx_rows(n, D, span, g)[None, None].cuda().to(torch.float32) * 0.0625
            k = mx_rows(n, D, span, g)[None, None].cuda().to(torch.float32) * 0.0625
            v = torch.randn(1, 1, n, D, device="cuda")
            pk = A.quantize_qkv(q, k, v, fmt="mxfp4", staged=True)
            o_t, _ = run(pk, q, False, 1, 1, 1, "triton")
            o_e, _ = run(pk, q, False, 1, 1, 1, "gluon", dict(G.DEFAULT, S_ACC=32))
            o_f, _ = run(pk, q, False, 1, 1, 1, "gluon", dict(G.DEFAULT, S_ACC=D, BLOCK_N=128))
            o_f64, _ = run(pk, q, False, 1, 1, 1, "gluon", dict(G.DEFAULT, S_ACC=32, SYNC_S=True, maxnreg=168))
            print(f"span {span:2d} D {D}: exact-gluon vs triton {rel(o_e, o_t):.2e} | fast(n128) vs exact-gluon "
                  f"{rel(o_f, o_e):.2e} rows differing {(o_f != o_e).any(-1).float().mean().item():.3f} | "
                  f"sync-exact vs triton {rel(o_f64, o_t):.2e}", flush=True)

if "time" in PROBE:
    shapes = [(16, 16, 4096, 128, False), (16, 16, 4096, 128, True), (4, 16, 16384, 128, False),
              (16, 16, 4096, 64, False), (16, 16, 4096, 64, True)]
    for (B, H, N, D, causal) in shapes:
        ex = dict(G.DEFAULT, S_ACC=32, SYNC_S=True)
        variants = {"fast_n128_nv2": dict(G.DEFAULT, BLOCK_N=128, NV=2), "sync": ex,
                    "sync_r168": dict(ex, maxnreg=168), "sync_r168_ns3": dict(ex, maxnreg=168, NS=3),
                    "sync_r168_nv2": dict(ex, maxnreg=168, NV=2), "sync_n128": dict(ex, BLOCK_N=128)}
        q = torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn_like(q)
        v = torch.randn_like(q)
        cud, fla = sdpa_ms(q, k, v, causal)
        pk = A.quantize_qkv(q, k, v, fmt="mxfp4", staged=True)
        pre = do_bench(lambda: A.quantize_qkv(q, k, v, fmt="mxfp4", staged=True), warmup=10, rep=60)  # noqa: B023
        fl = 4 * B * H * N * N * D / (2 if causal else 1)
        res = {}
        for _ in range(ROUNDS):
            for name, cfg in [("triton", None)] + list(variants.items()):
                kern = "triton" if cfg is None else "gluon"
                try:
                    t = do_bench(lambda: run(pk, q, causal, B, H, H, kern, cfg), warmup=10, rep=60)  # noqa: B023
                except Exception as e:  # noqa: BLE001
                    t = float("nan")
                    print(f"time {name}: FAILED {type(e).__name__}: {str(e)[:300]}")
                res[name] = min(res.get(name, 1e9), t)
        print(f"time {(B, H, N, D, causal)}: cuDNN {cud:.3f} flash {fla:.3f} ms, mxfp4 pre-pass {pre:.3f} ms")
        for name, t in res.items():
            print(f"   {name:16s} passes {t:.3f} ms vs triton {t / res['triton']:.3f} | op ~{pre + t:.3f} ms = "
                  f"{fl / (pre + t) / 1e9:.0f} TF/s, {cud / (pre + t):.3f}x cuDNN", flush=True)
