"""In-process A/B of the host time per eager call (the host is shared and noisy between processes): the
tree at the commit before (a copy importable as ``fp4attn_old``, on PYTHONPATH) against this one, in
alternating rounds; medians and minima per variant. $OUT/ab_inproc.txt."""
import os
import statistics
import sys

import torch

import fp4attn

sys.path.insert(0, os.environ.get("OLD_SRC", ".ab_old/src"))
import fp4attn_old  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _util import host_us as _host_us  # noqa: E402
from _util import logger  # noqa: E402

P = logger("ab_inproc.txt")


def host_us(fn, n=200):
    return _host_us(fn, n, 0)


def case(B, Hq, Hkv, ctx, D, rounds=12):
    torch.manual_seed(0)
    k = torch.randn(B, Hkv, ctx, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    q = torch.randn(B, Hq, 1, D, device="cuda", dtype=torch.bfloat16)
    kn = torch.randn(B, Hkv, 1, D, device="cuda", dtype=torch.bfloat16)
    res = {}
    fns = {}
    for name, pkg in (("old", fp4attn_old), ("new", fp4attn)):
        c = pkg.KVCache.from_dense(k, v)
        c2 = pkg.KVCache.from_dense(k, v)
        fns[f"decode {name}"] = lambda pkg=pkg, c=c: pkg.decode(q, c)
        fns[f"append {name}"] = lambda c2=c2: c2.append(kn, kn)
        o_ref = pkg.decode(q, c)
        res.setdefault("out", []).append(o_ref)
    assert torch.equal(res["out"][0], res["out"][1]), "old and new decode differ"
    for f in fns.values():
        for _ in range(20):
            f()
    times = {n: [] for n in fns}
    for _ in range(rounds):
        for n, f in fns.items():
            times[n].append(host_us(f, 100 if n.startswith("append") else 200))
    sdpa = host_us(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True))
    P(f"({B},{Hq},{Hkv},{ctx},{D}), us per call over {rounds} alternating rounds (median / min); SDPA {sdpa:.1f}")
    for n, ts in times.items():
        P(f"  {n:12s} {statistics.median(ts):7.1f} / {min(ts):7.1f}")


case(1, 32, 8, 256, 128)
case(4, 32, 8, 8192, 64)
