"""Interleaved A/B of host time in one process: the package before this session's launch-path change
(copied to out/ab/fp4attn_old) against the working tree's, alternating round by round so that both
see the same machine state. Host time = the enqueue time of a few calls started while the GPU is kept
busy (torch.cuda._sleep), so that the host never waits on the GPU; medians over the rounds.

    PYTHONPATH=src:out/ab python ab_host.py"""
import statistics
import time

import fp4attn_old
import torch
import torch.nn.functional as F
from fp4attn_old.kernels import quartet as old_q

import fp4attn
from fp4attn.kernels import quartet as new_q
from fp4attn.reference.quartet import QuartetRNG

bf = torch.bfloat16


def enqueue_us(fn, n):
    torch.cuda._sleep(4_000_000)
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t = (time.perf_counter() - t0) / n * 1e6
    torch.cuda.synchronize()
    return t


def ab(label, fns, n, rounds=15):
    for f in fns.values():
        for _ in range(5):
            f()
    torch.cuda.synchronize()
    res = {k: [] for k in fns}
    for _ in range(rounds):
        for k, f in fns.items():
            res[k].append(enqueue_us(f, n))
    med = {k: statistics.median(v) for k, v in res.items()}
    print(f"{label}: " + ", ".join(f"{k} {v:.1f} us" for k, v in med.items())
          + (f"  (new/old {med['new'] / med['old']:.3f})" if "old" in med else ""), flush=True)


torch.manual_seed(0)
for M, K, N, n in ((256, 256, 256, 20), (16384, 4096, 4096, 2)):
    x = torch.randn(M, K, device="cuda", dtype=bf, requires_grad=True)
    w = (torch.randn(N, K, device="cuda", dtype=bf) * K ** -0.5).requires_grad_()
    dy = torch.randn(M, N, device="cuda", dtype=bf)
    rng_o, rng_n = QuartetRNG(0), QuartetRNG(0)
    fns = {"old": lambda: torch.autograd.grad(old_q.QuartetLinearCUDA.apply(x, w, None, rng_o, 32), (x, w), dy),
           "new": lambda: torch.autograd.grad(new_q.QuartetLinearCUDA.apply(x, w, None, rng_n, 32), (x, w), dy),
           "bf16": lambda: torch.autograd.grad(F.linear(x, w), (x, w), dy)}
    ab(f"({M},{K},{N}) f+b step host", fns, n)
    y_o = old_q.QuartetLinearCUDA.apply(x, w, None, rng_o, 32)
    y_n = new_q.QuartetLinearCUDA.apply(x, w, None, rng_n, 32)
    ab(f"({M},{K},{N}) backward body host", {"old": lambda: old_q.QuartetLinearCUDA.backward(y_o.grad_fn, dy),
                                              "new": lambda: new_q.QuartetLinearCUDA.backward(y_n.grad_fn, dy)}, n)
    with torch.no_grad():
        ab(f"({M},{K},{N}) inference forward host", {"old": lambda: old_q.quartet_linear_cuda(x, w, None, rng_o),
                                                      "new": lambda: new_q.quartet_linear_cuda(x, w, None, rng_n)}, n)
    del x, w, dy, y_o, y_n
    torch.cuda.empty_cache()

k = torch.randn(1, 8, 256, 128, device="cuda", dtype=bf)
q = torch.randn(1, 32, 1, 128, device="cuda", dtype=bf)
c_o = fp4attn_old.KVCache.from_dense(k, torch.randn_like(k))
c_n = fp4attn.KVCache.from_dense(k, torch.randn_like(k))
ab("decode B=1 ctx=256 host", {"old": lambda: fp4attn_old.decode(q, c_o), "new": lambda: fp4attn.decode(q, c_n)}, 20)
kn = torch.randn(1, 8, 1, 128, device="cuda", dtype=bf)
ab("KVCache.append 1 token host", {"old": lambda: c_o.append(kn, kn), "new": lambda: c_n.append(kn, kn)}, 10, rounds=9)
