"""Host time vs GPU time of one eager forward+backward step, bf16 F.linear and QuartetLinearCUDA, at the
bench shapes: the host's enqueue time per step (the loop timed without synchronizing, the GPU kept busy
by a queue of earlier steps), the wall time per step over a synchronized loop, and the replay time of
the step captured in a CUDA graph (the GPU's time). A step is host-bound when its enqueue time
exceeds its graph time.

    PYTHONPATH=src FP4ATTN_AUTOTUNE=0 python step_host.py [MxKxN,...]"""
import sys
import time

import torch
import torch.nn.functional as F

from fp4attn.kernels import quartet as kq
from fp4attn.reference.quartet import QuartetRNG

shapes = sys.argv[1] if len(sys.argv) > 1 else "16384x4096x4096,8192x8192x8192"
bf = torch.bfloat16


def measure(step, n=40):
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    walls, hosts = [], []
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(n):
            step()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        hosts.append((t1 - t0) / n * 1e3)
        walls.append((t2 - t0) / n * 1e3)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step()
    for _ in range(5):
        g.replay()
    torch.cuda.synchronize()
    gr = []
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(n):
            g.replay()
        torch.cuda.synchronize()
        gr.append((time.perf_counter() - t0) / n * 1e3)
    return min(hosts), min(walls), min(gr)


for tok in shapes.split(","):
    M, K, N = (int(v) for v in tok.split("x"))
    torch.manual_seed(0)
    x = torch.randn(M, K, device="cuda", dtype=bf, requires_grad=True)
    w = (torch.randn(N, K, device="cuda", dtype=bf) * K ** -0.5).requires_grad_()
    dy = torch.randn(M, N, device="cuda", dtype=bf)
    rng = QuartetRNG(0)
    res = {}
    for name, step in (("bf16", lambda: torch.autograd.grad(F.linear(x, w), (x, w), dy)),
                       ("quartet", lambda: torch.autograd.grad(kq.QuartetLinearCUDA.apply(x, w, None, rng, 32),
                                                               (x, w), dy))):
        res[name] = measure(step)
        h, wl, g = res[name]
        print(f"({M},{K},{N}) {name:8s} host enqueue {h:.3f} ms/step, wall {wl:.3f}, graph {g:.3f}", flush=True)
    print(f"({M},{K},{N}) quartet x bf16: eager {res['bf16'][1] / res['quartet'][1]:.3f}, "
          f"graph {res['bf16'][2] / res['quartet'][2]:.3f}", flush=True)
