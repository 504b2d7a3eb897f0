"""wg8 (FP8 wgmma decode prototype) against the Gluon mma.sync kernel in one process: outputs against the reference
over the dequantized cache and against exact attention, and CUDA-graph times of decode_fwd with either kernel, cuDNN
SDPA alongside. $OUT/probe_wg8.txt.

    PYTHONPATH=src FP4ATTN_AUTOTUNE=0 python benchmarks/decode-s22/probe_wg8.py
"""
import os
import sys

import torch
import torch.nn.functional as F

import fp4attn
from fp4attn.bench.common import graph_time_ms
from fp4attn.kernels import decode as Dk
from fp4attn.kernels import decode_gluon
from fp4attn.ops.decode import decode_reference

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "decode-s10")]
import wg8  # noqa: E402
from _util import logger  # noqa: E402

P = logger("probe_wg8.txt")
BF = torch.bfloat16
orig = decode_gluon.launch


def rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


def run(q, cache, which, per_sm=None):
    decode_gluon.launch = wg8.launch if which == "wg8" else orig
    try:
        if which == "wg8":
            return Dk.decode_fwd(q, cache, scale=q.shape[-1] ** -0.5, block_n=64, per_sm=per_sm or 4)
        return Dk.decode_fwd(q, cache, scale=q.shape[-1] ** -0.5)
    finally:
        decode_gluon.launch = orig


# correctness: ragged, small, and the bench shapes
for (B, Hq, Hkv, lens, D) in [(3, 8, 2, [300, 1000, 77], 128), (2, 32, 8, [4100, 2000], 128),
                              (2, 16, 4, [700, 1500], 128), (8, 32, 8, [32768] * 8, 128)]:
    torch.manual_seed(0)
    N = max(lens)
    k = torch.randn(B, Hkv, N, D, device="cuda", dtype=BF)
    v = torch.randn_like(k)
    q = torch.randn(B, Hq, 1, D, device="cuda", dtype=BF)
    cache = fp4attn.KVCache.from_dense(k, v, lengths=lens)
    ref, _ = decode_reference(q, cache, scale=D ** -0.5)
    o_gl, l_gl = run(q, cache, "gluon")
    o_wg, l_wg = run(q, cache, "wg8")
    G = Hq // Hkv
    ex = torch.cat([F.scaled_dot_product_attention(q[b:b + 1].float(),
                                                   k[b:b + 1, :, :L].float().repeat_interleave(G, 1),
                                                   v[b:b + 1, :, :L].float().repeat_interleave(G, 1))
                    for b, L in enumerate(lens)])
    P(f"{str((B, Hq, Hkv, lens[:3], D)):48s} vs reference: gluon {rel(o_gl, ref):.4f} wg8 {rel(o_wg, ref):.4f} | "
      f"vs exact: gluon {rel(o_gl, ex):.4f} wg8 {rel(o_wg, ex):.4f} | wg8 vs gluon {rel(o_wg, o_gl):.2e} "
      f"lse diff {(l_wg - l_gl).abs().max().item():.1e} finite {bool(torch.isfinite(o_wg).all())}")
    del k, v, cache

def timing(B, Hq, Hkv, N, D):
    torch.manual_seed(0)
    k = torch.randn(B, Hkv, N, D, device="cuda", dtype=BF)
    v = torch.randn_like(k)
    q = torch.randn(B, Hq, 1, D, device="cuda", dtype=BF)
    cache = fp4attn.KVCache.from_dense(k, v)
    kr, vr = k.repeat_interleave(Hq // Hkv, 1), v.repeat_interleave(Hq // Hkv, 1)
    t = {"cudnn": [], "gluon": [], "wg8 (4/SM)": [], "wg8 (3/SM)": [], "wg8 (5/SM)": []}
    for _ in range(3):
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
            t["cudnn"].append(graph_time_ms(lambda: F.scaled_dot_product_attention(q, kr, vr), 40))
        t["gluon"].append(graph_time_ms(lambda: run(q, cache, "gluon"), 40))
        for ps in (4, 3, 5):
            t[f"wg8 ({ps}/SM)"].append(graph_time_ms(lambda ps=ps: run(q, cache, "wg8", ps), 40))
    c = min(t["cudnn"])
    P(f"{str((B, Hq, Hkv, N, D)):28s} " + "  ".join(f"{n} {min(x):.4f} ms ({c / min(x):.2f}x)" for n, x in t.items()))


for shape in [(8, 32, 8, 32768, 128), (1, 32, 8, 131072, 128)]:
    timing(*shape)
    torch.cuda.empty_cache()
