"""Forty-second session: decode's reduce kernel configs (warps, output channels per program, splits per chunk;
probe knobs RED_W / RED_DB / RED_BS that reduce_knobs.patch adds to decode_fwd), CUDA-graph time of the public op,
rounds alternating over the configs, min per config; outputs compared bit for bit with the first.

    OUT=out PYTHONPATH=src python benchmarks/decode-prologue-s42/reduce_cfg.py
"""
# ruff: noqa: B023
import os
import sys

import torch

import fp4attn
from fp4attn.bench.common import graph_time_ms
from fp4attn.bench.decode import decode_inputs

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _log import logger  # noqa: E402

CASES = os.environ.get("CASES", "8,32,8,32768,128;1,32,8,131072,128")
CFGS = os.environ.get("CFGS", "4,32,256;1,32,256;2,32,256;1,16,256;1,32,64;2,64,256;4,64,256;1,128,64;"
                              "4,16,256").split(";")
REP = float(os.environ.get("REP_MS", 60))
ROUNDS = int(os.environ.get("ROUNDS", 3))
P = logger("reduce_cfg.txt")


def setc(c):
    w, db, bs = c.split(",")
    os.environ.update(RED_W=w, RED_DB=db, RED_BS=bs)


P(torch.cuda.get_device_name())
for spec in CASES.split(";"):
    B, Hq, Hkv, N, D = map(int, spec.split(","))
    q, k, v = decode_inputs(B, Hq, Hkv, N, D)
    cache = fp4attn.KVCache.from_dense(k, v)
    ref = None
    for c in CFGS:
        setc(c)
        o = fp4attn.decode(q, cache)
        ref = o if ref is None else ref
        P(f"  {spec} (warps, DB, BLOCK_S cap) = ({c}): equal {torch.equal(o, ref)}")
    res = {c: [] for c in CFGS}
    for _ in range(ROUNDS):
        for c in CFGS:
            setc(c)
            res[c].append(1e3 * graph_time_ms(lambda: fp4attn.decode(q, cache), REP))
    base = min(res[CFGS[0]])
    for c, xs in res.items():
        P(f"  {spec} ({c}) {min(xs):8.2f} us  vs first {base / min(xs):.3f}  rounds {['%.1f' % t for t in xs]}")
