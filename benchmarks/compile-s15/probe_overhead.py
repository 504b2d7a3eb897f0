"""Host time per eager call of fp4attn.attention / thrift_attention at small shapes (where launches, not
the GPU, pace a call), for the code on PYTHONPATH. Prints one line per case: min and median µs per call
over 10 rounds of 100 calls, each round synchronized once at its end (the host is noisy: compare mins)."""
import statistics
import time

import torch

import fp4attn

torch.manual_seed(0)
cases = [("attention nvfp4", fp4attn.attention, dict(recipe="nvfp4", causal=True)),
         ("attention sage3", fp4attn.attention, dict(recipe="sage3")),
         ("thrift 0.25", fp4attn.thrift_attention, dict(budget=0.25, causal=True))]
q = torch.randn(1, 8, 128, 64, device="cuda", dtype=torch.bfloat16)
k = torch.randn(1, 2, 128, 64, device="cuda", dtype=torch.bfloat16)
v = torch.randn_like(k)
for name, op, kw in cases:
    for _ in range(20):
        op(q, k, v, **kw)
    torch.cuda.synchronize()
    rounds = []
    for _ in range(10):
        t0 = time.perf_counter()
        for _ in range(100):
            op(q, k, v, **kw)
        torch.cuda.synchronize()
        rounds.append((time.perf_counter() - t0) / 100 * 1e6)
    print(f"{name}: min {min(rounds):.1f} median {statistics.median(rounds):.1f} us/call")
