"""Forty-ninth session probe: the host's time per eager call of the public ops, with the GPU kept busy so that the
host never waits for it, and a cProfile of the nvfp4 attention call (where the ~0.8 ms per call goes).

    PYTHONPATH=src python benchmarks/order-s49/host_profile.py
"""
import os
import sys
import time

import torch

import fp4attn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "quartet"))


def host_us(f, n=50, sleep_cycles=int(3e9), warm=True):
    """Host µs per call of ``f`` over ``n`` calls while the GPU sleeps ``sleep_cycles`` (the host never waits for
    it; keep n x launches per call under the launch queue's ~1000 entries); ``warm``: one call first."""
    if warm:
        f()
    torch.cuda.synchronize()
    torch.cuda._sleep(sleep_cycles)
    t0 = time.perf_counter()
    for _ in range(n):
        f()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e6


def main():
    B, H, N, D = 1, 16, 1024, 128
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    ops = {
        "sdpa": lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True),
        "nvfp4": lambda: fp4attn.attention(q, k, v, causal=True),
        "mxfp4": lambda: fp4attn.attention(q, k, v, causal=True, recipe="mxfp4"),
        "sage3": lambda: fp4attn.attention(q, k, v, causal=True, recipe="sage3"),
        "thrift5": lambda: fp4attn.thrift_attention(q, k, v, causal=True, budget=0.05),
        "quantize": lambda: fp4attn.quantize(q),
    }
    for name, f in ops.items():
        print(f"{name:10s} host {host_us(f):7.1f} us/call", flush=True)

    profile_calls(ops["nvfp4"], (("tottime", 30), ("cumulative", 40)))


def profile_calls(f, orders, n=50):
    """Print a cProfile of ``n`` calls of ``f`` made while the GPU sleeps, one profiled run per (sort key, line count)
    of ``orders`` (e.g. (("tottime", 30),)), through ``quartet/probe_util.profile``. (Also used by
    ``host-s50/host_ab.py``.)"""
    from probe_util import profile

    f()
    torch.cuda.synchronize()
    torch.cuda._sleep(int(3e9))
    for key, lines in orders:
        profile(f, n, lines, sort=key)

if __name__ == "__main__":
    main()
