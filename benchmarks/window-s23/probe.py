"""Sliding-window attention and decode (twenty-third session; written without a GPU, for the next one).

Times, in one process, CUDA-graph/do_bench medians:
1. prefill: fp4attn.attention(nvfp4, causal, window_size=(w-1, 0)) vs the same without window, vs SDPA flash
   and cuDNN full causal (SDPA has no window argument: full causal is the work a window saves), and vs SDPA
   (efficient backend) with the sliding mask materialized; the windowed op's TF/s counted on the visible
   score entries (the work a windowed FlashAttention does).
2. decode: fp4attn.decode(window_size=(w-1, 0)) vs without window vs cuDNN SDPA over the window's keys only
   (the bytes a bf16 sliding-window cache would hold).
3. correctness at each shape: op vs reference on the first rows (SPEC §6 criteria).
4. the same with attention sinks (gpt-oss) on top of the window.
5. (added in the twenty-fourth session) thrift_attention at 5% with the window vs without.
Usage: OUT=out python benchmarks/window-s23/probe.py
"""
# ruff: noqa: B023, F821 - every lambda is timed at once, inside its loop iteration (the del at its end is after)
import os
import sys

import torch
import triton

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "decode-s10"))
from _util import logger  # noqa: E402

import fp4attn  # noqa: E402
from fp4attn import reference  # noqa: E402
from fp4attn.ops.decode import decode_reference  # noqa: E402

P = logger("window_probe.txt")
P(torch.cuda.get_device_name(), torch.__version__, triton.__version__)


def bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def visible_pairs(nq, nk, w):
    p = torch.arange(nq, dtype=torch.float64) + nk - nq
    return float((torch.clamp(p, max=nk - 1) - torch.clamp(p - (w - 1), min=0) + 1).clamp(min=0).sum())


from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

g = torch.Generator(device="cuda").manual_seed(0)
for (B, H, N, D, w) in [(4, 16, 16384, 128, 4096), (4, 16, 16384, 128, 1024), (16, 16, 4096, 128, 1024),
                        (16, 16, 4096, 64, 512)]:
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    res = {}
    res["fp4 window"] = bench(lambda: fp4attn.attention(q, k, v, causal=True, window_size=(w - 1, 0)))
    res["fp4 causal"] = bench(lambda: fp4attn.attention(q, k, v, causal=True))
    sinks = torch.zeros(H, device="cuda")
    res["fp4 window+sinks"] = bench(lambda: fp4attn.attention(q, k, v, causal=True, window_size=(w - 1, 0),
                                                              sinks=sinks))
    # Thrift (twenty-fourth session): top-5% of the window's key blocks in 16 bits
    res["thrift window"] = bench(lambda: fp4attn.thrift_attention(q, k, v, causal=True, budget=0.05,
                                                                  window_size=(w - 1, 0)))
    res["thrift causal"] = bench(lambda: fp4attn.thrift_attention(q, k, v, causal=True, budget=0.05))
    for name, be in (("flash causal", SDPBackend.FLASH_ATTENTION), ("cudnn causal", SDPBackend.CUDNN_ATTENTION)):
        with sdpa_kernel(be):
            res[name] = bench(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))
    i, j = torch.arange(N, device="cuda")[:, None], torch.arange(N, device="cuda")[None, :]
    mask = (j <= i) & (j > i - w)
    with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
        res["efficient masked"] = bench(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v,
                                                                                               attn_mask=mask))
    del mask
    flops = 4 * B * H * D * visible_pairs(N, N, w)
    line = ", ".join(f"{n} {t:.3f} ms" for n, t in res.items())
    P(f"prefill (B,H,N,D)=({B},{H},{N},{D}) w={w}: {line}; fp4 window {flops / res['fp4 window'] / 1e9:.0f} TF/s "
      f"(visible pairs), x cuDNN causal {res['cudnn causal'] / res['fp4 window']:.2f}, x fp4 causal "
      f"{res['fp4 causal'] / res['fp4 window']:.2f}")
    out = fp4attn.attention(q[:1, :2], k[:1, :2], v[:1, :2], causal=True, window_size=(w - 1, 0)).float()
    rows = slice(N - 256, N)
    ref = reference.attention(q[:1, :2].float(), k[:1, :2].float(), v[:1, :2].float(), causal=True,
                              window_size=(w - 1, 0))[:, :, rows]
    o = out[:, :, rows]
    rel = ((o.double() - ref.double()).norm() / ref.double().norm()).item()
    cos = torch.nn.functional.cosine_similarity(o.double().flatten(), ref.double().flatten(), dim=0).item()
    P(f"  accuracy (last 256 rows, 2 heads): rel L2 {rel:.4f} cos {cos:.5f}")

for (B, Hq, Hkv, N, D, w) in [(8, 32, 8, 32768, 128, 4096), (1, 32, 8, 131072, 128, 4096),
                              (8, 32, 8, 32768, 128, 1024)]:
    kw = dict(device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(B, Hkv, N, D, **kw)
    v = torch.randn(B, Hkv, N, D, **kw)
    q = torch.randn(B, Hq, 1, D, **kw)
    cache = fp4attn.KVCache.from_dense(k, v)
    kw_, vw = k[:, :, N - w:].contiguous(), v[:, :, N - w:].contiguous()
    res = {}
    res["fp4 decode window"] = bench(lambda: fp4attn.decode(q, cache, window_size=(w - 1, 0)))
    res["fp4 decode full"] = bench(lambda: fp4attn.decode(q, cache))
    sinks = torch.zeros(Hq, device="cuda")
    res["fp4 decode window+sinks"] = bench(lambda: fp4attn.decode(q, cache, window_size=(w - 1, 0), sinks=sinks))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        res["cudnn window keys"] = bench(lambda: torch.nn.functional.scaled_dot_product_attention(
            q, kw_, vw, enable_gqa=True))
    line = ", ".join(f"{n} {t:.4f} ms" for n, t in res.items())
    P(f"decode (B,Hq,Hkv,N,D)=({B},{Hq},{Hkv},{N},{D}) w={w}: {line}; x cuDNN(window) "
      f"{res['cudnn window keys'] / res['fp4 decode window']:.2f}")
    out = fp4attn.decode(q, cache, window_size=(w - 1, 0)).float()
    ref, _ = decode_reference(q, cache, scale=D ** -0.5, window=w - 1)
    rel = ((out.double() - ref.double()).norm() / ref.double().norm()).item()
    P(f"  accuracy vs reference: rel L2 {rel:.4f}")
    del cache, k, v
    torch.cuda.empty_cache()
