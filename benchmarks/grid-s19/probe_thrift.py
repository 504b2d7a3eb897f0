"""Per-kernel GPU times (torch.profiler), old tree vs new, same process: Thrift decode at 5%, Thrift prefill, D = 64
attention (PROBE=decode,thrift,d64 picks). $OUT/probe_thrift.txt"""
import importlib.util
import os
import sys

import torch

import fp4attn

sys.path.insert(0, os.environ.get("OLD_SRC", ".ab_old/src"))
import fp4attn_old  # noqa: E402

PKGS = [("old", fp4attn_old), ("new", fp4attn)]
if os.environ.get("C_SRC"):  # a third variant (a tree copy importable as fp4attn_c)
    sys.path.insert(0, os.environ["C_SRC"])
    import fp4attn_c
    PKGS.append(("c", fp4attn_c))

_HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location(
    "s6_util", os.path.join(_HERE, "..", "session6-2026-11-22", "probes", "_util.py"))
_util = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_util)
OUT = os.environ.get("OUT", ".")
LOG = open(os.path.join(OUT, "probe_thrift.txt"), "a")


def P(s):
    print(s, flush=True)
    LOG.write(s + "\n")


def kernel_times(fn, n=20):
    """{kernel name: mean device time (us) per call}: the session-6 probes' profiler helper."""
    return _util.kernel_times_us(fn, n)


def report(tag, make, rounds=2):
    for _ in range(rounds):
        for name, pkg in PKGS:
            t = kernel_times(make(pkg))
            tot = sum(t.values())
            P(f"{tag} {name}: total {tot:.1f}us; " + ", ".join(f"{k} {v:.1f}" for k, v in
                                                            sorted(t.items(), key=lambda x: -x[1])))


torch.manual_seed(0)
bf = torch.bfloat16
which = os.environ.get("PROBE", "decode,thrift,d64").split(",")
if "thrift" in which:
    q, k, v = (torch.randn(4, 16, 8192, 128, device="cuda", dtype=bf) for _ in range(3))
    report("thrift_attention 5% (4,16,8192,128) causal",
           lambda pkg: (lambda: pkg.thrift_attention(q, k, v, causal=True, budget=0.05)))
if "d64" in which:
    q, k, v = (torch.randn(16, 16, 4096, 64, device="cuda", dtype=bf) for _ in range(3))
    report("attention nvfp4 (16,16,4096,64) causal",
           lambda pkg: (lambda: pkg.attention(q, k, v, causal=True)))
if "decode" in which:
    B, Hq, Hkv, ctx, D = 8, 32, 8, 32768, 128
    kk = torch.randn(B, Hkv, ctx, D, device="cuda", dtype=bf)
    vv = torch.randn_like(kk)
    qd = torch.randn(B, Hq, 1, D, device="cuda", dtype=bf)
    caches = {pkg: pkg.KVCache.from_dense(kk, vv, keep_16bit=True) for _, pkg in PKGS}
    report("decode thrift 5% (8,32,8,32k,128)", lambda pkg: (lambda: pkg.decode(qd, caches[pkg], thrift_budget=0.05)))
