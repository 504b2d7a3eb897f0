"""Forty-ninth session: eager calls at small shapes, where the host's time per call paces the op. Per shape and op,
the wall time of 200 calls back to back (synchronized once at the end; min of 3 runs) and ``do_bench``'s GPU time
of one call; SDPA (cuDNN / flash, its default choice) in the same process. The tree under test is PYTHONPATH's.

    PYTHONPATH=src python benchmarks/order-s49/small_shapes.py
"""
import time

import torch
import triton.testing

import fp4attn

SHAPES = [(1, 16, 512, 128), (1, 16, 1024, 128), (1, 32, 2048, 128), (4, 32, 1024, 128), (1, 32, 4096, 128),
          (2, 16, 1024, 64)]


def wall_us(f, n=200):
    best = 1e9
    for _ in range(3):
        f()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            f()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
    return best


def main():
    print(torch.cuda.get_device_name())
    print("| shape (causal) | op | wall µs per call | GPU µs (do_bench) |")
    print("|---|---|---:|---:|")
    for (B, H, N, D) in SHAPES:
        g = torch.Generator(device="cuda").manual_seed(N)
        q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
        ops = {"sdpa": lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True),  # noqa: B023
               "nvfp4": lambda: fp4attn.attention(q, k, v, causal=True),  # noqa: B023
               "sage3": lambda: fp4attn.attention(q, k, v, causal=True, recipe="sage3")}  # noqa: B023
        for name, f in ops.items():
            w = wall_us(f)
            gt = triton.testing.do_bench(f, warmup=10, rep=50) * 1e3
            print(f"| ({B},{H},{N},{D}) | {name} | {w:.1f} | {gt:.1f} |", flush=True)


if __name__ == "__main__":
    main()
