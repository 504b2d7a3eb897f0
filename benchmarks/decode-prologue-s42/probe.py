"""Forty-second session: the Gluon decode kernel's setup before its first tile. Variants (probe switches of the
kernel, environment variables read at launch): PROBE_PRE_L2 = n, the split's first n tiles bulk-prefetched into L2
as soon as its page-table entries arrive, before q is loaded and quantized; PROBE_QR = 1, q quantized on its G·n_q
distinct rows, then copied into the FOLD columns of each (the kernel quantized every column, i.e. each row FOLD
times). CUDA-graph replays of the public op, rounds alternating over the variants, min per variant; outputs compared
bit for bit against the first variant. The switches: probe_switches.patch (on a869b81).

    OUT=out PYTHONPATH=src python benchmarks/decode-prologue-s42/probe.py
"""
# ruff: noqa: B023
import os
import sys

import torch

import fp4attn
from fp4attn.bench.common import graph_time_ms
from fp4attn.bench.decode import decode_inputs, sdpa_fn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _log import logger  # noqa: E402

CASES = os.environ.get("CASES", "8,32,8,32768,128,1;1,32,8,131072,128,1;8,32,8,32768,64,1;8,32,8,32768,128,2;"
                                "8,32,8,1024,128,1")
VARIANTS = os.environ.get("VARIANTS", "0,0;1,0;2,0;0,1;1,1;2,1").split(";")
REP = float(os.environ.get("REP_MS", 60))
ROUNDS = int(os.environ.get("ROUNDS", 3))
P = logger("probe.txt")


def setv(v):
    pre, qr = v.split(",")
    os.environ["PROBE_PRE_L2"] = pre
    os.environ["PROBE_QR"] = qr


P(torch.cuda.get_device_name(), torch.__version__)
for spec in CASES.split(";"):
    B, Hq, Hkv, N, D, nq = map(int, spec.split(","))
    q, k, v = decode_inputs(B, Hq, Hkv, N, D)
    if nq > 1:
        q = torch.randn(B, Hq, nq, D, device="cuda", dtype=q.dtype)
    cache = fp4attn.KVCache.from_dense(k, v)
    c16 = fp4attn.KVCache.from_dense(k, v, keep_16bit=True)
    cu = 1e3 * graph_time_ms(sdpa_fn(torch.nn.attention.SDPBackend.CUDNN_ATTENTION, q, k, v), REP)
    ref = {}
    for vv in VARIANTS:
        setv(vv)
        o = fp4attn.decode(q, cache)
        ot = fp4attn.decode(q, c16, thrift_budget=0.05)
        if not ref:
            ref = {"o": o, "t": ot}
        P(f"  {spec} variant {vv}: nvfp4 equal {torch.equal(o, ref['o'])}, thrift equal {torch.equal(ot, ref['t'])}")
    fns = {}
    for vv in VARIANTS:
        fns[f"nvfp4 {vv}"] = (vv, lambda: fp4attn.decode(q, cache))
    for vv in VARIANTS[:2]:
        fns[f"thrift {vv}"] = (vv, lambda: fp4attn.decode(q, c16, thrift_budget=0.05))
    res = {n: [] for n in fns}
    for _ in range(ROUNDS):
        for n, (vv, f) in fns.items():
            setv(vv)
            res[n].append(1e3 * graph_time_ms(f, REP))
    P(f"\n({spec}) cuDNN {cu:.1f} us")
    base = min(res[f"nvfp4 {VARIANTS[0]}"])
    for n, xs in res.items():
        P(f"  {n:14s} {min(xs):8.2f} us  x cuDNN {cu / min(xs):5.3f}  vs first {base / min(xs):5.3f}  "
          f"rounds {['%.1f' % x for x in xs]}")
    cache = c16 = None
    torch.cuda.empty_cache()
