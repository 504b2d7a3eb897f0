"""In-process A/B of the folded launch grid (``kernels._tiles.head_program``): the tree before the change
(a copy importable as ``fp4attn_old`` with its custom ops renamed to ``fp4attn_old::``, on PYTHONPATH) against
this one, alternating rounds, min per variant; outputs compared bit for bit. $OUT/ab.txt.

    OLD_SRC=.ab_old/src PYTHONPATH=src python benchmarks/grid-s19/ab.py   # CASES=decode,thrift ROUNDS=5: a subset
"""
import os
import sys

import torch

import fp4attn
from fp4attn.bench.common import graph_time_ms, time_ms

sys.path.insert(0, os.environ.get("OLD_SRC", ".ab_old/src"))
import fp4attn_old  # noqa: E402

OUT = os.environ.get("OUT", ".")
LOG = open(os.path.join(OUT, "ab.txt"), "a")


def P(*a):
    s = " ".join(str(x) for x in a)
    print(s, flush=True)
    LOG.write(s + "\n")
    LOG.flush()


def same(a, b):
    if isinstance(a, tuple):
        return all(same(x, y) for x, y in zip(a, b))
    return torch.equal(a, b)


ONLY = [c for c in os.environ.get("CASES", "").split(",") if c]  # substrings of case names to run (default all)
ROUNDS = int(os.environ.get("ROUNDS", "3"))


def ab(name, make, rounds=ROUNDS, graph=False):
    """make(pkg) -> fn; fn() run for both packages; times (ms) alternate old/new."""
    if ONLY and not any(c in name for c in ONLY):
        return
    fns = {"old": make(fp4attn_old), "new": make(fp4attn)}
    outs = {k: f() for k, f in fns.items()}
    eq = same(outs["old"], outs["new"])
    t = {k: [] for k in fns}
    for _ in range(rounds):
        for k, f in fns.items():
            t[k].append(graph_time_ms(f, 200.0) if graph else time_ms(f, rep_ms=300.0))
    o, n = min(t["old"]), min(t["new"])
    P(f"{name:55s} old {o:8.4f}  new {n:8.4f}  new/old {n / o:6.3f}  bit-equal {eq}")


BF = torch.bfloat16


def rand(*shape):
    return torch.randn(*shape, device="cuda", dtype=BF)


def attention_cases():
    for (B, H, N, D) in ((16, 16, 4096, 128), (16, 16, 4096, 64)):
        q, k, v = (rand(B, H, N, D) for _ in range(3))
        for recipe, causal in (("nvfp4", False), ("nvfp4", True), ("mxfp4", False), ("sage3", True)):
            ab(f"attention {recipe} causal={causal} {(B, H, N, D)}",
               lambda pkg, r=recipe, c=causal, x=(q, k, v): (lambda: pkg.attention(*x, causal=c, recipe=r)))


def thrift_case(B=4, H=16, N=8192, D=128):
    q, k, v = (rand(B, H, N, D) for _ in range(3))
    ab(f"thrift_attention 5% causal {(B, H, N, D)}",
       lambda pkg: (lambda: pkg.thrift_attention(q, k, v, causal=True, budget=0.05)))


def qat_case(B=16, H=16, N=2048, D=128):
    q, k, v, do = (rand(B, H, N, D) for _ in range(4))

    def make(pkg):
        qq = q.clone().requires_grad_(True)

        def f():
            qq.grad = None
            o = pkg.attn_qat(qq, k, v, causal=True)
            o.backward(do)
            return o.detach(), qq.grad
        return f
    ab(f"attn_qat fwd+bwd causal {(B, H, N, D)}", make)


def decode_cases():
    for (B, Hq, Hkv, ctx, D) in ((8, 32, 8, 32768, 128), (1, 32, 8, 131072, 128)):
        kk, vv, qd = rand(B, Hkv, ctx, D), rand(B, Hkv, ctx, D), rand(B, Hq, 1, D)
        caches = {pkg: pkg.KVCache.from_dense(kk, vv, keep_16bit=True) for pkg in (fp4attn_old, fp4attn)}
        for budget in (None, 0.05):
            ab(f"decode budget={budget} {(B, Hq, Hkv, ctx, D)} (graph)",
               lambda pkg, b=budget, x=qd, cs=caches: (lambda: pkg.decode(x, cs[pkg], thrift_budget=b)),
               graph=True)


torch.manual_seed(0)
P(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}")
attention_cases()
thrift_case()
qat_case()
decode_cases()
