"""Fiftieth session: the smooth_q correction table kernel (sage3, causal) on the tree on PYTHONPATH: its GPU time
(CUDA events, median of 50 launches) and its table, saved to ``$OUT/<TAG>_table_<shape>.pt`` for a bit-for-bit
comparison between trees (``run_table.sh``). The change masks the prefetch loads of key tiles a causal program
never uses.

    TAG=new PYTHONPATH=src python benchmarks/host-s50/table_ab.py
"""
import os
import statistics

import torch

from fp4attn.kernels import attention as A

TAG = os.environ.get("TAG", "new")
for shape in [(16, 16, 4096, 128), (4, 16, 16384, 128), (16, 16, 4096, 64)]:
    B, H, N, D = shape
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    pk = A.quantize_qkv(q, k, v, fmt="nvfp4", smooth_q=True, smooth_k=True, key_perm=True)
    nqb = pk.qbar.shape[2]
    n = max(1, min(nqb, A.smooth_q_table_max_bytes() // (B * H * pk.ks.shape[2] * 4)))
    out = torch.zeros((B, H, n, pk.ks.shape[2]), device="cuda", dtype=torch.float32)
    A.smooth_q_corr(pk, 0, n, out=out, causal=True)
    ts = []
    for _ in range(50):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        A.smooth_q_corr(pk, 0, n, out=out, causal=True)
        e1.record()
        torch.cuda.synchronize()
        ts.append(e0.elapsed_time(e1) * 1e3)
    print(f"{TAG:5s} table causal {shape} ({n} of {nqb} query blocks): {statistics.median(ts):7.1f} us", flush=True)
    if os.environ.get("OUT"):
        torch.save(out.cpu(), os.path.join(os.environ["OUT"], f"{TAG}_table_{'x'.join(map(str, shape))}.pt"))
