"""Gluon row-max pass (async wgmma, TMA ring; needs gluon_max.patch against c09abef, not kept) vs the Triton
row-max pass, both followed by the Gluon attention pass: bits compared, then interleaved timings of the two
passes (do_bench min of 3 rounds) at the bench shapes.

    PYTHONPATH=src python benchmarks/gluon-attn-s17/probe_max.py
"""
import math

import torch
import triton

from fp4attn.kernels import attention as A

MAXCFGS = {"m128x128s2w8": dict(BLOCK_M=128, BLOCK_N=128, NS=2, num_warps=8),
           "m128x128s3w8": dict(BLOCK_M=128, BLOCK_N=128, NS=3, num_warps=8),
           "m64x128s2w4": dict(BLOCK_M=64, BLOCK_N=128, NS=2, num_warps=4)}


def run(pk, q, Hkv, causal, mcfg):
    B, Hq, Nq, D = q.shape
    out = torch.empty_like(q)
    lse = A.attention_packed(pk, causal=causal, scale=1 / math.sqrt(D), two_level_p=False, B=B, Hq=Hq, Hkv=Hkv,
                             out=out, kernel="gluon", gluon_max_config=mcfg)
    return out, lse


def timed(pk, q, H, causal):
    fns = {"triton-max": lambda: run(pk, q, H, causal, None)}
    for n, c in MAXCFGS.items():
        fns[n] = (lambda c=c: run(pk, q, H, causal, c))
    return fns


torch.manual_seed(0)
for (B, Hq, Hkv, Nq, Nk, D, causal) in [(2, 4, 2, 1000, 1100, 128, True), (1, 2, 2, 517, 333, 128, True),
                                        (2, 4, 4, 1024, 1024, 64, False), (16, 16, 16, 4096, 4096, 128, False),
                                        (16, 16, 16, 4096, 4096, 128, True), (4, 16, 16, 16384, 16384, 128, False),
                                        (16, 16, 16, 4096, 4096, 64, False)]:
    q = torch.randn(B, Hq, Nq, D, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(B, Hkv, Nk, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    pk = A.quantize_qkv(q, k, v, fmt="nvfp4")
    want = run(pk, q, Hkv, causal, None)
    same = {n: torch.equal(run(pk, q, Hkv, causal, c)[0], want[0]) and torch.equal(run(pk, q, Hkv, causal, c)[1],
                                                                                      want[1])
            for n, c in MAXCFGS.items()}
    line = f"{(B, Hq, Hkv, Nq, Nk, D, causal)} bit-identical: {same}"
    if Nq >= 4096:
        fns = timed(pk, q, Hkv, causal)
        t = {n: float("inf") for n in fns}
        for _ in range(3):
            for n, f in fns.items():
                t[n] = min(t[n], triton.testing.do_bench(f, warmup=25, rep=150))
        line += " | ms: " + ", ".join(f"{n} {v:.3f}" for n, v in t.items())
    print(line, flush=True)
    del q, k, v, pk
