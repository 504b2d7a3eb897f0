"""Forty-ninth session: what the eager host time costs at small shapes, and what a CUDA graph gives back.
Per shape (causal, bf16) and op: the wall time of 200 eager calls back to back (one synchronize at the end; min of
3 runs), the time of one call replayed from a CUDA graph (``bench.common.capture_graph``, do_bench median), and for
the first two shapes the wall time of ``torch.compile(mode="reduce-overhead")`` calls (Inductor's CUDA graphs).

    PYTHONPATH=src python benchmarks/order-s49/small_graphs.py
"""
import torch
import triton.testing
from small_shapes import wall_us  # (this directory: run as a script)

import fp4attn
from fp4attn.bench.common import capture_graph

SHAPES = [(1, 32, 1024, 128), (1, 32, 2048, 128), (1, 16, 512, 128), (4, 32, 1024, 128), (1, 32, 4096, 128),
          (1, 32, 8192, 128)]


def sdpa(q, k, v):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)


def nvfp4(q, k, v):
    return fp4attn.attention(q, k, v, causal=True)


def sage3(q, k, v):
    return fp4attn.attention(q, k, v, causal=True, recipe="sage3")


print(torch.cuda.get_device_name())
print("| shape (causal) | op | eager wall µs per call | CUDA graph µs per call | compile reduce-overhead µs |")
print("|---|---|---:|---:|---:|")
for i, (B, H, N, D) in enumerate(SHAPES):
    g = torch.Generator(device="cuda").manual_seed(N)
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    for op in (sdpa, nvfp4, sage3):
        def f(op=op, q=q, k=k, v=v):
            return op(q, k, v)
        w = wall_us(f)
        gr = capture_graph(f)
        gt = triton.testing.do_bench(gr.replay, warmup=10, rep=50, return_mode="median") * 1e3
        ct = ""
        if i < 2:
            cf = torch.compile(op, mode="reduce-overhead", fullgraph=True, dynamic=False)
            want = f()
            for _ in range(3):
                got = cf(q, k, v)
            ok = torch.equal(got, want)
            ct = f"{wall_us(lambda cf=cf, q=q, k=k, v=v: cf(q, k, v)):.1f}{'' if ok else ' (outputs differ!)'}"
        print(f"| ({B},{H},{N},{D}) | {op.__name__} | {w:.1f} | {gt:.1f} | {ct} |", flush=True)
