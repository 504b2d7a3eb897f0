"""SPEC §6's own regime (N(0,1) q, k, v, default scale): Attn-QAT NVFP4 forward, running max
(FP4ATTN_QAT_EXACT_MAX=0) vs exact max, rel. L2 / cosine against the float64 reference, growing N."""
import os

import torch

import fp4attn
from fp4attn.reference.attn_qat import attn_qat_forward


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def cos(a, b):
    return torch.nn.functional.cosine_similarity(a.double().flatten(), b.double().flatten(), dim=0).item()


for (B, H, N, D, causal) in [(1, 4, 1024, 128, False), (1, 4, 2048, 128, False), (1, 4, 4096, 128, False),
                             (1, 2, 8192, 128, False), (1, 4, 4096, 64, False), (1, 4, 4096, 128, True),
                             (1, 2, 8192, 64, True), (2, 4, 512, 128, False)]:
    g = torch.Generator(device="cuda").manual_seed(N + D)
    q, k, v = (torch.randn(B, H, N, D, device="cuda", generator=g).bfloat16() for _ in range(3))
    ro, _, _ = attn_qat_forward(q.double(), k.double(), v.double(), causal=causal)
    row = []
    for em in ("0", "1"):
        os.environ["FP4ATTN_QAT_EXACT_MAX"] = em
        o = fp4attn.attn_qat(q, k, v, causal=causal)
        row.append(f"exact_max={em}: cos {cos(o, ro):.5f} rel {rel(o, ro):.4f}")
    print((B, H, N, D, causal), " | ".join(row), flush=True)
