"""The smooth_q correction table kernel (``attention.smooth_q_corr``) alone, over tile configs
(``attention._CORR_CFG`` overrides in VARIANTS, a ';'-separated list of 'k=v,k=v'; '' is the tree's default), next
to a plain fill of the same bytes; DTYPE=fp16: fp16 inputs (default bf16). With CHECK=1, the first variant's table
against float64: the largest error over |q̄|·(|k| + |k̄|), the magnitude the 16-bit paths' error is relative to.
Forty-eighth session.

    PYTHONPATH=src python benchmarks/corr-s48/bench_table.py             # this tree
    PYTHONPATH=out/base_src/src VARIANTS= python benchmarks/corr-s48/bench_table.py   # the old tree's default
"""
import os

import torch
import triton.testing

from fp4attn.kernels import attention as A
from fp4attn.kernels._tiles import key_positions

SHAPES = [tuple(int(x) for x in s.split(",")) for s in os.environ.get(
    "SHAPES", "16,16,4096,128,0;16,16,4096,128,1;4,16,16384,128,0;16,16,4096,64,0;2,32,8192,128,1").split(";")]
VARIANTS = [dict((kv.split("=")[0], int(kv.split("=")[1])) for kv in v.split(",") if kv)
            for v in os.environ.get("VARIANTS", ";tiles_per_prog=2;tiles_per_prog=4;tiles_per_prog=8").split(";")]
CHECK = os.environ.get("CHECK", "1") == "1"
DTYPE = {"bf16": torch.bfloat16, "fp16": torch.float16}[os.environ.get("DTYPE", "bf16")]  # the inputs


def shape(B, H, N, D, c):
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=DTYPE, generator=g) for _ in range(3))
    k = k + 0.5  # a mean for smooth_k to remove
    pk = A.quantize_qkv(q, k, v, fmt="nvfp4", staged=True, smooth_q=True, smooth_k=True, key_perm=True)
    nqb = pk.qbar.shape[2]
    out = A.smooth_q_corr(pk, 0, nqb)
    fill = triton.testing.do_bench(lambda: out.fill_(1.0), warmup=10, rep=100)
    mb = out.numel() * 4 / 1e6
    print(f"\n## ({B},{H},{N},{D}){' causal' if c else ''}: table {mb:.0f} MB, fill {fill * 1e3:.0f} us "
          f"({mb / fill / 1e3:.2f} TB/s)", flush=True)
    base = dict(A._CORR_CFG)
    for i, var in enumerate(VARIANTS):
        A._CORR_CFG.clear()
        A._CORR_CFG.update(base, **var)
        o = A.smooth_q_corr(pk, 0, nqb, causal=bool(c))
        msg = ""
        if CHECK and i == 0 and not c and B * H * N <= 16 * 16 * 4096:
            qb = pk.qbar[..., :D].double()
            kb = pk.kbar.double()[:, :, None, :]
            want = qb @ (k.double() - kb).transpose(-1, -2)
            mag = qb.abs() @ (k.double().abs() + kb.abs()).transpose(-1, -2)
            got = o[..., key_positions(o.shape[-1], device=o.device)][..., :N].double()
            msg = f"  max err / magnitude {((got - want).abs() / mag).max().item():.3g}"
        t = triton.testing.do_bench(lambda: A.smooth_q_corr(pk, 0, nqb, out=out, causal=bool(c)),  # noqa: B023
                                    warmup=10, rep=200)
        print(f"{var or 'default'}: {t * 1e3:6.1f} us{msg}", flush=True)
    A._CORR_CFG.clear()
    A._CORR_CFG.update(base)


for s in SHAPES:
    shape(*s)
