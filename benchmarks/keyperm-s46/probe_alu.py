"""How much of the Gluon attention pass is the per-block work of ϕ(P̃) and the row sums (forty-sixth session).

Times ``_attn_fwd_kernel_gl`` (torch.profiler, nvfp4 op) with parts of the tile's ALU work removed (outputs wrong;
time only): VARIANT = base | noscale (one constant scale: no block maxima, no E4M3 scale math) | nol (no row sums) |
noscale_nol.

    VARIANT=noscale PYTHONPATH=src:benchmarks/session6-2026-11-22/probes python benchmarks/keyperm-s46/probe_alu.py
"""
import os

import torch
import triton
import triton.language as tl
from _util import kernel_times_us
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

import fp4attn
from fp4attn.formats.triton_helpers import e2m1_round_abs_f16
from fp4attn.kernels import attention_gluon as AG
from fp4attn.kernels._tiles import visible

V = os.environ.get("VARIANT", "base")


@triton.jit
def _fq_const(p, BLOCK: tl.constexpr):
    h = tl.float16
    return e2m1_round_abs_f16(p.to(h) * tl.cast(6.0, h)) * tl.cast(0.125, h)


@gluon.jit
def _p_tile_nol(s, l_i, m_i, tau, start_n, offs_m, keys0, Nk, causal_off, full_end, SR,
                CAUSAL: gl.constexpr, TWO_LEVEL: gl.constexpr, THRIFT: gl.constexpr, BLOCK_N: gl.constexpr):
    if start_n >= full_end:
        s = gl.where(visible(start_n + keys0, offs_m, Nk, causal_off, CAUSAL, 0, False), s, float("-inf"))
    p = gl.exp2(s)
    return p, l_i, m_i, tau, l_i


if "noscale" in V:
    AG.fake_quant_p_f16 = _fq_const
if "nol" in V:
    AG._p_tile = _p_tile_nol

SHAPES = [(16, 16, 4096, 128, False), (16, 16, 4096, 128, True), (16, 16, 4096, 64, False)]
for (B, H, N, D, causal) in SHAPES:
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    per = kernel_times_us(lambda q=q, k=k, v=v, c=causal: fp4attn.attention(q, k, v, causal=c, recipe="nvfp4"), n=20)
    t = {n.split("(")[0].strip(): us for n, us in per.items()}
    print(f"{V:12s} ({B},{H},{N},{D}) causal={int(causal)}: attn pass {t.get('_attn_fwd_kernel_gl', 0) / 1e3:.3f} ms, "
          f"rowmax {t.get('_rowmax_kernel_gl', 0) / 1e3:.3f} ms, sum {sum(per.values()) / 1e3:.3f} ms", flush=True)
