"""Gluon (async wgmma) vs Triton attention pass for nvfp4: agreement, then interleaved timings.

    PYTHONPATH=src python benchmarks/gluon-attn-s17/probe.py [--quick]
"""
import math
import sys

import torch
import torch.nn.functional as F
import triton

from fp4attn.kernels import attention as A

torch.manual_seed(0)
dev = "cuda"


def packed(B, Hq, Hkv, Nq, Nk, D, dtype=torch.bfloat16):
    q = torch.randn(B, Hq, Nq, D, device=dev, dtype=dtype)
    k = torch.randn(B, Hkv, Nk, D, device=dev, dtype=dtype)
    v = torch.randn(B, Hkv, Nk, D, device=dev, dtype=dtype)
    return q, k, v, A.quantize_qkv(q, k, v, fmt="nvfp4")


def run(pk, q, Hkv, causal, kernel, gcfg=None):
    B, Hq, Nq, D = q.shape
    out = torch.empty_like(q)
    lse = A.attention_packed(pk, causal=causal, scale=1 / math.sqrt(D), two_level_p=False, B=B, Hq=Hq, Hkv=Hkv,
                             out=out, kernel=kernel, gluon_config=gcfg)
    return out, lse[:, :, :Nq]


def rel(a, b):
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm()).item()


CFGS = {"gu1": dict(BLOCK_M=64, BLOCK_N=64, NS=2, NV=1, UNROLL=1, num_warps=4),
        "gu2": dict(BLOCK_M=64, BLOCK_N=64, NS=2, NV=1, UNROLL=2, num_warps=4),
        "gu1r128": dict(BLOCK_M=64, BLOCK_N=64, NS=2, NV=1, UNROLL=1, num_warps=4, maxnreg=128),
        "gu1k3": dict(BLOCK_M=64, BLOCK_N=64, NS=3, NV=1, UNROLL=1, num_warps=4)}

print("== agreement (same quantized operands): gluon vs triton", flush=True)
for (B, Hq, Hkv, Nq, Nk, D, causal) in [(2, 4, 2, 1000, 1000, 128, True), (2, 4, 2, 1000, 1000, 64, False),
                                        (1, 2, 1, 333, 517, 64, True), (1, 2, 2, 517, 333, 128, True),
                                        (2, 8, 8, 4096, 4096, 128, False), (2, 8, 8, 4096, 4096, 128, True)
                                        ][:0 if "--time" in sys.argv else None]:
    q, k, v, pk = packed(B, Hq, Hkv, Nq, Nk, D)
    o_t, l_t = run(pk, q, Hkv, causal, "triton")
    for name, cfg in CFGS.items():
        try:
            o_g, l_g = run(pk, q, Hkv, causal, "gluon", cfg)
            torch.cuda.synchronize()
            fin = torch.isfinite(l_t)
            print(f"{(B, Hq, Hkv, Nq, Nk, D, causal)} {name}: rel L2 {rel(o_g, o_t):.2e} max|d| "
                  f"{(o_g.float() - o_t.float()).abs().max().item():.2e} lse max|d| "
                  f"{(l_g[fin] - l_t[fin]).abs().max().item():.2e} same -inf {torch.equal(~fin, ~torch.isfinite(l_g))}"
                  f" exact {torch.equal(o_g, o_t)}", flush=True)
        except Exception as e:  # noqa: BLE001
            print(f"{(B, Hq, Hkv, Nq, Nk, D, causal)} {name}: FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)

if "--quick" in sys.argv:
    sys.exit(0)
def timed(pk, q, k, v, H, causal):
    fns = {"cudnn": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
           "triton": lambda: run(pk, q, H, causal, "triton")}
    for name, cfg in CFGS.items():
        fns[name] = (lambda c=cfg: run(pk, q, H, causal, "gluon", c))
    fns["op-auto"] = lambda: __import__("fp4attn").attention(q, k, v, causal=causal, recipe="nvfp4")
    return fns


print("== timings (ms, do_bench median; same run; 3 interleaved rounds)", flush=True)
for (B, H, N, D, causal) in [(16, 16, 4096, 128, False), (16, 16, 4096, 128, True), (4, 16, 16384, 128, False),
                             (16, 16, 4096, 64, False)]:
    q, k, v, pk = packed(B, H, H, N, N, D, torch.float16)
    fl = 4 * B * H * N * N * D / (2 if causal else 1)
    fns = timed(pk, q, k, v, H, causal)
    res = {n: [] for n in fns}
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
        for n, f in fns.items():
            try:
                f()
            except Exception as e:  # noqa: BLE001
                print(n, "FAILED", e)
                res.pop(n)
        for _ in range(3):
            for n in list(res):
                res[n].append(triton.testing.do_bench(fns[n], warmup=50, rep=200))
    line = ", ".join(f"{n} {min(t):.3f} ({fl / min(t) / 1e9:.0f} TF/s)" for n, t in res.items())
    print(f"{(B, H, N, D, causal)}: {line}", flush=True)
