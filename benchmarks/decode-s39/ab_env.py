"""CUDA-graph time of ``fp4attn.decode`` (nvfp4, one new token) under environment variants, interleaved rounds, min
per variant, outputs compared bit for bit with the first variant (thirty-ninth session). VARIANTS: ";"-separated
``name:VAR=value,...`` (read by the kernels' launchers when a graph is captured).

    VARIANTS="base:;l1:FP4ATTN_DECODE_L1_PREFETCH=1" PYTHONPATH=src python benchmarks/decode-s39/ab_env.py
"""
import os

import torch
from torch.nn.attention import SDPBackend

import fp4attn
from fp4attn.bench.common import graph_time_ms
from fp4attn.bench.decode import decode_inputs, sdpa_fn

SHAPES = [tuple(int(x) for x in s.split(",")) for s in os.environ.get(
    "SHAPES", "8,32,8,32768,128;1,32,8,131072,128").split(";")]
VARIANTS = [(v.split(":")[0], dict(kv.split("=") for kv in v.split(":")[1].split(",") if kv))
            for v in os.environ.get("VARIANTS", "base:;l1:FP4ATTN_DECODE_L1_PREFETCH=1").split(";")]
ROUNDS = int(os.environ.get("ROUNDS", "3"))
REP = float(os.environ.get("REP_MS", "40"))

for (B, Hq, Hkv, C, D) in SHAPES:
    q, k, v = decode_inputs(B, Hq, Hkv, C, D)
    cache = fp4attn.KVCache.from_dense(k, v)
    cu = graph_time_ms(sdpa_fn(SDPBackend.CUDNN_ATTENTION, q, k, v), REP) * 1e3
    del k, v
    best = {name: float("inf") for name, _ in VARIANTS}
    outs = {}
    for _ in range(ROUNDS):
        for name, env in VARIANTS:
            saved = {x: os.environ.get(x) for x in env}
            os.environ.update(env)
            outs[name] = fp4attn.decode(q, cache)
            best[name] = min(best[name], graph_time_ms(lambda: fp4attn.decode(q, cache), REP) * 1e3)
            for x, val in saved.items():
                if val is None:
                    del os.environ[x]
                else:
                    os.environ[x] = val
    first = VARIANTS[0][0]
    print(f"({B},{Hq},{Hkv},{C},{D}): cuDNN {cu:.1f} us; " + "; ".join(
        f"{n} {t:.1f} us ({cu / t:.2f}x cuDNN, {best[first] / t:.3f}x {first}, bits equal "
        f"{torch.equal(outs[n], outs[first])})" for n, t in best.items()), flush=True)
