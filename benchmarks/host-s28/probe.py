"""Host time of an eager decode call (twenty-eighth session): the GPU kept idle-ready with a tiny cache, so the wall
time per call of a long run without syncs is the host's. fp4attn.decode vs decode_fwd (the kernels' entry) vs the
op's argument check alone, and a one-token KVCache.append; then a cProfile of fp4attn.decode.
Run: PYTHONPATH=src python benchmarks/host-s28/probe.py"""
import cProfile
import pstats
import time

import torch

import fp4attn
from fp4attn.kernels.decode import decode_fwd
from fp4attn.ops import decode as opd

torch.manual_seed(0)
B, Hq, Hkv, N, D = 1, 32, 8, 256, 128
k = torch.randn(B, Hkv, N, D, device="cuda", dtype=torch.bfloat16)
cache = fp4attn.KVCache.from_dense(k, torch.randn_like(k))
q = torch.randn(B, Hq, 1, D, device="cuda", dtype=torch.bfloat16)
kn = torch.randn(B, Hkv, 1, D, device="cuda", dtype=torch.bfloat16)


def per_call_us(fn, n=2000):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t) / n * 1e6)
    return best


def _ng():
    with torch.no_grad():
        return decode_fwd(q, cache, scale=D ** -0.5)


def _od():
    with opd.on_device(q):
        return decode_fwd(q, cache, scale=D ** -0.5)


cases = {
    "fp4attn.decode": lambda: fp4attn.decode(q, cache),
    "decode_fwd": lambda: decode_fwd(q, cache, scale=D ** -0.5),
    "op _check only": lambda: opd._check(q, cache, None, "nvfp4", None, "bhsd", False),
    "torch.empty x5 (reference cost)": lambda: [torch.empty(64, 128, device="cuda") for _ in range(5)],
    "opd.decode (no module getattr)": lambda: opd.decode(q, cache),
    "no_grad + decode_fwd": lambda: _ng(),
    "on_device + decode_fwd": lambda: _od(),
    "use_kernels": lambda: opd.use_kernels(q),
    "decode_fwd again": lambda: decode_fwd(q, cache, scale=D ** -0.5),
}
for name, fn in cases.items():
    print(f"{name:34s} {per_call_us(fn):8.1f} us/call")


def append_crop():
    cache.append(kn, kn)
    cache.crop(1)


cache.record_past = True
print(f"{'append + crop(1)':34s} {per_call_us(append_crop, 500):8.1f} us/call")
cache.record_past = False

pr = cProfile.Profile()
pr.enable()
for _ in range(2000):
    fp4attn.decode(q, cache)
torch.cuda.synchronize()
pr.disable()
pstats.Stats(pr).sort_stats("tottime").print_stats(30)
