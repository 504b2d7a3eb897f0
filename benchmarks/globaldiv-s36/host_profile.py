"""Host time of ``KVCache.from_dense`` at a prompt's size (B=8, Hkv=4, 4096 tokens, D=128 bf16): cProfile of 20
calls (cumulative time per function) and the wall time per call.

    PYTHONPATH=src python benchmarks/globaldiv-s36/host_profile.py
"""
import cProfile
import pstats
import time

import torch

import fp4attn

k = torch.randn(8, 4, 4096, 128, device="cuda", dtype=torch.bfloat16)
for _ in range(3):
    fp4attn.KVCache.from_dense(k, k)
torch.cuda.synchronize()
t = time.perf_counter()
for _ in range(20):
    fp4attn.KVCache.from_dense(k, k)
torch.cuda.synchronize()
print(f"from_dense: {(time.perf_counter() - t) / 20 * 1e3:.3f} ms per call (wall, 20 calls)")
pr = cProfile.Profile()
pr.enable()
for _ in range(20):
    fp4attn.KVCache.from_dense(k, k)
torch.cuda.synchronize()
pr.disable()
pstats.Stats(pr).sort_stats("cumulative").print_stats(35)
