"""(Needs ``v_overlap.patch`` applied: it sets ``attention.V_OVERLAP``.) Where a steady-state nvfp4 op call's time
goes at (16,16,4096,128) causal: 20 back-to-back calls (after ~1 s of
warm-up calls) under torch.profiler; per kernel name the mean duration, and the idle time between consecutive
kernels. Compared with the per-call time of the back-to-back loop (CUDA events) and with one call after a sync.

    PYTHONPATH=src python benchmarks/voverlap-s54/steady.py
"""
import collections
import functools
import subprocess

import torch
from torch.profiler import ProfilerActivity, profile

import fp4attn


def smi():
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,power.draw,temperature.gpu",
                               "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return "?"


def kernels(prof):
    ev = sorted((e for e in prof.events() if e.device_type.name == "CUDA"), key=lambda e: e.time_range.start)
    return [(e.name, e.time_range.start, e.time_range.end) for e in ev]


def one_call(f, warm=3):
    """``kernels`` of one call of ``f`` after ``warm`` calls and a sync."""
    for _ in range(warm):
        f()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        f()
        torch.cuda.synchronize()
    return kernels(prof)


def report(tag, ks, calls):
    dur = collections.defaultdict(list)
    for n, a, b in ks:
        dur[n[:40]].append(b - a)
    gaps = [ks[i + 1][1] - ks[i][2] for i in range(len(ks) - 1)]
    span = ks[-1][2] - ks[0][1]
    print(f"\n{tag}: span {span / calls:.1f} us per call, kernels {sum(b - a for _, a, b in ks) / calls:.1f}, "
          f"idle {sum(max(g, 0) for g in gaps) / calls:.1f}")
    for n, d in dur.items():
        print(f"  {n:40s} {sum(d) / len(d):8.1f} us x {len(d) / calls:.0f}")


def main():
    import time

    from fp4attn.kernels import attention as A
    for mode, causal in (("serial", True), ("high", True), ("serial", False)):
        A.V_OVERLAP = mode
        q, k, v = (torch.randn(16, 16, 4096, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        f = functools.partial(fp4attn.attention, q, k, v, causal=causal)
        print(f"\n=== (16,16,4096,128) causal={causal}, V_OVERLAP={mode}")
        report("one call after a sync", one_call(f, warm=1), 1)
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for _ in range(300):
            f()
        torch.cuda.synchronize()
        h0 = time.perf_counter()
        for _ in range(5):
            f()
        h1 = time.perf_counter()
        torch.cuda.synchronize()
        print(f"host time per call (5 calls, no sync): {(h1 - h0) / 5 * 1e6:.1f} us")
        e0.record()
        for _ in range(20):
            f()
        e1.record()
        torch.cuda.synchronize()
        print(f"\nback-to-back events: {e0.elapsed_time(e1) / 20 * 1000:.1f} us per call; nvidia-smi now: {smi()}")
        for _ in range(300):
            f()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(20):
                f()
            torch.cuda.synchronize()
        report("20 back-to-back calls", kernels(prof), 20)
        print(f"nvidia-smi after: {smi()}")


if __name__ == "__main__":
    main()
