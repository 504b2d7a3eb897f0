"""Fiftieth session: host time per eager call of the FP4 attention ops on the tree on PYTHONPATH (run it once per
tree, alternating: ``run_ab.sh``), with the GPU kept busy so that the host never waits for it: p10 / p50 of REPS x 40
calls timed one by one (GC off), and the mean of 50 calls as ``order-s49/host_profile.host_us``. The outputs are
saved to ``$OUT/<TAG>_outputs.pt`` so that trees can be compared bit for bit, and with PROFILE=1 a cProfile of the
nvfp4 call is printed (tottime order). ``inputs`` and ``per_call`` also serve ``host_inproc.py``.

    TAG=new PYTHONPATH=src python benchmarks/host-s50/host_ab.py
"""
import gc
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "order-s49"))
from host_profile import host_us, profile_calls  # noqa: E402

import fp4attn  # noqa: E402


def inputs():
    """(q, k, v) bf16 of SHAPE (B, H, N, D; default 1,16,1024,128), seeded."""
    shape = tuple(int(x) for x in os.environ.get("SHAPE", "1,16,1024,128").split(","))
    g = torch.Generator(device="cuda").manual_seed(0)
    return tuple(torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))


def per_call(f, calls=40):
    """Host µs of each of ``calls`` calls while the GPU sleeps (GC off: its pauses land on random calls)."""
    ts = []
    torch.cuda.synchronize()
    torch.cuda._sleep(int(3e8))
    gc.disable()
    for _ in range(calls):
        t0 = time.perf_counter_ns()
        f()
        ts.append((time.perf_counter_ns() - t0) / 1e3)
    gc.enable()
    torch.cuda.synchronize()
    return ts


def main():
    tag = os.environ.get("TAG", "new")
    reps = int(os.environ.get("REPS", "10"))
    q, k, v = inputs()
    ops = {
        "nvfp4": lambda: fp4attn.attention(q, k, v, causal=True),
        "nvfp4-nc": lambda: fp4attn.attention(q, k, v),
        "mxfp4": lambda: fp4attn.attention(q, k, v, causal=True, recipe="mxfp4"),
        "sage3": lambda: fp4attn.attention(q, k, v, causal=True, recipe="sage3"),
        "sage3-lse": lambda: fp4attn.attention(q, k, v, causal=True, recipe="sage3", return_lse=True),
        "thrift5": lambda: fp4attn.thrift_attention(q, k, v, causal=True, budget=0.05),
        "sdpa": lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True),
    }
    outs = {}
    for name, f in ops.items():
        r = f()
        outs[name] = [t.cpu() for t in r] if isinstance(r, tuple) else [r.cpu()]
        f()
        ts = sorted(t for _ in range(reps) for t in per_call(f))
        print(f"{tag:5s} {name:9s} host p10 {ts[len(ts) // 10]:7.1f} p50 {ts[len(ts) // 2]:7.1f} us/call "
              f"({len(ts)} calls; mean of 50 calls {host_us(f, sleep_cycles=int(6e8)):7.1f})", flush=True)
    if os.environ.get("OUT"):
        torch.save(outs, os.path.join(os.environ["OUT"], f"{tag}_outputs.pt"))
    if os.environ.get("PROFILE", "0") == "1":
        profile_calls(ops["nvfp4"], (("tottime", 45),))


if __name__ == "__main__":
    main()
