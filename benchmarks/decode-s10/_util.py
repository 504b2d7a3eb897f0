"""Shared by this folder's probes: the output log, one decode benchmark case and the timing table."""
import os

import torch

import fp4attn

SHAPES = [(8, 32, 8, 32768, 128), (1, 32, 8, 131072, 128)]  # (B, Hq, Hkv, context, D) of `bench decode`
# ragged correctness cases (B, Hq, Hkv, lengths, D, new tokens)
RAGGED_CASES = [(3, 8, 2, [300, 1000, 77], 128, 1), (3, 8, 2, [300, 1000, 77], 64, 2), (2, 32, 8, [4100, 2000], 128, 1),
                (2, 16, 4, [700, 1500], 128, 4), (2, 4, 4, [513, 64], 128, 1), (2, 8, 4, [4099, 31], 64, 3),
                (2, 16, 2, [1234, 2222], 128, 2)]


def logger(name):
    """print() that also appends to $OUT/<name>."""
    log = open(os.path.join(os.environ.get("OUT", "/tmp"), name), "w")

    def P(*a):
        s = " ".join(str(x) for x in a)
        print(s, flush=True)
        log.write(s + "\n")
        log.flush()
    return P


def decode_case(B, Hq, Hkv, N, D, keep_16bit=False, generator=None):
    """bf16 K, V (B, Hkv, N, D), one new query token q (B, Hq, 1, D), their FP4 cache and a cuDNN SDPA call."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    kw = dict(device="cuda", dtype=torch.bfloat16, generator=generator)
    k = torch.randn(B, Hkv, N, D, **kw)
    v = torch.randn(B, Hkv, N, D, **kw)
    q = torch.randn(B, Hq, 1, D, **kw)
    cache = fp4attn.KVCache.from_dense(k, v, keep_16bit=keep_16bit)

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    return q, k, v, cache, cudnn


def print_times(P, shape, res, width=18):
    """res: name -> list of ms (one per repetition); the best of each, and its ratio to cuDNN's if timed."""
    cu = min(res["cudnn"]) if "cudnn" in res else None
    P(f"shape {shape}")
    for name, ts in res.items():
        ratio = f"  x cudnn {cu / min(ts):.2f}" if cu else ""
        P(f"  {name:{width}s} {min(ts):.4f} ms{ratio}   ({', '.join(f'{t:.4f}' for t in ts)})")


def ragged_case(B, Hq, Hkv, lens, D, NQ):
    """A ragged FP4 cache (bf16 K with 8 large channels, V) of the given lengths and NQ new query tokens."""
    k = torch.randn(B, Hkv, max(lens), D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(B, Hkv, max(lens), D, device="cuda", dtype=torch.bfloat16)
    k[:, :, :, :8] *= 8
    cache = fp4attn.KVCache.from_dense(k, v, lengths=lens)
    return torch.randn(B, Hq, NQ, D, device="cuda", dtype=torch.bfloat16), cache


def ab_best(fo, fn, rounds: int, warmup: int = 25, rep: int = 100):
    """(old ms, new ms): the min over ``rounds`` interleaved ``do_bench`` rounds of two callables (the in-process A/B
    scripts of markstein-s35 and globaldiv-s36)."""
    from triton.testing import do_bench

    a = b = float("inf")
    for _ in range(rounds):
        a = min(a, do_bench(fo, warmup=warmup, rep=rep))
        b = min(b, do_bench(fn, warmup=warmup, rep=rep))
    return a, b
