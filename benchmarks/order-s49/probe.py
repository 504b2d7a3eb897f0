"""Forty-ninth session probe (issue 4): (1) causal programs of the Gluon passes taking their head's query tiles longest
first (``FP4ATTN_CAUSAL_ORDER=heavy``) against the grid order (``light``), interleaved in one process; (2) how much of
the eager op's ``do_bench`` time is not kernel time: eager do_bench, the same call replayed from a CUDA graph, the
host's time per call while the GPU is busy, and the per-kernel sum (torch.profiler).

    PYTHONPATH=src python benchmarks/order-s49/probe.py
"""
import os
import sys

import torch
import triton.testing
from host_profile import host_us  # (this directory: run as a script)

import fp4attn
from fp4attn.bench.common import capture_graph
from fp4attn.metrics import rel_l2

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "session6-2026-11-22", "probes"))
from _util import kernel_times_us  # noqa: E402

SHAPES = [(16, 16, 4096, 128, True), (4, 16, 16384, 128, True), (16, 16, 4096, 64, True), (2, 32, 8192, 128, True),
          (16, 16, 4096, 128, False)]
ROUNDS = int(os.environ.get("ROUNDS", "4"))


def order(o):
    os.environ["FP4ATTN_CAUSAL_ORDER"] = o


def kernel_sum_ms(f, n=5):
    """(sum of the kernels' mean device times per call, {kernel: ms}) of f, through session 6's
    ``probes/_util.kernel_times_us`` (torch.profiler; three warm-up calls, names cut at 70 characters)."""
    tot = {name: us / 1000 for name, us in kernel_times_us(f, n).items()}
    return sum(tot.values()), tot


def run(B, H, N, D, c):
    g = torch.Generator(device="cuda").manual_seed(B * N + D)
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    flops = 4 * B * H * N * N * D / (2 if c else 1)
    tag = f"({B},{H},{N},{D}){' causal' if c else ''}"
    for recipe in ("nvfp4", "sage3"):
        def f(recipe=recipe):
            return fp4attn.attention(q, k, v, causal=c, recipe=recipe)
        outs, best = {}, {}
        for o in ("light", "heavy"):
            order(o)
            outs[o] = f().float()
        for r in range(ROUNDS):
            for o in (("light", "heavy") if r % 2 == 0 else ("heavy", "light")):
                order(o)
                best[o] = min(best.get(o, 1e9), triton.testing.do_bench(f, warmup=10, rep=100))
        eq = torch.equal(outs["light"], outs["heavy"])
        print(f"{recipe:6s} {tag:26s} light {best['light']:.3f} ms heavy {best['heavy']:.3f} ms "
              f"light/heavy {best['light'] / best['heavy']:.4f}  outputs equal: {eq} "
              f"(rel L2 {rel_l2(outs['heavy'], outs['light']):.1e})  heavy {flops / best['heavy'] / 1e9:.0f} TF/s",
              flush=True)
    order("light")

    def f():
        return fp4attn.attention(q, k, v, causal=c, recipe="nvfp4")
    med = triton.testing.do_bench(f, warmup=25, rep=200, return_mode="median")
    gr = capture_graph(f)
    gmed = triton.testing.do_bench(gr.replay, warmup=25, rep=200, return_mode="median")
    ks, parts = kernel_sum_ms(f)
    hus = host_us(f, n=20, sleep_cycles=int(2e9), warm=False)
    print(f"  nvfp4 {tag}: eager do_bench median {med:.3f} ms, graph replay {gmed:.3f} ms, kernel sum {ks:.3f} ms, "
          f"host {hus:.0f} us/call; " + ", ".join(f"{k[:24]} {v:.3f}" for k, v in parts.items()), flush=True)


print(torch.cuda.get_device_name())
for shape in SHAPES:
    run(*shape)
