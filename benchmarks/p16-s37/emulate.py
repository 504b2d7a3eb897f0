"""CPU emulation (before the kernel was written) of rounding P̃ at float16 precision in the reference nvfp4
attention: how far the output moves from the reference (rel. L2) and its error against exact attention over the
reference's. Variants: p16 (P̃ rounded to float16), + l16 (row sums from float16 partial sums of 16), + q16 (the
reciprocal and the quotient in float16: what ``fake_quant_p_f16`` does), all16 (+ the scale's amax/6 in float16).

    PYTHONPATH=src python benchmarks/p16-s37/emulate.py
"""

import importlib
import math

import torch

RA = importlib.import_module("fp4attn.reference.attention")
from fp4attn.formats.core import e2m1_round, e4m3_round  # noqa: E402
from fp4attn.reference import common as C  # noqa: E402

torch.manual_seed(0)
h = torch.float16


def rl2(a, b):
    return ((a - b).norm() / b.norm()).item()


MODE = {}
orig_sm = C.softmax_numerator
orig_qp = C.quantize_p


def sm16(s, sink=None):
    p, m, l = orig_sm(s, sink)
    if MODE.get("p16"):
        p = p.to(h).float()
        if MODE.get("l16"):
            # per 16-key group: fp16 tree sum (8 pairs -> 1), then fp32 accumulation
            g = p.to(h).view(*p.shape[:-1], -1, 16)
            while g.shape[-1] > 1:
                g = (g[..., 0::2] + g[..., 1::2]).to(h)
            l = g.float().sum(-1).sum(-1, keepdim=True)
        else:
            l = p.sum(-1, keepdim=True)
    return p, m, l


def qp16(p, fmt, two_level, tile=64):
    if not MODE.get("q16"):
        return orig_qp(p, fmt, two_level, tile)
    pb = p.view(*p.shape[:-1], -1, 16)
    amax = pb.amax(-1, keepdim=True)
    if MODE.get("s16"):
        s = e4m3_round((amax.to(h) * torch.tensor(1 / 6, dtype=h)).to(h).float()).float()
    else:
        s = e4m3_round(amax * (1.0 / 6.0)).float()
    inv = torch.where(s > 0, (1.0 / s).to(h).float(), torch.zeros_like(s))
    y = (pb.to(h) * inv.to(h)).to(h).float()
    return (e2m1_round(y) * s).view(p.shape)


RA.softmax_numerator = sm16
RA.quantize_p = qp16

for B, H, N, D, causal in [
    (1, 8, 1024, 128, False),
    (1, 8, 2048, 64, False),
    (1, 8, 1024, 128, True),
    (1, 4, 4096, 128, False),
]:
    q, k, v = (torch.randn(B, H, N, D) for _ in range(3))
    exact = (
        torch.softmax(
            (q @ k.transpose(-1, -2)) / math.sqrt(D)
            + (torch.triu(torch.full((N, N), -float("inf")), 1) if causal else 0),
            -1,
        )
        @ v
    )
    MODE.clear()
    ref = RA.attention(q, k, v, causal=causal)
    e_ref = rl2(ref, exact)
    row = [f"{(B, H, N, D, causal)} ref_err={e_ref:.4f}"]
    for name, md in [
        ("p16", dict(p16=1)),
        ("p16+l16", dict(p16=1, l16=1)),
        ("p16+l16+q16", dict(p16=1, l16=1, q16=1)),
        ("all16", dict(p16=1, l16=1, q16=1, s16=1)),
    ]:
        MODE.clear()
        MODE.update(md)
        o = RA.attention(q, k, v, causal=causal)
        row.append(f"{name}: vsref={rl2(o, ref):.2e} err={rl2(o, exact) / e_ref:.4f}x")
    print(" | ".join(row), flush=True)
