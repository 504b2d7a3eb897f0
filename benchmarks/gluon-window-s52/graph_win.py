"""Fifty-second session probe: eager wall time against CUDA-graph replay of the windowed FP4 attention op (does the
host pace a short-window call?), Gluon passes, and the call's kernel times (torch.profiler). gpt-oss-like (GQA 64/8,
D = 64, 128-key window, sinks) and Mistral-like (GQA 32/8, D = 128, 4096-key window) shapes.

    PYTHONPATH=src python benchmarks/gluon-window-s52/graph_win.py
"""
import os
import sys

import torch
import triton.testing

import fp4attn
from fp4attn.bench.common import capture_graph, device_name

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "session6-2026-11-22", "probes"))
from _util import kernel_times_us  # noqa: E402

SHAPES = [(1, 64, 8, 16384, 64, 127, True), (1, 64, 8, 4096, 64, 127, True), (1, 32, 8, 16384, 128, 4095, False)]


def main():
    print(f"device: {device_name()}, torch {torch.__version__}")
    for B, Hq, Hkv, N, D, wl, with_sinks in SHAPES:
        g = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn(B, Hq, N, D, device="cuda", dtype=torch.bfloat16, generator=g)
        k = torch.randn(B, Hkv, N, D, device="cuda", dtype=torch.bfloat16, generator=g)
        v = torch.randn(B, Hkv, N, D, device="cuda", dtype=torch.bfloat16, generator=g)
        sinks = torch.randn(Hq, device="cuda", generator=g) if with_sinks else None

        def f(q=q, k=k, v=v, sinks=sinks, wl=wl):
            return fp4attn.attention(q, k, v, causal=True, window_size=(wl, 0), sinks=sinks)

        eager = triton.testing.do_bench(f, warmup=25, rep=200)
        graph = capture_graph(f)
        replay = triton.testing.do_bench(graph.replay, warmup=25, rep=200)
        tag = " + sinks" if with_sinks else ""
        print(f"({B},{Hq},{Hkv},{N},{D}) window {wl + 1}{tag}: eager {eager * 1e3:7.1f} us, "
              f"graph replay {replay * 1e3:7.1f} us", flush=True)
        for name, us in kernel_times_us(f).items():
            print(f"    kernel {us:7.1f} us  {name}")


if __name__ == "__main__":
    main()
