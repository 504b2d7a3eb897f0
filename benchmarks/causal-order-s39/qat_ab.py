"""Attn-QAT forward + backward and Thrift prefill, causal, old tree against this one in one process (thirty-ninth
session: causal query tiles longest first). Min of ROUNDS interleaved rounds (``bench.common.interleaved_min_ms``);
outputs and gradients compared bit for bit.

    OLD_SRC=.ab_old/src PYTHONPATH=src python benchmarks/causal-order-s39/qat_ab.py
"""
import os
import sys

import torch

import fp4attn
from fp4attn.bench.common import interleaved_min_ms

sys.path.insert(0, os.environ.get("OLD_SRC", ".ab_old/src"))
import fp4attn_old  # noqa: E402

SHAPES = [tuple(int(x) for x in s.split(",")) for s in os.environ.get(
    "SHAPES", "16,16,4096,128;4,16,16384,128;16,16,4096,64").split(";")]
ROUNDS = int(os.environ.get("ROUNDS", "3"))


def same(a, b):
    return torch.equal(a.view(torch.int16), b.view(torch.int16)) if a.dtype == torch.bfloat16 else torch.equal(a, b)


for (B, H, N, D) in SHAPES:
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    do = torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16)
    fl = 4 * B * H * N * N * D / 2

    def qat(mod):
        def f():
            q.grad = k.grad = v.grad = None
            o = mod.attn_qat(q, k, v, causal=True)
            o.backward(do)
            return o, q.grad, k.grad, v.grad
        return f

    def thrift(mod):
        return lambda: mod.thrift_attention(q.detach(), k.detach(), v.detach(), causal=True, budget=0.05)

    fns = {"old qat": qat(fp4attn_old), "new qat": qat(fp4attn),
           "old thrift": thrift(fp4attn_old), "new thrift": thrift(fp4attn)}
    outs = {name: fn() for name, fn in fns.items()}
    eq_qat = all(same(a, b) for a, b in zip(outs["old qat"], outs["new qat"]))
    eq_thr = same(outs["old thrift"], outs["new thrift"])
    ms = interleaved_min_ms(fns, ROUNDS)
    print(f"({B},{H},{N},{D}) causal: qat fwd+bwd old {ms['old qat']:.3f} new {ms['new qat']:.3f} ms "
          f"(old/new {ms['old qat'] / ms['new qat']:.3f}, {3.5 * fl / ms['new qat'] / 1e9:.0f} TF/s, bits equal "
          f"{eq_qat}); thrift 5% old {ms['old thrift']:.3f} new {ms['new thrift']:.3f} ms "
          f"(old/new {ms['old thrift'] / ms['new thrift']:.3f}, bits equal {eq_thr})", flush=True)
