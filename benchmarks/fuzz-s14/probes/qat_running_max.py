"""Attn-QAT forward, NVFP4: the running-max kernel (default) vs the two-pass exact max
(FP4ATTN_QAT_EXACT_MAX=1) against the float64 reference (SPEC §6: cosine >= 0.998, rel. L2 <= 0.05), at
realistic training shapes and logit scales, and the forward time of both."""
import os

import torch
import triton

import fp4attn
from fp4attn import reference
from fp4attn.reference.attn_qat import attn_qat_forward


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def cos(a, b):
    return torch.nn.functional.cosine_similarity(a.double().flatten(), b.double().flatten(), dim=0).item()


torch.manual_seed(0)
for (B, H, N, D, causal, temp) in [(1, 8, 1024, 128, True, 1.0), (1, 8, 1024, 128, False, 1.0),
                                   (1, 8, 1024, 128, True, 0.3), (1, 8, 1024, 128, False, 0.3),
                                   (1, 8, 2048, 64, True, 0.1), (1, 4, 4096, 128, False, 0.5),
                                   (1, 8, 1024, 128, True, 3.0)]:
    q = (torch.randn(B, H, N, D, device="cuda") * temp).bfloat16()
    k = torch.randn(B, H, N, D, device="cuda").bfloat16()
    v = torch.randn(B, H, N, D, device="cuda").bfloat16()
    ro, _, _ = attn_qat_forward(q.double(), k.double(), v.double(), causal=causal)
    ex = reference.attention(q.double(), k.double(), v.double(), causal=causal, recipe="bf16")
    res = []
    for em in ("0", "1"):
        os.environ["FP4ATTN_QAT_EXACT_MAX"] = em
        o = fp4attn.attn_qat(q, k, v, causal=causal)
        t = triton.testing.do_bench(lambda: fp4attn.attn_qat(q, k, v, causal=causal), warmup=25, rep=100)
        res.append(f"exact_max={em}: cos {cos(o, ro):.5f} rel {rel(o, ro):.4f} own {rel(o, ex):.4f} "
                   f"ref {rel(ro, ex):.4f} fwd {t:.3f} ms")
    print((B, H, N, D, causal, temp), " | ".join(res), flush=True)
os.environ.pop("FP4ATTN_QAT_EXACT_MAX")
# bigger: time only
for (B, H, N, D, causal) in [(4, 16, 4096, 128, True), (4, 16, 4096, 128, False), (8, 16, 2048, 64, True)]:
    q, k, v = (torch.randn(B, H, N, D, device="cuda").bfloat16() for _ in range(3))
    ts = []
    for em in ("0", "1"):
        os.environ["FP4ATTN_QAT_EXACT_MAX"] = em
        fp4attn.attn_qat(q, k, v, causal=causal)
        ts.append(triton.testing.do_bench(lambda: fp4attn.attn_qat(q, k, v, causal=causal), warmup=25, rep=200))
        qg, kg, vg = (x.clone().requires_grad_(True) for x in (q, k, v))
        do = torch.randn_like(q)
        def fb():
            o = fp4attn.attn_qat(qg, kg, vg, causal=causal)
            o.backward(do)
        fb()
        ts.append(triton.testing.do_bench(fb, warmup=25, rep=200))
    print((B, H, N, D, causal), "fwd ms running %.3f exact %.3f (x%.3f); fwd+bwd running %.3f exact %.3f (x%.3f)"
          % (ts[0], ts[2], ts[2] / ts[0], ts[1], ts[3], ts[3] / ts[1]), flush=True)
